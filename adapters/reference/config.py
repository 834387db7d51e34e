"""``ReferenceConfig``: every setting of the reference engine, validated once, here.

Field names match the command-line flags (``--max-num-seqs`` -> ``max_num_seqs``,
``--tp`` -> ``tp``). Each component receives only its own section: the scheduler gets a
``SchedulerConfig``, the executor a ``CostModel``, the block manager its block counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from adapters.knobs import ADMISSIONS, DTYPES, POLICIES, PREEMPTIONS, Knobs, ReferenceKnobs
from adapters.reference.cost_model import (
    CostModel,
    CostModelParams,
    KvBudget,
    ProfileError,
    load_profile,
    profile_scheduler_defaults,
    resolve_gpu,
    resolve_profile,
)
from adapters.reference.hardware import GpuSpec, UnknownHardwareError
from adapters.reference.models import ModelSpec, UnknownModelError, lookup_model

GIB = 2**30
OVERSIZED_PROMPTS = ("refuse", "reject")  # ReferenceConfig.oversized_prompts


class ConfigError(ValueError):
    """A setting is invalid; the message names the field (and the file, for profiles)."""


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The scheduler's own section of the configuration (already validated)."""

    policy: str = "fcfs"
    admission: str = "optimistic"
    preemption: str = "recompute"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    chunked_prefill: bool = True
    max_model_len: int = 131072
    prefix_caching: bool = False  # vLLM V1's automatic prefix caching (see blocks.py)
    reserve_last_token: bool = False  # ReferenceConfig's doc


@dataclass(frozen=True)
class ReferenceConfig:
    """The reference engine's settings.

    ``admission`` left as None follows ``preemption``: "none" means "reserve" (TGI and
    TensorRT-LLM GUARANTEED_NO_EVICT reserve prompt + max output tokens at admission and never
    preempt), otherwise "optimistic" (vLLM). The ``static`` policy always reserves, whatever
    ``admission`` says (``as_dict`` reports the admission actually used).
    ``max_model_len`` left as None is the model's ``max_position_embeddings``.
    ``gpu`` left as None is the profile's device, else ``h100-sxm``.
    ``oversized_prompts``: with chunked prefill off a prompt is prefilled whole in one step, so
    a prompt longer than ``max_num_batched_tokens`` can never run. "refuse": a configuration
    that would admit one (``max_model_len`` above the step budget) is refused at start, as vLLM
    refuses to start. "reject": the engine starts and rejects each such request when it
    arrives, as TensorRT-LLM's request check does (the TensorRT-LLM profiles' default).
    ``reserve_last_token``: what reserve admission holds. False: prompt + max output - 1
    tokens, the most a request ever holds KV for (its last token is sampled, never fed back),
    as TGI's queue reserves ``input + max_new_tokens - 1``. True: prompt + max output, as
    TensorRT-LLM's GUARANTEED_NO_EVICT reserves ``ceilDiv(prompt + max_new_tokens,
    tokens_per_block)`` blocks (the TensorRT-LLM profiles' default): one block more for one
    request in ``block_size``.
    """

    model: str = "llama-3.1-8b"
    gpu: str | None = None
    tp: int = 1
    policy: str = "fcfs"
    admission: str | None = None
    preemption: str = "recompute"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    chunked_prefill: bool = True
    block_size: int = 16
    num_gpu_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    weights_dtype: str = "bf16"
    kv_cache_dtype: str = "bf16"
    max_model_len: int | None = None
    prefix_caching: bool = False
    swap_space_gib: float = 4.0  # host memory for swapped KV, per GPU (vLLM V0's default)
    oversized_prompts: str = "refuse"  # or "reject" (class doc)
    reserve_last_token: bool = False  # class doc
    profile: str | None = None  # path to a calibration profile JSON
    cost_params: CostModelParams | None = None  # or the coefficients themselves

    # Resolved in __post_init__ (not arguments).
    model_spec: ModelSpec = field(init=False, repr=False, compare=False)
    gpu_spec: GpuSpec = field(init=False, repr=False, compare=False)
    params: CostModelParams = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _validate(self)

    # ---- derived sections

    @property
    def resolved_admission(self) -> str:
        if self.policy == "static":
            return "reserve"
        if self.admission is not None:
            return self.admission
        return "reserve" if self.preemption == "none" else "optimistic"

    @property
    def resolved_max_model_len(self) -> int:
        return self.max_model_len or self.model_spec.max_position_embeddings

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            policy=self.policy,
            admission=self.resolved_admission,
            preemption=self.preemption,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            chunked_prefill=self.chunked_prefill and self.policy != "static",
            max_model_len=self.resolved_max_model_len,
            prefix_caching=self.prefix_caching,
            reserve_last_token=self.reserve_last_token,
        )

    def cost_model(self) -> CostModel:
        return CostModel(
            self.model_spec, self.gpu_spec, self.params,
            weights_dtype=self.weights_dtype, kv_cache_dtype=self.kv_cache_dtype,
            tp=self.tp, block_size=self.block_size,
        )

    def kv_budget(self) -> KvBudget:
        return self.cost_model().kv_budget(
            self.gpu_memory_utilization, self.max_num_batched_tokens, self.max_num_seqs)

    def resolved_num_gpu_blocks(self) -> int:
        if self.num_gpu_blocks is not None:
            return self.num_gpu_blocks
        return self.kv_budget().num_blocks

    def num_host_blocks(self) -> int:
        return int(self.swap_space_gib * GIB // self.cost_model().kv_bytes_per_block)

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "gpu": self.gpu_spec.name, "tp": self.tp,
            "policy": self.policy, "admission": self.resolved_admission,
            "preemption": self.preemption, "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "chunked_prefill": self.chunked_prefill, "block_size": self.block_size,
            "num_gpu_blocks": self.resolved_num_gpu_blocks(),
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "weights_dtype": self.weights_dtype, "kv_cache_dtype": self.kv_cache_dtype,
            "max_model_len": self.resolved_max_model_len, "prefix_caching": self.prefix_caching,
            "swap_space_gib": self.swap_space_gib, "oversized_prompts": self.oversized_prompts,
            "reserve_last_token": self.reserve_last_token,
            "cost_model": self.params.source,
            "cost_model_digest": self.params.digest(),
        }

    @classmethod
    def from_knobs(
        cls,
        knobs: Knobs,
        reference: ReferenceKnobs | None = None,
        *,
        model: str,
        gpu: str | None,
        profile: str | None = None,
        cost_params: CostModelParams | None = None,
    ) -> ReferenceConfig:
        """The one mapping from uniform knobs to the reference: unset knobs keep its defaults,
        or the engine's own defaults that a shipped engine profile records (``metadata.scheduler``).

        ``tensor_parallel_size`` is ``tp``; preemption "none" means admission "reserve" (see
        the class doc); ``extra_args`` do not reach the simulated engine.
        """
        renamed = {"tensor_parallel_size": "tp"}
        values: dict[str, Any] = {}
        if profile is not None:  # the engine's own defaults, where the profile records them
            values.update(_profile_defaults(profile))
        values.update({
            renamed.get(name, name): getattr(knobs, name)
            for name in knobs.given_names() if name != "extra_args"
        })
        given_reference = (reference or ReferenceKnobs()).given()
        if "preemption" in knobs.given_names() and "admission" not in given_reference:
            values.pop("admission", None)  # follows the given preemption (class doc)
        values.update(given_reference)
        if (values.get("policy") == "static" and "preemption" in knobs.given_names()
                and values.get("preemption") != "none"):
            # as the served reference and TensorRT-LLM's STATIC_BATCH refuse it
            raise ConfigError(f"preemption: the static policy reserves at admission and never "
                              f"preempts, so preemption={values['preemption']} cannot apply "
                              "(give none, or leave it unset)")
        if "max_num_batched_tokens" not in knobs.given_names():
            _whole_prefill_budget(values, model)
        return cls(model=model, gpu=gpu, profile=profile, cost_params=cost_params, **values)

    def effective_knobs(self) -> dict[str, Any]:
        """The uniform knobs as they took effect in this configuration (for manifests)."""
        return {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "policy": self.policy, "preemption": self.preemption,
            "chunked_prefill": self.chunked_prefill, "weights_dtype": self.weights_dtype,
            "kv_cache_dtype": self.kv_cache_dtype,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "prefix_caching": self.prefix_caching, "tensor_parallel_size": self.tp,
            "max_model_len": self.resolved_max_model_len,
        }


def _whole_prefill_budget(values: dict[str, Any], model: str) -> None:
    """vLLM's own default for a step budget nobody set when prompts are prefilled whole
    (chunked prefill off, or the static policy) and the engine refuses what it could never
    run (``oversized_prompts`` "refuse"): max(max_model_len, its usual budget), the least it
    accepts (vllm ``engine/arg_utils.py``: ``if not self.enable_chunked_prefill:
    self.max_num_batched_tokens = max(model_config.max_model_len, ...)``; the vLLM adapter
    passes the same, docs/engines.md). An engine that rejects such prompts instead
    (TensorRT-LLM's profiles) keeps its budget."""
    whole = not values.get("chunked_prefill", True) or values.get("policy") == "static"
    if not whole or values.get("oversized_prompts", "refuse") != "refuse":
        return
    max_len = values.get("max_model_len")
    if max_len is None:
        try:
            max_len = lookup_model(model).max_position_embeddings
        except UnknownModelError:
            return  # the configuration names the model's error
    if isinstance(max_len, int) and not isinstance(max_len, bool):
        budget = values.get("max_num_batched_tokens", 8192)
        values["max_num_batched_tokens"] = max(max_len, budget) if isinstance(budget, int) \
            else budget


def _profile_defaults(profile: str) -> dict[str, Any]:
    """The engine defaults ``profile`` records (``metadata.scheduler``), each checked here: a
    bad one is the file's error, so the message names the file and the key, not a setting the
    user never gave."""
    try:
        path = resolve_profile(profile)
        defaults = profile_scheduler_defaults(path)
    except ProfileError as exc:
        raise ConfigError(f"profile: {exc}") from None
    for name, value in defaults.items():
        try:
            _check_setting(name, value)
        except ConfigError as exc:  # "max_num_seqs: must be ..."
            raise ConfigError(f"profile: {path}: metadata.scheduler.{exc}") from None
    return defaults


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}: must be a positive integer, got {value!r}")


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}: {value!r} is not one of {', '.join(allowed)}")


_CHOICES = {"policy": POLICIES, "preemption": PREEMPTIONS, "admission": ADMISSIONS,
            "weights_dtype": DTYPES, "kv_cache_dtype": DTYPES,
            "oversized_prompts": OVERSIZED_PROMPTS}
_POSITIVE_INTS = ("tp", "max_num_seqs", "max_num_batched_tokens", "block_size")
_BOOLS = ("chunked_prefill", "prefix_caching", "reserve_last_token")


def _check_setting(name: str, value: Any) -> None:
    """One setting's own rule; the rules between settings are ``_validate``'s."""
    if name in _CHOICES:
        _choice(name, value, _CHOICES[name])
    elif name in _POSITIVE_INTS:
        _positive_int(name, value)
    elif name in _BOOLS:
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: must be true or false, got {value!r}")
    elif name == "gpu_memory_utilization" and (
            isinstance(value, bool) or not (isinstance(value, int | float) and 0 < value <= 1)):
        raise ConfigError(f"gpu_memory_utilization: must be in (0, 1], got {value!r}")


def _validate(c: ReferenceConfig) -> None:
    for name in ("policy", "preemption", "weights_dtype", "kv_cache_dtype", "oversized_prompts"):
        _check_setting(name, getattr(c, name))
    if c.admission is not None:
        _check_setting("admission", c.admission)
    for name in _POSITIVE_INTS:
        _check_setting(name, getattr(c, name))
    for name in ("num_gpu_blocks", "max_model_len"):
        if getattr(c, name) is not None:
            _positive_int(name, getattr(c, name))
    for name in (*_BOOLS, "gpu_memory_utilization"):
        _check_setting(name, getattr(c, name))
    if not (isinstance(c.swap_space_gib, int | float) and c.swap_space_gib >= 0
            and math.isfinite(c.swap_space_gib)):
        raise ConfigError(f"swap_space_gib: must be >= 0, got {c.swap_space_gib!r}")
    if c.preemption == "none" and c.admission == "optimistic":
        raise ConfigError("preemption: 'none' needs admission 'reserve' (optimistic admission "
                          "must be able to preempt when KV blocks run out)")
    if c.max_num_batched_tokens < c.max_num_seqs:
        raise ConfigError(
            f"max_num_batched_tokens: {c.max_num_batched_tokens} must be >= max_num_seqs "
            f"({c.max_num_seqs}), as vLLM requires: every running request needs a decode token "
            "each step")

    if c.profile is not None and c.cost_params is not None:
        raise ConfigError("profile: give either a profile path or cost_params, not both")
    try:
        params = load_profile(c.profile) if c.profile is not None else (
            c.cost_params or CostModelParams())
        params.validate(where=c.profile or "cost_params")
    except ProfileError as exc:
        raise ConfigError(f"profile: {exc}") from None
    try:
        model_spec = lookup_model(c.model)
    except UnknownModelError as exc:
        raise ConfigError(f"model: {exc}") from None
    try:
        gpu_spec = resolve_gpu(c.gpu, params)
    except UnknownHardwareError as exc:
        raise ConfigError(f"gpu: {exc}") from None
    object.__setattr__(c, "params", params)
    object.__setattr__(c, "model_spec", model_spec)
    object.__setattr__(c, "gpu_spec", gpu_spec)

    heads, kv_heads = model_spec.num_attention_heads, model_spec.num_kv_heads
    if heads % c.tp or (kv_heads % c.tp and c.tp % kv_heads):
        raise ConfigError(
            f"tp: {c.tp} must divide the model's {heads} attention heads, and divide or be a "
            f"multiple of its {kv_heads} KV heads")
    if c.max_model_len is not None and c.max_model_len > model_spec.max_position_embeddings:
        raise ConfigError(
            f"max_model_len: {c.max_model_len} exceeds the model's max_position_embeddings "
            f"({model_spec.max_position_embeddings})")
    if (c.policy == "static" or not c.chunked_prefill) and c.oversized_prompts == "refuse":
        why = "the static policy prefills" if c.policy == "static" else \
            "with chunked prefill off a prompt is prefilled"
        if c.max_num_batched_tokens < c.resolved_max_model_len:
            # a profile whose engine does not chunk prefills by default (TensorRT-LLM): say so,
            # since the user never asked for chunked prefill to be off
            origin = (f" (profile {c.profile} turns chunked prefill off: its engine's default)"
                      if c.profile is not None and not c.chunked_prefill
                      and profile_scheduler_defaults(c.profile).get("chunked_prefill") is False
                      else "")
            raise ConfigError(
                f"max_num_batched_tokens: {c.max_num_batched_tokens} must be >= max_model_len "
                f"({c.resolved_max_model_len}) because {why} whole in one step (vLLM's rule; "
                "left unset, it is raised to max_model_len as vLLM does)"
                f"{origin}; raise --max-num-batched-tokens, lower --max-model-len"
                + ("" if c.policy == "static" else ", or use --chunked-prefill"))
    if c.num_gpu_blocks is None:
        budget = c.kv_budget()
        if budget.num_blocks < 1:
            raise ConfigError(
                f"gpu: {model_spec.name} needs {budget.weight_bytes / GIB:.1f} GiB of weights "
                f"per GPU plus {budget.activation_reserve_bytes / GIB:.1f} GiB of activations, "
                f"but {gpu_spec.name} x gpu_memory_utilization {c.gpu_memory_utilization} "
                f"leaves {budget.usable_bytes / GIB:.1f} GiB: no room for the KV cache. "
                "Raise --tp, use --weights-dtype fp8, or raise --gpu-memory-utilization")
