"""The executor of the reference engine: a roofline that turns one scheduled step into seconds.

Per step, on one GPU of a tensor-parallel group of ``tp``::

    bytes  = W_read / tp                        weights, read once per step
           + kv_bytes_per_token * num_kv_tokens  each scheduled request's KV (context + new)
    flops  = 2 * P_linear / tp * num_tokens      projections of every token in the step
           + 2 * P_lm_head / tp * num_seqs       logits: one position per scheduled request
           + 4 * L * H/tp * d * num_pairs        QK^T and PV over (query, key) pairs, causal

    memory_s  = bytes / (hbm_bandwidth * memory_efficiency)
    compute_s = flops_linear / (peak(weights dtype) * compute_efficiency)
              + flops_attention / (peak(bf16) * compute_efficiency)
    step_s    = max(memory_s, compute_s)
              + step_overhead_s + per_seq_overhead_s * num_seqs + per_token_overhead_s * num_tokens
              + (per_kv_token_overhead_s + per_fp8_kv_token_overhead_s if the KV cache is
                 FP8) * num_kv_tokens
              + per_attention_pair_overhead_s * num_attention_pairs
              + all-reduce (tp > 1) + swap (blocks moved over PCIe this step)

Every constant is in ``CostModelParams``, with its justification in docs/cost-model.md; a
calibration profile (JSON, the same field names) overrides any of them.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from adapters.reference.hardware import (
    GPUS,
    GpuSpec,
    UnknownHardwareError,
    gpu_hint,
    known_gpus,
)
from adapters.reference.models import ModelSpec

GIB = 2**30
DTYPE_BYTES = {"bf16": 2.0, "fp8": 1.0}


class ProfileError(ValueError):
    """A calibration profile file is unreadable or has a bad field (the message names both)."""


@dataclass(frozen=True, slots=True)
class CostModelParams:
    """The cost model's coefficients. Defaults are documented guesses; a profile fits them.

    The hardware fields (``None`` = take the catalog figure for the GPU) let a profile correct
    a datasheet figure by a measured one, or describe a device the catalog does not list
    (``device`` = its name; then memory, bandwidth and BF16 peak are required).
    """

    # Fraction of peak HBM bandwidth a decode step reaches (STREAM-like kernels reach ~80-90%).
    memory_efficiency: float = 0.8
    # Fraction of the dense tensor-core peak large GEMMs and attention reach in serving (~50-70%).
    compute_efficiency: float = 0.6
    # Per-step work that does not scale with the batch: scheduling, input preparation, launch.
    step_overhead_s: float = 0.8e-3
    # Per scheduled request: sampling, detokenisation, output processing.
    per_seq_overhead_s: float = 5e-6
    # Per scheduled token (0 on GPUs; a CPU fit may need it).
    per_token_overhead_s: float = 0.0
    # Per KV token a step reads, beyond the memory term: attention kernels that run far below
    # the bandwidth roofline (a CPU's paged attention). 0 on GPUs; set by calibration.
    per_kv_token_overhead_s: float = 0.0
    # Per causal (query, key) pair, beyond the attention FLOPs in the compute term: attention
    # kernels far below the matmul rate (a CPU's prefill attention). 0 on GPUs; calibration.
    per_attention_pair_overhead_s: float = 0.0
    # Per KV token a step reads from an FP8 KV cache, beyond its bytes: dequantisation in the
    # attention kernel keeps FP8 attention from running twice as fast as BF16 (fitted on
    # published FP8-KV runs, docs/published.md). 0: FP8 KV costs only its bytes.
    per_fp8_kv_token_overhead_s: float = 0.0
    # A request's trip through the server's front end (HTTP, tokenisation, hand-off to the
    # engine loop, streaming back) that no step contains: simulated requests reach the
    # scheduler this long after they arrive. 0: none; calibration measures it.
    frontend_latency_s: float = 0.0
    # Latency of one tensor-parallel all-reduce (two per layer) of a small message over NVLink.
    allreduce_latency_s: float = 5e-6
    # Fraction of the PCIe bandwidth a KV swap reaches: one small copy per block and layer.
    swap_efficiency: float = 0.4
    # Memory kept out of the KV cache besides weights and per-token activations: CUDA context,
    # cuBLAS workspace, CUDA graphs, NCCL buffers.
    activation_fixed_bytes: float = 1.5 * GIB

    # Hardware overrides (None: the catalog's figure).
    device: str | None = None
    memory_bytes: float | None = None
    hbm_bandwidth_bytes_per_s: float | None = None
    peak_bf16_flops: float | None = None
    peak_fp8_flops: float | None = None
    pcie_bandwidth_bytes_per_s: float | None = None
    interconnect_bandwidth_bytes_per_s: float | None = None
    # Storage overrides (None: from --weights-dtype / --kv-cache-dtype), e.g. 4.0 for fp32 on CPU.
    weight_bytes_per_param: float | None = None
    kv_bytes_per_element: float | None = None

    source: str = "built-in defaults (docs/cost-model.md)"

    def digest(self) -> str:
        """16 hex digits of every coefficient (not ``source``, which names where they were
        read from): two runs predicted with other coefficients differ here, whatever their
        profiles' names or paths (``batchlab compare`` warns)."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "source"}
        text = json.dumps(values, sort_keys=True, allow_nan=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def validate(self, where: str = "cost model") -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("device", "source"):
                if value is not None and not isinstance(value, str):
                    raise ProfileError(f"{where}: {f.name} must be a string, got {value!r}")
                continue
            if value is None:
                if f.default is not None:
                    raise ProfileError(f"{where}: {f.name} must be a number, got null")
                continue
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or not math.isfinite(value)):
                raise ProfileError(f"{where}: {f.name} must be a number, got {value!r}")
            if value < 0:
                raise ProfileError(f"{where}: {f.name} must be >= 0, got {value!r}")
        for name in ("memory_efficiency", "compute_efficiency", "swap_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise ProfileError(
                    f"{where}: {name} must be in (0, 1], got {getattr(self, name)!r}")


# Engine profiles shipped as data: ``<engine>-<gpu>.json`` (docs/published.md says how each
# was fitted). ``load_profile("vllm-h100-sxm")`` reads ``PROFILES_DIR / "vllm-h100-sxm.json"``.
PROFILES_DIR = Path(__file__).parent / "profiles"


def shipped_profiles() -> list[str]:
    """Names of the profiles shipped in ``PROFILES_DIR``, sorted."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))


def resolve_profile(name_or_path: str | Path) -> Path:
    """The file a ``--profile`` value means: an existing path, else a shipped profile's name."""
    path = Path(name_or_path)
    if path.exists() or path.suffix == ".json" or len(path.parts) > 1:
        return path
    shipped = PROFILES_DIR / f"{name_or_path}.json"
    if shipped.exists():
        return shipped
    raise ProfileError(
        f"{name_or_path}: no such profile file, and not a shipped profile name; shipped "
        f"profiles: {', '.join(shipped_profiles()) or 'none'}"
    )


def load_profile(path: str | Path) -> CostModelParams:
    """Read a calibration profile: a JSON object whose keys are ``CostModelParams`` fields.

    ``path`` is a file, or the name of a shipped profile (``vllm-h100-sxm``: see
    ``shipped_profiles``). Keys starting with ``_`` and a ``metadata`` object are kept out of
    the model (for notes, scheduling defaults and fit statistics). Errors name the file and
    the key.
    """
    path, raw = _read_profile(path)
    _checked_metadata(path, raw)
    known = {f.name for f in fields(CostModelParams)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key.startswith("_") or key == "metadata":
            continue
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ProfileError(f"{path}: unknown profile key {key!r}{hint}; known keys: "
                               f"{', '.join(sorted(known))}")
        values[key] = value
    values.setdefault("source", str(path))
    params = CostModelParams(**values)
    params.validate(where=str(path))
    return params


def _read_profile(name_or_path: str | Path) -> tuple[Path, dict[str, Any]]:
    """The file a profile name or path means, and its JSON object; errors name the file."""
    path = resolve_profile(name_or_path)
    try:
        raw = json.loads(path.read_text(), object_pairs_hook=_RepeatsNoted.of)
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read profile: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}: line {exc.lineno}: not valid JSON: {exc.msg}") from None
    _refuse_repeated_keys(path, raw)
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: a profile is a JSON object of cost-model fields")
    return path, raw


class _RepeatsNoted(dict[str, Any]):
    """A JSON object one of whose keys was written more than once: ``repeated`` is that key
    and its values in file order. json alone keeps the last value silently, so an edited
    copy with ``"memory_efficiency"`` twice would run with whichever came last; the walk in
    ``_refuse_repeated_keys`` refuses it with the key's path (the hook itself cannot know it).
    """

    repeated: tuple[str, list[Any]]

    @classmethod
    def of(cls, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        """``object_pairs_hook``: a plain dict, unless a key repeats."""
        obj = dict(pairs)
        if len(obj) == len(pairs):
            return obj
        counts = Counter(k for k, _ in pairs)
        key = next(k for k, _ in pairs if counts[k] > 1)
        noted = cls(obj)
        noted.repeated = (key, [v for k, v in pairs if k == key])
        return noted


def _refuse_repeated_keys(path: Path, value: object, where: str = "") -> None:
    """ProfileError at the first object (in file order) that repeats a key, naming its path."""
    if isinstance(value, _RepeatsNoted):
        key, values = value.repeated
        shown = ", ".join(json.dumps(v)[:40] for v in values[:3])
        raise ProfileError(
            f"{path}: {_join(where, key)}: appears {len(values)} times in one JSON object "
            f"(values {shown}{', ...' if len(values) > 3 else ''}): remove all but one")
    if isinstance(value, dict):
        for key, item in value.items():
            _refuse_repeated_keys(path, item, _join(where, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _refuse_repeated_keys(path, item, f"{where}[{i}]")


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _checked_metadata(path: Path, raw: dict[str, Any]) -> dict[str, Any]:
    """``raw``'s ``metadata`` object ({} when absent), refused when it or its ``scheduler`` is
    not an object, when ``scheduler`` names a key the engine does not know (a misspelt
    default would run silently with the built-in one), or when its ``fit`` record has a part
    of the wrong type (the accuracy quoted after a run reads it: checked here, before the run,
    not found broken after it)."""
    meta = raw.get("metadata", {})
    if not isinstance(meta, dict):
        raise ProfileError(f"{path}: metadata: must be a JSON object, got {meta!r}")
    scheduler = meta.get("scheduler", {})
    if not isinstance(scheduler, dict):
        raise ProfileError(
            f"{path}: metadata.scheduler: must be a JSON object, got {scheduler!r}")
    _check_scheduler_keys(path, scheduler)
    _check_fit(path, meta.get("fit"))
    return meta


def _check_scheduler_keys(path: Path, scheduler: dict[str, Any]) -> None:
    """Each key of ``metadata.scheduler`` is an engine default the reference takes
    (``PROFILE_SCHEDULER_KEYS``), ``sources`` (where each default was read) or a note
    (``_``-prefixed, as at the top level)."""
    known = (*PROFILE_SCHEDULER_KEYS, "sources")
    for key in scheduler:
        if key in known or key.startswith("_"):
            continue
        close = difflib.get_close_matches(key, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ProfileError(f"{path}: metadata.scheduler: unknown key {key!r}{hint}; known "
                           f"keys: {', '.join(known)}")


# The parts of ``metadata.fit`` that ``profile_accuracy`` and ``profile_changed_since_measured``
# read (written by ``batchlab fit-published``: harness/published/refit.py). Each may be absent
# or null; any other key is the fitter's own (``batchlab calibrate`` writes a record of other
# keys altogether) and is not checked.
_FIT_STATS = ("train", "held_out", "held_out_workload_published")
_FIT_STRINGS = ("measured_digest", "coefficients_from")
# In each statistics record: the figures the accuracy quotes.
_STATS_NUMBERS = ("median_abs_error", "worst_abs_error")
_STATS_COUNTS = ("num_rows", "num_over")


def _check_fit(path: Path, fit: object) -> None:
    """``metadata.fit``, where present: an object whose statistics records are objects of
    numbers and whose digest and donor are strings; errors name the field's path."""
    if fit is None:
        return
    fit = _object(path, "metadata.fit", fit)
    for key in _FIT_STATS:
        _check_stats(path, f"metadata.fit.{key}", fit.get(key))
    if fit.get("held_out_by_kind") is not None:
        where = "metadata.fit.held_out_by_kind"
        for kind, stats in _object(path, where, fit["held_out_by_kind"]).items():
            _check_stats(path, f"{where}.{kind}", _object(path, f"{where}.{kind}", stats))
    for key in _FIT_STRINGS:
        value = fit.get(key)
        if value is not None and not isinstance(value, str):
            raise _type_error(path, f"metadata.fit.{key}", value, "a string")


def _check_stats(path: Path, where: str, stats: object) -> None:
    """One statistics record (``{"num_rows": 8, "median_abs_error": 0.23, ...}``) or null."""
    if stats is None:
        return
    for key, value in _object(path, where, stats).items():
        if value is None:
            continue
        if key in _STATS_NUMBERS or key in _STATS_COUNTS:
            counts = key in _STATS_COUNTS
            if isinstance(value, bool) or not isinstance(value, int if counts else int | float):
                raise _type_error(path, f"{where}.{key}", value,
                                  "an integer" if counts else "a number")
            if not value >= 0 or not math.isfinite(value):  # NaN, as Python's json reads it
                raise ProfileError(f"{path}: {where}.{key}: must be a finite number >= 0, "
                                   f"got {value!r}")
        elif key == "sources" and not isinstance(value, list):
            raise _type_error(path, f"{where}.{key}", value, "an array")


def _object(path: Path, where: str, value: object) -> dict[str, Any]:
    """``value``, refused unless it is a JSON object."""
    if not isinstance(value, dict):
        raise _type_error(path, where, value, "an object")
    return value


def _type_error(path: Path, where: str, value: object, expected: str) -> ProfileError:
    """"bad.json: metadata.fit.train: expected an object, got a string ("x")"."""
    return ProfileError(f"{path}: {where}: expected {expected}, got {_json_type(value)}")


def _json_type(value: object) -> str:
    """``value``'s JSON type as an error names it, with a scalar's value: "a string ("x")",
    "an array", "null", "true"."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    kind = "a string" if isinstance(value, str) else "a number"
    return f"{kind} ({json.dumps(value)[:40]})"


_HARDWARE_OVERRIDES = (
    "memory_bytes", "hbm_bandwidth_bytes_per_s", "peak_bf16_flops", "peak_fp8_flops",
    "pcie_bandwidth_bytes_per_s", "interconnect_bandwidth_bytes_per_s",
)


def resolve_gpu(name: str | None, params: CostModelParams) -> GpuSpec:
    """The device a run is costed on: the catalog entry with the profile's overrides applied.

    ``name`` (``--gpu``) and the profile's ``device`` must agree when both are given: a profile
    fitted on one device says nothing about another.
    """
    if name and params.device and name.lower() != params.device.lower():
        raise UnknownHardwareError(
            f"--gpu {name!r} but the profile ({params.source}) was fitted on device "
            f"{params.device!r}; pass --gpu {params.device} or omit --gpu"
        )
    device = (name or params.device or "h100-sxm").lower()
    overrides = {k: getattr(params, k) for k in _HARDWARE_OVERRIDES
                 if getattr(params, k) is not None}
    base = GPUS.get(device)
    if base is not None:
        note = f"; overridden by {params.source}: {', '.join(sorted(overrides))}"
        return replace(base, **overrides, source=base.source + (note if overrides else ""))
    missing = [k for k in ("memory_bytes", "hbm_bandwidth_bytes_per_s", "peak_bf16_flops")
               if k not in overrides]
    if missing:
        hint = gpu_hint(device)
        profile = (f"; the profile ({params.source}) describes no device of its own: it lacks "
                   f"{', '.join(missing)}" if overrides else
                   "; a --profile JSON may describe another device, with all of "
                   "memory_bytes, hbm_bandwidth_bytes_per_s and peak_bf16_flops")
        raise UnknownHardwareError(
            f"unknown GPU {device!r}{hint}; known GPUs: {', '.join(known_gpus())}{profile}")
    return GpuSpec(
        name=device,
        memory_bytes=overrides["memory_bytes"],
        hbm_bandwidth_bytes_per_s=overrides["hbm_bandwidth_bytes_per_s"],
        peak_bf16_flops=overrides["peak_bf16_flops"],
        peak_fp8_flops=overrides.get("peak_fp8_flops"),
        # A device without these figures: PCIe Gen4 x16 for host copies and between devices.
        pcie_bandwidth_bytes_per_s=overrides.get("pcie_bandwidth_bytes_per_s", 32e9),
        interconnect_bandwidth_bytes_per_s=overrides.get(
            "interconnect_bandwidth_bytes_per_s", 32e9),
        source=f"described by profile {params.source}",
    )


@dataclass(frozen=True, slots=True)
class KvBudget:
    """How device memory is split, per GPU, and how many KV blocks that leaves."""

    usable_bytes: float  # memory_bytes * gpu_memory_utilization
    weight_bytes: float
    activation_reserve_bytes: float
    kv_bytes: float  # what is left for the KV cache (may be <= 0: does not fit)
    kv_bytes_per_block: float
    num_blocks: int


@dataclass(frozen=True, slots=True)
class StepCost:
    """One step's cost, broken down (``CostModel.step_s`` returns only ``total_s``)."""

    memory_bytes: float
    flops: float
    memory_s: float
    compute_s: float
    overhead_s: float  # fixed + per-seq + per-token + all-reduce + swap
    total_s: float

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"

    @property
    def arithmetic_intensity(self) -> float:
        return self.flops / self.memory_bytes if self.memory_bytes else math.inf


class CostModel:
    """Seconds per step for one model on one device; the coefficients are folded once here."""

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        params: CostModelParams,
        *,
        weights_dtype: str = "bf16",
        kv_cache_dtype: str = "bf16",
        tp: int = 1,
        block_size: int = 16,
    ) -> None:
        self.model, self.gpu, self.params = model, gpu, params
        self.weights_dtype, self.kv_cache_dtype, self.tp = weights_dtype, kv_cache_dtype, tp
        self.block_size = block_size

        # FP8 checkpoints quantize the attention and MLP projections; embeddings, lm_head and
        # norms stay in BF16 (as vLLM's online fp8 and published FP8 checkpoints do).
        linear_b = params.weight_bytes_per_param or DTYPE_BYTES[weights_dtype]
        other_b = params.weight_bytes_per_param or DTYPE_BYTES["bf16"]
        untied = 0 if model.tie_word_embeddings else model.num_lm_head_params
        self.weight_bytes = (
            model.num_linear_params * linear_b
            + (model.num_embedding_params + untied + model.num_norm_params) * other_b
        ) / tp
        # The embedding table is gathered (a few rows per step), not streamed; lm_head is.
        self.weight_bytes_read = (
            model.num_linear_params * linear_b
            + (model.num_lm_head_params + model.num_norm_params) * other_b
        ) / tp
        kv_elem_b = params.kv_bytes_per_element or DTYPE_BYTES[kv_cache_dtype]
        self.kv_bytes_per_token = model.kv_bytes_per_token(kv_elem_b, tp)
        self.kv_bytes_per_block = self.kv_bytes_per_token * block_size

        linear_peak = gpu.peak_flops(weights_dtype) * params.compute_efficiency
        bf16_peak = gpu.peak_bf16_flops * params.compute_efficiency
        self.flops_per_token = 2.0 * model.num_linear_params / tp
        self.flops_per_seq = 2.0 * model.num_lm_head_params / tp
        self.flops_per_pair = (4.0 * model.num_layers * (model.num_attention_heads / tp)
                               * model.head_dim)

        bw = gpu.hbm_bandwidth_bytes_per_s * params.memory_efficiency
        self._mem_fixed_s = self.weight_bytes_read / bw
        self._mem_per_kv_token_s = self.kv_bytes_per_token / bw
        self._comp_per_token_s = self.flops_per_token / linear_peak
        self._comp_per_seq_s = self.flops_per_seq / linear_peak
        self._comp_per_pair_s = self.flops_per_pair / bf16_peak

        # Two ring all-reduces per layer of the step's activations (bf16), when tp > 1.
        allreduce_fixed_s = allreduce_per_token_s = 0.0
        if tp > 1:
            num_allreduces = 2 * model.num_layers
            ring_bytes_per_token = 2 * (tp - 1) / tp * model.hidden_size * 2
            allreduce_fixed_s = num_allreduces * params.allreduce_latency_s
            allreduce_per_token_s = (num_allreduces * ring_bytes_per_token
                                     / gpu.tp_bandwidth_bytes_per_s(tp))
        # The overhead terms, for tables that show where a step's time goes.
        self.allreduce_fixed_s = allreduce_fixed_s
        self.allreduce_per_token_s = allreduce_per_token_s
        self.fp8_kv_token_overhead_s = (
            params.per_fp8_kv_token_overhead_s if kv_cache_dtype == "fp8" else 0.0)
        # The arithmetic intensity at which the projections' compute time overtakes the
        # bytes' time at these efficiencies: where ``StepCost.bound`` turns to "compute"
        # (attention FLOPs run at the BF16 rate, which turns it earlier with FP8 weights).
        self.ridge_flop_per_byte = linear_peak / bw

        self._fixed_s = params.step_overhead_s + allreduce_fixed_s
        self._per_token_s = params.per_token_overhead_s + allreduce_per_token_s
        self._per_seq_s = params.per_seq_overhead_s
        self._per_kv_token_s = params.per_kv_token_overhead_s + self.fp8_kv_token_overhead_s
        self._per_pair_s = params.per_attention_pair_overhead_s
        self.swap_bandwidth_bytes_per_s = gpu.pcie_bandwidth_bytes_per_s * params.swap_efficiency
        self._swap_per_block_s = self.kv_bytes_per_block / self.swap_bandwidth_bytes_per_s

    def step_s(self, num_tokens: int, num_seqs: int, num_kv_tokens: int,
               num_attention_pairs: int, num_swap_blocks: int = 0) -> float:
        """Duration of one step. Hot path: a few multiplications, no allocation."""
        memory_s = self._mem_fixed_s + num_kv_tokens * self._mem_per_kv_token_s
        compute_s = (num_tokens * self._comp_per_token_s + num_seqs * self._comp_per_seq_s
                     + num_attention_pairs * self._comp_per_pair_s)
        return ((memory_s if memory_s > compute_s else compute_s) + self._fixed_s
                + num_seqs * self._per_seq_s + num_tokens * self._per_token_s
                + num_kv_tokens * self._per_kv_token_s + num_attention_pairs * self._per_pair_s
                + num_swap_blocks * self._swap_per_block_s)

    def step_cost(self, num_tokens: int, num_seqs: int, num_kv_tokens: int,
                  num_attention_pairs: int, num_swap_blocks: int = 0) -> StepCost:
        """``step_s`` with its parts, for tables and docs."""
        memory_s = self._mem_fixed_s + num_kv_tokens * self._mem_per_kv_token_s
        compute_s = (num_tokens * self._comp_per_token_s + num_seqs * self._comp_per_seq_s
                     + num_attention_pairs * self._comp_per_pair_s)
        total_s = self.step_s(num_tokens, num_seqs, num_kv_tokens, num_attention_pairs,
                              num_swap_blocks)
        return StepCost(
            memory_bytes=self.weight_bytes_read + self.kv_bytes_per_token * num_kv_tokens,
            flops=(self.flops_per_token * num_tokens + self.flops_per_seq * num_seqs
                   + self.flops_per_pair * num_attention_pairs),
            memory_s=memory_s,
            compute_s=compute_s,
            overhead_s=total_s - max(memory_s, compute_s),
            total_s=total_s,
        )

    def decode_step_cost(self, batch_size: int, context_len: int) -> StepCost:
        """One decode step of ``batch_size`` requests that each hold ``context_len`` tokens."""
        kv = batch_size * (context_len + 1)
        return self.step_cost(batch_size, batch_size, kv, kv)

    def swap_s(self, num_blocks: int) -> float:
        return num_blocks * self._swap_per_block_s

    def activation_reserve_bytes(self, max_num_batched_tokens: int, max_num_seqs: int) -> float:
        """Peak activation memory of the largest step, plus the fixed reserve.

        The largest step holds ``max_num_batched_tokens`` tokens: the MLP's gate and up outputs
        (2 x intermediate) and a few hidden-sized buffers per token in bf16, plus fp32 logits
        for ``max_num_seqs`` positions (vLLM measures this with a dummy forward pass).
        """
        m, tp = self.model, self.tp
        per_token = 2.0 * (4 * m.hidden_size + 2 * m.intermediate_size / tp)
        logits = 4.0 * max_num_seqs * m.vocab_size / tp
        return self.params.activation_fixed_bytes + per_token * max_num_batched_tokens + logits

    def kv_budget(self, gpu_memory_utilization: float, max_num_batched_tokens: int,
                  max_num_seqs: int) -> KvBudget:
        usable = self.gpu.memory_bytes * gpu_memory_utilization
        reserve = self.activation_reserve_bytes(max_num_batched_tokens, max_num_seqs)
        kv_bytes = usable - self.weight_bytes - reserve
        return KvBudget(
            usable_bytes=usable,
            weight_bytes=self.weight_bytes,
            activation_reserve_bytes=reserve,
            kv_bytes=kv_bytes,
            kv_bytes_per_block=self.kv_bytes_per_block,
            num_blocks=max(0, int(kv_bytes // self.kv_bytes_per_block)),
        )


# Scheduler defaults a profile may carry (``metadata.scheduler``): the engine's own values for
# the knobs a user leaves unset. Keys are ReferenceConfig fields; any other key there but
# ``sources`` and ``_`` notes is refused at load (``_check_scheduler_keys``).
PROFILE_SCHEDULER_KEYS = ("max_num_seqs", "max_num_batched_tokens", "policy", "preemption",
                          "admission", "chunked_prefill", "prefix_caching",
                          "gpu_memory_utilization", "block_size", "oversized_prompts",
                          "reserve_last_token")


def _profile_raw(name_or_path: str | Path) -> dict[str, Any]:
    path, raw = _read_profile(name_or_path)
    _checked_metadata(path, raw)
    return raw


def profile_metadata(name_or_path: str | Path) -> dict[str, Any]:
    """A profile's ``metadata`` object ({} when it has none); errors name the file."""
    path, raw = _read_profile(name_or_path)
    return _checked_metadata(path, raw)


def profile_digest(raw: dict[str, Any]) -> str:
    """What a profile predicts with, as a digest: its coefficients and the engine defaults it
    carries (``metadata.scheduler``), not its descriptions (``source``, keys starting with
    ``_``, the rest of ``metadata``). Written into ``metadata.fit`` when its accuracy is
    measured (``measured_digest``), so that a file changed since quotes none."""
    meta = raw.get("metadata")
    body = {k: v for k, v in raw.items()
            if k not in ("source", "metadata") and not k.startswith("_")}
    scheduler = meta.get("scheduler") if isinstance(meta, dict) else None
    # its engine defaults only: not where they were read ("sources") or other descriptions
    body["scheduler"] = ({k: scheduler[k] for k in PROFILE_SCHEDULER_KEYS if k in scheduler}
                         if isinstance(scheduler, dict) else None)
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def profile_changed_since_measured(name_or_path: str | Path) -> bool:
    """A profile whose accuracy was measured (``metadata.fit.held_out``) with coefficients or
    engine defaults other than the file's own now (copied and edited, say), or whose record
    does not say which it was measured with (no ``measured_digest``)."""
    raw = _profile_raw(name_or_path)
    meta = raw.get("metadata")
    fit = meta.get("fit") if isinstance(meta, dict) else None
    if not isinstance(fit, dict) or not isinstance(fit.get("held_out"), dict):
        return False
    return fit.get("measured_digest") != profile_digest(raw)


def profile_scheduler_defaults(name_or_path: str | Path) -> dict[str, Any]:
    """The engine defaults a profile records, for knobs the user did not set."""
    scheduler = profile_metadata(name_or_path).get("scheduler")
    if not isinstance(scheduler, dict):
        return {}
    return {k: scheduler[k] for k in PROFILE_SCHEDULER_KEYS if k in scheduler}


def profile_accuracy(name_or_path: str | Path) -> dict[str, Any] | None:
    """How accurate a shipped profile's predictions were measured to be against published
    figures it was not fitted on (``metadata.fit.held_out``), or None when not measured, or
    measured with other coefficients than the file has now (``profile_digest``)."""
    fit = profile_metadata(name_or_path).get("fit")
    if not isinstance(fit, dict) or not isinstance(fit.get("held_out"), dict):
        return None
    if profile_changed_since_measured(name_or_path):
        return None  # measured for other coefficients than the file's
    held, train = fit["held_out"], fit.get("train") or {}
    # the same, on the held-out figures whose workload is fully published: null in the file
    # when there were none, absent from a file fitted before they were counted (then the
    # record says nothing of them, rather than "none")
    published = ({} if "held_out_workload_published" not in fit else {
        "held_out_published_median_abs_error": None, "held_out_published_worst_abs_error": None,
        "held_out_published_num_rows": None})
    for key, value in (fit.get("held_out_workload_published") or {}).items():
        if f"held_out_published_{key}" in published:
            published[f"held_out_published_{key}"] = value
    return {"held_out_median_abs_error": held.get("median_abs_error"),
            "held_out_worst_abs_error": held.get("worst_abs_error"),
            "held_out_num_rows": held.get("num_rows"),
            **published,
            "train_median_abs_error": train.get("median_abs_error"),
            # {kind of figure: held-out errors}: throughput, TTFT, TPOT/ITL, E2E
            "held_out_by_kind": fit.get("held_out_by_kind"),
            # a profile without training rows of its own engine and GPU: whose it borrows
            "coefficients_from": fit.get("coefficients_from"),
            "source": "docs/fidelity.md"}
