"""Calibrate the reference engine's cost model against a live engine.

``batchlab calibrate`` runs a short designed workload against a real server, measures engine
step times from the streamed token timestamps, fits the cost model's coefficients and writes a
profile (``adapters.reference.cost_model.load_profile`` reads it)::

    phases (one server, one after another)        what they isolate
      warmup        2 short requests              nothing (first-request effects)
      prefill       1 user, prompts 16..L, 4 out  prefill cost per token, front-end latency
      decode-cN     N requests at once, short     step cost per running sequence
      decode-long-cN  N at once, long prompts     step cost per KV token
           │
           ▼  token timestamps of all requests of a phase, clustered into engine steps
    StepSample(duration_s, num_seqs, num_tokens, num_kv_tokens, num_attention_pairs, ...)
           │
           ▼  weighted non-negative least squares (fit_step_model)
    step_s = max(memory_s, compute_s) + step_overhead + per_seq·seqs + per_kv_token·kv
    ttft_s = frontend_latency + step_s(the prefill step)
           │
           ▼
    PROFILE.json: CostModelParams fields (+ "metadata": the fit, its residuals, the workload)

Why token timestamps work: a running request gets exactly one token per engine step (vLLM V1,
TGI, TensorRT-LLM all stream each step's token as soon as the step ends), so the tokens of all
running requests arrive together, one cluster per step, and the gap between a request's
consecutive tokens is one step's duration. A step is used only when everything it computed is
visible: every member advanced by one token since the previous cluster and no request was
waiting for its first token (an unseen prefill chunk could hide in such a step).
docs/cost-model.md ("Calibration") describes the method and its limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import math
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from adapters.base import Knobs, LaunchPlan
from adapters.process import EngineStartError, ServerProcess, probe_version, terminate_on_signals
from adapters.reference.config import ReferenceConfig
from adapters.reference.cost_model import CostModel, CostModelParams
from adapters.reference.hardware import GPUS
from harness.live import ATTACH_READY_TIMEOUT_S, DEFAULT_READY_TIMEOUT_S, plan_for
from harness.replay import ReplayConfig, batchlab_version, replay_sync
from harness.results import read_timelines, write_json_atomic, write_parquet_atomic
from harness.telemetry import parse_exposition
from harness.timeline import RequestTimeline
from harness.traces import Trace, TraceRequest

# ---------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class StepSample:
    """One measured duration and the work behind it, in the cost model's own terms.

    A decode step: ``num_tokens == num_seqs`` (one token each). A first-token sample
    (``includes_frontend``): the request's TTFT on an idle engine, i.e. the front end's
    latency (HTTP, tokenisation, streaming back) plus one prefill step.
    """

    duration_s: float
    num_seqs: int
    num_tokens: int
    num_kv_tokens: int  # sum over scheduled requests of (computed + new) tokens
    num_attention_pairs: int  # causal (query, key) pairs
    includes_frontend: bool = False
    phase: str = ""


@dataclass(frozen=True, slots=True)
class CostShape:
    """What the cost model multiplies its coefficients by, for one model, dtype and device.

    FLOPs are counted at the BF16 rate: linear FLOPs of FP8 weights are scaled by
    peak(bf16) / peak(fp8), so one effective FLOP/s figure covers both (as ``CostModel`` does).
    ``fixed_s`` and ``per_token_s`` are the tensor-parallel all-reduce terms the cost model adds
    on its own; the fit subtracts them.
    """

    weight_bytes_read: float
    kv_bytes_per_token: float
    flops_per_token: float
    flops_per_seq: float
    flops_per_pair: float
    fixed_s: float = 0.0
    per_token_s: float = 0.0

    @classmethod
    def of(cls, cm: CostModel) -> CostShape:
        """The shape of ``cm`` (its coefficients are ignored, apart from the all-reduce)."""
        linear = cm.gpu.peak_bf16_flops / cm.gpu.peak_flops(cm.weights_dtype)
        # With every overhead zeroed, what a step's overhead still holds is the all-reduce.
        bare = CostModel(cm.model, cm.gpu, replace(
            cm.params, step_overhead_s=0.0, per_seq_overhead_s=0.0, per_token_overhead_s=0.0,
            per_kv_token_overhead_s=0.0), weights_dtype=cm.weights_dtype,
            kv_cache_dtype=cm.kv_cache_dtype, tp=cm.tp, block_size=cm.block_size)
        fixed_s = bare.step_cost(0, 0, 0, 0).overhead_s
        per_token_s = bare.step_cost(1, 0, 0, 0).overhead_s - fixed_s
        return cls(cm.weight_bytes_read, cm.kv_bytes_per_token, cm.flops_per_token * linear,
                   cm.flops_per_seq * linear, cm.flops_per_pair, fixed_s=fixed_s,
                   per_token_s=per_token_s)

    def memory_bytes(self, s: StepSample) -> float:
        return self.weight_bytes_read + self.kv_bytes_per_token * s.num_kv_tokens

    def flops(self, s: StepSample) -> float:
        return (self.flops_per_token * s.num_tokens + self.flops_per_seq * s.num_seqs
                + self.flops_per_pair * s.num_attention_pairs)

    def fixed(self, s: StepSample) -> float:
        return self.fixed_s + self.per_token_s * s.num_tokens


# ---------------------------------------------------------------- step extraction


@dataclass(slots=True)
class _Chunk:
    t_s: float
    request_index: int
    last_token_index: int  # output index of the chunk's last token (0 = the first token)
    num_tokens: int


def _cluster_threshold_s(timelines: Sequence[RequestTimeline]) -> float:
    """Chunks closer than this belong to one step: a third of the typical token gap."""
    gaps = [g for tl in timelines for g in np.diff(tl.chunk_times_s) if g > 0]
    if not gaps:
        return 0.0
    return max(0.3 * float(np.median(gaps)), 1e-4)


def decode_step_samples(timelines: Sequence[RequestTimeline], *, phase: str = "",
                        threshold_s: float | None = None) -> list[StepSample]:
    """Engine steps whose every scheduled token is visible in the stream: pure decode steps.

    Chunks of all requests are sorted and cut into clusters where consecutive instants are
    more than ``threshold_s`` apart (default: 0.3 x the median token gap); each cluster is the
    output of one step. A cluster is kept when each member advanced by exactly one token since
    the previous cluster, every request that was decoding is a member, and no request had been
    sent without having its first token (its prefill may have run, unseen, in that step). Its
    duration is the median of the members' gaps since the previous cluster.
    """
    timelines = [tl for tl in timelines if tl.ok and tl.chunk_times_s]
    if not timelines:
        return []
    tau = _cluster_threshold_s(timelines) if threshold_s is None else threshold_s
    chunks: list[_Chunk] = []
    for i, tl in enumerate(timelines):
        produced = np.cumsum(np.asarray(tl.chunk_num_tokens, dtype=np.int64))
        for t, n_tok, last in zip(tl.chunk_times_s, tl.chunk_num_tokens, produced, strict=True):
            chunks.append(_Chunk(t, i, int(last) - 1, int(n_tok)))
    chunks.sort(key=lambda c: c.t_s)
    clusters: list[list[_Chunk]] = [[chunks[0]]]
    for c in chunks[1:]:
        if c.t_s - clusters[-1][-1].t_s > tau:
            clusters.append([])
        clusters[-1].append(c)

    first_t = [tl.chunk_times_s[0] for tl in timelines]
    last_t = [tl.chunk_times_s[-1] for tl in timelines]
    sent = [tl.start_s for tl in timelines]
    out: list[StepSample] = []
    previous: dict[int, _Chunk] = {}
    for k, cluster in enumerate(clusters):
        members = {c.request_index: c for c in cluster}
        t_k = float(np.median([c.t_s for c in cluster]))
        clean = k > 0 and len(members) == len(cluster)
        if clean:
            for i, c in members.items():
                prev = previous.get(i)
                if (prev is None or c.num_tokens != 1
                        or c.last_token_index != prev.last_token_index + 1):
                    clean = False
                    break
        if clean:
            t_prev_hi = max(c.t_s for c in clusters[k - 1])
            for i in range(len(timelines)):
                decoding = first_t[i] <= t_prev_hi and last_t[i] >= t_k - tau
                pending = sent[i] < t_k and first_t[i] > t_k + tau
                if pending or (decoding and i not in members):
                    clean = False
                    break
        if clean:
            gaps = [c.t_s - previous[i].t_s for i, c in members.items()]
            kv = sum(timelines[i].num_prompt_tokens + c.last_token_index
                     for i, c in members.items())
            out.append(StepSample(
                duration_s=float(np.median(gaps)), num_seqs=len(members),
                num_tokens=len(members), num_kv_tokens=kv, num_attention_pairs=kv, phase=phase,
            ))
        for i, c in members.items():
            previous[i] = c
        for i in list(previous):  # a request absent from this cluster breaks its chain
            if i not in members:
                del previous[i]
    return out


def first_token_samples(timelines: Sequence[RequestTimeline], *,
                        phase: str = "") -> list[StepSample]:
    """TTFT of requests sent to an idle engine (nothing else in flight): front end + prefill."""
    ok = sorted((tl for tl in timelines if tl.ok and tl.chunk_times_s), key=lambda tl: tl.start_s)
    out = []
    for tl in ok:
        start, first = tl.start_s, tl.chunk_times_s[0]
        busy = any(o is not tl and o.start_s < first and (o.finished_s or math.inf) > start
                   for o in ok)
        if busy:
            continue
        p = tl.num_prompt_tokens
        out.append(StepSample(duration_s=first - start, num_seqs=1, num_tokens=p,
                              num_kv_tokens=p, num_attention_pairs=p * (p + 1) // 2,
                              includes_frontend=True, phase=phase))
    return out


# ---------------------------------------------------------------- fitting


def nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares by enumerating active sets (a handful of columns).

    The optimum is the unconstrained least-squares solution on some subset of the columns
    whose coefficients are all >= 0 (the KKT conditions); every such candidate is feasible, so
    the best of them is the optimum. Exact, and 2^n small solves for n columns.
    """
    n = a.shape[1]
    best = np.zeros(n)
    best_sse = float(y @ y)
    for size in range(1, n + 1):
        for cols in itertools.combinations(range(n), size):
            sub = a[:, cols]
            coef, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if np.any(coef < 0):
                continue
            r = y - sub @ coef
            sse = float(r @ r)
            if sse < best_sse:
                best_sse = sse
                best = np.zeros(n)
                best[list(cols)] = coef
    return best


# The linear part of the model: one coefficient per column of _linear_features.
LINEAR_TERMS = ("step_overhead_s", "per_seq_overhead_s", "per_kv_token_overhead_s",
                "frontend_latency_s")


@dataclass(frozen=True)
class StepFit:
    """A fitted step-time model: the roofline's two effective figures, then linear overheads.

        step_s = max(bytes / memory_bytes_per_s, flops / compute_flops_per_s)
                 + step_overhead_s + per_seq_overhead_s * seqs + per_kv_token_overhead_s * kv
        ttft_s on an idle engine = frontend_latency_s + step_s(its prefill step)
    """

    memory_bytes_per_s: float  # effective; math.inf: no step was memory-bound
    compute_flops_per_s: float  # effective, BF16-equivalent FLOPs
    coefficients: dict[str, float]  # LINEAR_TERMS -> seconds (per unit)
    num_samples: int
    num_outliers: int
    median_abs_relative_error: float  # over all samples, outliers included
    p90_abs_relative_error: float
    by_phase: dict[str, float] = field(default_factory=dict)  # median |relative error|

    def predict_s(self, shape: CostShape, samples: Sequence[StepSample]) -> np.ndarray:
        coef = np.array([self.coefficients[t] for t in LINEAR_TERMS])
        return (_given(shape, samples, self.memory_bytes_per_s, self.compute_flops_per_s)
                + _linear_features(samples) @ coef)

    def as_dict(self) -> dict[str, Any]:
        return {
            "memory_bytes_per_s": None if math.isinf(self.memory_bytes_per_s)
            else self.memory_bytes_per_s,
            "compute_flops_per_s": self.compute_flops_per_s,
            **self.coefficients,
            "num_samples": self.num_samples,
            "num_outliers": self.num_outliers,
            "median_abs_relative_error": self.median_abs_relative_error,
            "p90_abs_relative_error": self.p90_abs_relative_error,
            "median_abs_relative_error_by_phase": self.by_phase,
        }


def _linear_features(samples: Sequence[StepSample]) -> np.ndarray:
    return np.array([[1.0, s.num_seqs, s.num_kv_tokens, 1.0 if s.includes_frontend else 0.0]
                     for s in samples], dtype=np.float64).reshape(-1, len(LINEAR_TERMS))


def _given(shape: CostShape, samples: Sequence[StepSample], bw: float, peak: float) -> np.ndarray:
    """The part the two figures decide: max(memory, compute), plus the model's all-reduce."""
    mem = np.array([shape.memory_bytes(s) for s in samples]) / bw
    comp = np.array([shape.flops(s) for s in samples]) / peak
    return np.maximum(mem, comp) + np.array([shape.fixed(s) for s in samples])


def _solve(shape: CostShape, samples: Sequence[StepSample], y: np.ndarray, w: np.ndarray,
           bw: float, peak: float) -> tuple[float, np.ndarray]:
    given = _given(shape, samples, bw, peak)
    x = _linear_features(samples)
    coef = nnls(x * w[:, None], (y - given) * w)
    r = (y - given - x @ coef) * w
    return float(r @ r), coef


def _search(shape: CostShape, samples: Sequence[StepSample], y: np.ndarray, w: np.ndarray,
            bandwidth_range: tuple[float, float], compute_range: tuple[float, float],
            allow_no_memory_term: bool) -> tuple[float, float, np.ndarray]:
    """Log-spaced grid over the two figures, then a finer one around the best point; NNLS
    for the linear terms at every point.

    With ``allow_no_memory_term``, a finite bandwidth must earn its place: it is kept only
    when it cuts the weighted squared error by ``MEMORY_TERM_MIN_GAIN`` against the best fit
    without a memory term. Otherwise a memory floor (weights / bandwidth) and the fixed
    overhead trade off against each other and the split between them is noise.
    """
    best_finite = _grid_search(shape, samples, y, w, bandwidth_range, compute_range, False)
    if not allow_no_memory_term:
        return best_finite[1], best_finite[2], best_finite[3]
    best_none = _grid_search(shape, samples, y, w, bandwidth_range, compute_range, True)
    if best_finite[0] < (1 - MEMORY_TERM_MIN_GAIN) * best_none[0]:
        return best_finite[1], best_finite[2], best_finite[3]
    return best_none[1], best_none[2], best_none[3]


MEMORY_TERM_MIN_GAIN = 0.05


def _grid_search(shape: CostShape, samples: Sequence[StepSample], y: np.ndarray, w: np.ndarray,
                 bandwidth_range: tuple[float, float], compute_range: tuple[float, float],
                 no_memory_term: bool) -> tuple[float, float, float, np.ndarray]:
    bws = [math.inf] if no_memory_term else list(np.geomspace(*bandwidth_range, 17))
    peaks = list(np.geomspace(*compute_range, 25))
    best: tuple[float, float, float, np.ndarray] = (math.inf, math.inf, math.inf,
                                                     np.zeros(len(LINEAR_TERMS)))
    for bw in bws:
        for peak in peaks:
            sse, coef = _solve(shape, samples, y, w, bw, peak)
            if sse < best[0]:
                best = (sse, bw, peak, coef)
    _, bw0, peak0, _ = best
    lo_b, hi_b = bandwidth_range
    lo_c, hi_c = compute_range
    fine_bws = ([math.inf] if math.isinf(bw0)
                else list(np.geomspace(max(lo_b, bw0 / 2), min(hi_b, bw0 * 2), 11)))
    for bw in fine_bws:
        for peak in np.geomspace(max(lo_c, peak0 / 2), min(hi_c, peak0 * 2), 11):
            sse, coef = _solve(shape, samples, y, w, bw, peak)
            if sse < best[0]:
                best = (sse, bw, peak, coef)
    return best


def _group_weights(samples: Sequence[StepSample], scale: np.ndarray) -> np.ndarray:
    """Relative errors (1 / the expected duration) count; first-token samples weigh as much in
    total as the steps, because they are few and alone pin the prefill cost and front end."""
    w = 1.0 / np.maximum(scale, 1e-9)
    front = np.array([s.includes_frontend for s in samples])
    if front.any() and (~front).any():
        w[front] *= math.sqrt((~front).sum() / front.sum())
    return w


def fit_step_model(
    samples: Sequence[StepSample],
    shape: CostShape,
    *,
    bandwidth_range: tuple[float, float] = (1e9, 1e12),
    compute_range: tuple[float, float] = (1e9, 1e15),
    allow_no_memory_term: bool = True,
    outlier_mads: float = 5.0,
) -> StepFit:
    """Fit the step-time model (``StepFit``) to measured samples.

    Weighted least squares on relative errors, iteratively reweighted by the prediction (1/y
    would favour samples that came out short); non-negative linear terms; the two roofline
    figures by grid search within ``*_range`` (a catalog GPU passes its datasheet figures as
    the upper bounds, so efficiencies stay <= 1). Samples further than ``outlier_mads``
    median absolute deviations from the fit (a shared machine's hiccups) are left out of the
    final solve, and counted.
    """
    if len(samples) < len(LINEAR_TERMS) + 2:
        raise ValueError(f"calibration: only {len(samples)} usable step samples; need at least "
                         f"{len(LINEAR_TERMS) + 2} (did the workload's requests fail?)")
    if not any(s.includes_frontend for s in samples):
        raise ValueError("calibration: no first-token sample (a request sent to an idle "
                         "engine); the prefill phase is missing or failed")
    samples = list(samples)
    y_all = np.array([s.duration_s for s in samples])
    kept = np.ones(len(samples), dtype=bool)
    scale = y_all.copy()
    bw = peak = math.inf
    coef = np.zeros(len(LINEAR_TERMS))
    for rnd in range(3):  # 1/y weights; 1/prediction weights; the same without outliers
        sub = [s for s, k in zip(samples, kept, strict=True) if k]
        bw, peak, coef = _search(shape, sub, y_all[kept], _group_weights(sub, scale[kept]),
                                 bandwidth_range, compute_range, allow_no_memory_term)
        pred = _given(shape, samples, bw, peak) + _linear_features(samples) @ coef
        scale = np.maximum(pred, 1e-9)
        if rnd == 1:
            rel = (y_all - pred) / scale
            centre = float(np.median(rel))
            mad = float(np.median(np.abs(rel - centre))) or 1e-9
            kept = np.abs(rel - centre) <= outlier_mads * 1.4826 * mad
    pred = _given(shape, samples, bw, peak) + _linear_features(samples) @ coef
    rel = np.abs(pred - y_all) / np.maximum(y_all, 1e-9)
    by_phase: dict[str, list[float]] = {}
    for s, e in zip(samples, rel, strict=True):
        by_phase.setdefault(s.phase, []).append(float(e))
    return StepFit(
        memory_bytes_per_s=float(bw), compute_flops_per_s=float(peak),
        coefficients={t: float(c) for t, c in zip(LINEAR_TERMS, coef, strict=True)},
        num_samples=len(samples), num_outliers=int((~kept).sum()),
        median_abs_relative_error=float(np.median(rel)),
        p90_abs_relative_error=float(np.percentile(rel, 90)),
        by_phase={k: float(np.median(v)) for k, v in sorted(by_phase.items())},
    )


# ---------------------------------------------------------------- the workload


@dataclass(frozen=True, slots=True)
class Phase:
    """One part of the calibration workload, replayed on its own against the same server."""

    name: str
    requests: tuple[TraceRequest, ...]
    concurrency: int | None  # closed loop with this many users; None: all sent at 0 s
    measures: str  # what it isolates, for the profile's metadata

    @property
    def first_token_samples(self) -> bool:
        """Sequential phases (one user) put every request on an idle engine."""
        return self.concurrency == 1


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """Sizes of the calibration workload; every length fits ``max_model_len`` and the step
    budget, and every batch fits ``max_num_seqs``."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    num_output_tokens: int = 48  # decode steps per burst: enough for a stable median
    short_prompt_tokens: int = 32
    long_prompt_tokens: int = 512  # capped by max_model_len
    max_batch_size: int = 256  # batch sizes 1, 2, 4, ... up to min(this, max_num_seqs)
    max_prefill_tokens: int = 4096  # the prefill ladder's top (capped by the budgets)
    num_repeats: int = 2  # of each prefill length

    def validate(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len",
                     "num_output_tokens", "short_prompt_tokens", "long_prompt_tokens",
                     "max_batch_size", "max_prefill_tokens", "num_repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"calibration workload: {name} must be a positive integer, "
                                 f"got {value!r}")
        if self.num_output_tokens < 8:
            raise ValueError("calibration workload: num_output_tokens must be >= 8")
        if self.max_model_len < self.short_prompt_tokens + self.num_output_tokens:
            raise ValueError(
                f"calibration workload: max_model_len {self.max_model_len} leaves no room for a "
                f"{self.short_prompt_tokens}-token prompt and {self.num_output_tokens} output "
                "tokens")

    def batch_sizes(self) -> list[int]:
        top = min(self.max_num_seqs, self.max_batch_size)
        sizes = [1]
        while sizes[-1] * 2 <= top:
            sizes.append(sizes[-1] * 2)
        if sizes[-1] != top:
            sizes.append(top)
        return sizes

    def prefill_lengths(self) -> list[int]:
        top = min(self.max_prefill_tokens, self.max_num_batched_tokens, self.max_model_len - 4)
        lengths = [16]
        while lengths[-1] * 2 <= top:
            lengths.append(lengths[-1] * 2)
        if lengths[-1] != top and top > 16:
            lengths.append(top)
        return lengths


def design_workload(spec: WorkloadSpec) -> tuple[Phase, ...]:
    """The phases, in the order they run.

    - ``prefill``: one user, prompts 16, 32, ... up to the step budget, 4 output tokens: each
      request meets an idle engine, so its TTFT is the front end plus one prefill step (the
      prefill cost per token and the front-end latency), and its next tokens are decode steps
      of one sequence.
    - ``decode-cN``: N requests at once with short prompts: after the prefills, N sequences
      decode together for ``num_output_tokens`` steps (the cost per running sequence).
    - ``decode-long-cN``: the same with long prompts at two batch sizes (the cost per KV
      token at equal batch sizes).
    """
    spec.validate()
    n_out = spec.num_output_tokens
    short = spec.short_prompt_tokens
    long_ = min(spec.long_prompt_tokens, spec.max_model_len - n_out)
    phases = [Phase("warmup", _burst("warmup", 2, short, 8), None, "first-request effects")]
    ladder = spec.prefill_lengths()
    prefill = tuple(TraceRequest(f"prefill-{p}-{k}", 0.0, p, 4)
                    for k in range(spec.num_repeats) for p in ladder)
    phases.append(Phase("prefill", prefill, 1, "prefill cost per token; front-end latency"))
    sizes = spec.batch_sizes()
    for c in sizes:
        phases.append(Phase(f"decode-c{c}", _burst(f"decode-c{c}", c, short, n_out), None,
                            f"decode steps of {c} sequences, short contexts"))
    if long_ > 2 * short:
        for c in sorted({sizes[len(sizes) // 2], sizes[-1]}):
            phases.append(Phase(f"decode-long-c{c}", _burst(f"decode-long-c{c}", c, long_, n_out),
                                None, f"decode steps of {c} sequences, {long_}-token contexts"))
    return tuple(phases)


def _burst(name: str, n: int, prompt: int, output: int) -> tuple[TraceRequest, ...]:
    return tuple(TraceRequest(f"{name}-{i}", 0.0, prompt, output) for i in range(n))


def phase_trace(phase: Phase) -> Trace:
    text = repr([(r.request_id, r.num_prompt_tokens, r.num_output_tokens)
                 for r in phase.requests])
    return Trace(requests=phase.requests, source=f"calibration:{phase.name}",
                 format="synthetic", digest=hashlib.sha256(text.encode()).hexdigest())


def samples_from_phase(phase: Phase, timelines: Sequence[RequestTimeline]) -> list[StepSample]:
    """What a finished phase contributes to the fit."""
    out = decode_step_samples(timelines, phase=phase.name)
    if phase.first_token_samples:
        out += first_token_samples(timelines, phase=phase.name)
    return out


# ---------------------------------------------------------------- the live engine


@contextlib.contextmanager
def serving(
    engine: str,
    knobs: Knobs,
    *,
    model: str,
    served_model_name: str | None,
    url: str | None,
    log_dir: Path,
    allow_approximate: bool = False,
    engine_env: Mapping[str, str] | None = None,
    executable: str | None = None,
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
) -> Iterator[LaunchPlan]:
    """A server for several replays: launched with ``knobs`` (and torn down after, however the
    block ends), or attached at ``url`` (its own configuration applies; ``knobs`` then only
    describe it). Yields the launch plan; ``plan.base_url`` is where it listens."""
    plan = plan_for(engine, knobs, launch=url is None, url=url,
                    allow_approximate=allow_approximate or url is not None, model=model,
                    served_model_name=served_model_name, engine_env=engine_env,
                    executable=executable)
    if not plan.launch:
        _wait_healthy(plan.base_url + plan.health_path, ATTACH_READY_TIMEOUT_S)
        yield plan
        return
    log_dir.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(plan.resolved_argv(str(log_dir.resolve())), log_dir=log_dir,
                           name=f"{plan.engine}-server", env=plan.env, stop_argv=plan.stop_argv)
    with terminate_on_signals(), server:
        server.start()
        asyncio.run(server.wait_ready(plan.base_url + plan.health_path,
                                      timeout_s=ready_timeout_s))
        yield plan


def _wait_healthy(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        try:
            response = httpx.get(url, timeout=5.0, trust_env=False)
            if response.status_code == 200:
                return
            last = f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        if time.monotonic() >= deadline:
            raise EngineStartError(f"no ready server: {url} answered {last} for {timeout_s:.0f} s")
        time.sleep(0.5)


@dataclass(frozen=True, slots=True)
class KvCacheInfo:
    """The engine's KV cache as it reports it (vLLM: the ``cache_config_info`` metric)."""

    block_size: int
    num_blocks: int


def probe_kv_cache(base_url: str, path: str = "/metrics") -> KvCacheInfo | None:
    """Block size and block count from the engine's metrics; None when it does not say."""
    text = _get_text(base_url.rstrip("/") + path)
    if text is None:
        return None
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:
        return None
    for family in families:
        if not family.name.endswith("cache_config_info"):
            continue
        for sample in family.samples:
            labels = sample.labels
            blocks = labels.get("num_gpu_blocks") or labels.get("num_blocks")
            size = labels.get("block_size")
            if blocks and size and blocks.isdigit() and size.isdigit() and int(blocks) > 0:
                return KvCacheInfo(block_size=int(size), num_blocks=int(blocks))
    return None


def _get_text(url: str) -> str | None:
    try:
        response = httpx.get(url, timeout=10.0, trust_env=False)
    except httpx.HTTPError:
        return None
    return response.text if response.status_code == 200 else None


def _step_counter(plan: LaunchPlan) -> Callable[[], tuple[float, float] | None]:
    """Reads the engine's (steps, scheduled tokens) totals (vLLM's iteration_tokens_total
    histogram), or None when it has none: a cross-check of the steps found in the stream."""
    source = plan.telemetry.source("batch_tokens")

    def read() -> tuple[float, float] | None:
        if source is None or plan.telemetry.format != "prometheus":
            return None
        text = _get_text(plan.base_url.rstrip("/") + plan.telemetry.path)
        if text is None:
            return None
        samples = parse_exposition(text)
        for name in source.names:
            counts, sums = samples.get(name + "_count"), samples.get(name + "_sum")
            if counts and sums:
                return sum(counts), sum(sums)
        return None

    return read


@dataclass(frozen=True)
class PhaseResult:
    phase: Phase
    samples: list[StepSample]
    summary: dict[str, Any]
    wall_s: float
    num_engine_steps: float | None  # from telemetry, None when the engine does not export it

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.phase.name,
            "measures": self.phase.measures,
            "num_requests": len(self.phase.requests),
            "concurrency": self.phase.concurrency,
            "prompt_tokens": sorted({r.num_prompt_tokens for r in self.phase.requests}),
            "output_tokens": sorted({r.num_output_tokens for r in self.phase.requests}),
            "num_completed": self.summary.get("num_completed"),
            "num_samples": len(self.samples),
            "num_engine_steps": self.num_engine_steps,
            "wall_s": round(self.wall_s, 3),
        }


def run_phases(
    plan: LaunchPlan,
    phases: Sequence[Phase],
    out_dir: Path,
    *,
    tokenizer_path: str | None,
    log: Callable[[str], None] = print,
) -> list[PhaseResult]:
    """Replay each phase against the server, one after another; a folder per phase."""
    counter = _step_counter(plan)
    results = []
    for phase in phases:
        config = ReplayConfig(
            target_url=plan.base_url, protocol=plan.protocol,  # type: ignore[arg-type]
            model=plan.model, tokenizer_path=tokenizer_path,
            mode="closed" if phase.concurrency else "open", concurrency=phase.concurrency,
        )
        before = counter()
        start = time.perf_counter()
        summary = replay_sync(phase_trace(phase), config, out_dir / phase.name)
        wall = time.perf_counter() - start
        after = counter()
        steps = after[0] - before[0] if before is not None and after is not None else None
        failed = summary.get("num_failed") or 0
        if failed:
            raise CalibrationError(
                f"calibration phase {phase.name}: {failed} of {len(phase.requests)} requests "
                f"failed ({summary.get('failures')}); see {out_dir / phase.name}")
        timelines = read_timelines(out_dir / phase.name)
        samples = [] if phase.name == "warmup" else samples_from_phase(phase, timelines)
        results.append(PhaseResult(phase, samples, summary, wall, steps))
        log(f"  {phase.name:<18} {len(phase.requests):>3} requests  {wall:6.1f} s  "
            f"{len(samples):>3} samples")
    return results


class CalibrationError(RuntimeError):
    """The workload could not be measured (requests failed, nothing usable came back)."""


# ---------------------------------------------------------------- the profile

DEFAULT_DEVICE_WITHOUT_GPU = "cpu"
UNIDENTIFIED_BANDWIDTH = 1e12  # the top of the search: "no step was memory-bound"
_DTYPE_BYTES = {"float32": 4.0, "fp32": 4.0, "float": 4.0, "float16": 2.0, "half": 2.0,
                "fp16": 2.0, "bfloat16": 2.0, "bf16": 2.0}


def detect_device() -> str:
    """The local accelerator as a catalog name (``nvidia-smi``), else ``cpu``.

    Only meaningful when the engine runs on this machine; pass ``--device`` otherwise."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return DEFAULT_DEVICE_WITHOUT_GPU
    try:
        out = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return DEFAULT_DEVICE_WITHOUT_GPU
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return gpu_catalog_name(names[0]) if names else DEFAULT_DEVICE_WITHOUT_GPU


def gpu_catalog_name(nvidia_name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``h100-sxm``; unknown names are slugged as they are."""
    n = nvidia_name.lower()
    if "h200" in n:
        return "h200"
    if "h100" in n:
        return "h100-pcie" if "pcie" in n else "h100-sxm"
    if "a100" in n and "80" in n:
        return "a100-80gb"
    return "-".join(n.replace("nvidia", "").split())


def engine_dtype_bytes(knobs: Knobs) -> float | None:
    """Bytes per weight and KV element when ``extra_args`` set the engine's ``--dtype``
    (e.g. float32 on a CPU); None: the knobs' own dtypes apply."""
    args = list(knobs.extra_args)
    for i, arg in enumerate(args):
        value = None
        if arg == "--dtype" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--dtype="):
            value = arg.split("=", 1)[1]
        if value is not None:
            return _DTYPE_BYTES.get(value.lower())
    return None


def reference_config(reference_model: str, knobs: Knobs, device: str, *,
                     params: CostModelParams | None = None, profile: str | None = None,
                     kv: KvCacheInfo | None = None) -> ReferenceConfig:
    """The reference engine configured like the live one: the same knobs, the same KV cache
    (when the engine reported it), on ``device`` with ``params`` or a ``profile`` file (neither:
    placeholder figures, enough for the cost model's shape)."""
    catalog = device.lower() in GPUS
    if params is None and profile is None:
        dtype_b = engine_dtype_bytes(knobs)
        params = CostModelParams(
            device=None if catalog else device,
            memory_bytes=None if catalog else 1e12,
            hbm_bandwidth_bytes_per_s=None if catalog else 1e12,
            peak_bf16_flops=None if catalog else 1e12,
            weight_bytes_per_param=dtype_b, kv_bytes_per_element=dtype_b,
        )
    return ReferenceConfig(
        model=reference_model, gpu=device if catalog else None,
        tp=knobs.tensor_parallel_size, policy=knobs.policy, preemption=knobs.preemption,
        max_num_seqs=knobs.max_num_seqs, max_num_batched_tokens=knobs.max_num_batched_tokens,
        chunked_prefill=knobs.chunked_prefill,
        block_size=16 if kv is None else kv.block_size,
        num_gpu_blocks=None if kv is None else kv.num_blocks,
        gpu_memory_utilization=knobs.gpu_memory_utilization,
        weights_dtype=knobs.weights_dtype, kv_cache_dtype=knobs.kv_cache_dtype,
        max_model_len=knobs.max_model_len, prefix_caching=knobs.prefix_caching,
        profile=profile, cost_params=params,
    )


def search_ranges(config: ReferenceConfig, device: str
                  ) -> tuple[tuple[float, float], tuple[float, float], bool]:
    """Where the fit looks for the effective bandwidth and FLOP/s, and whether "no memory
    term" is allowed. A catalog GPU: up to its datasheet figures (efficiencies <= 1), and it
    is memory-bound in decode. Any other device: wide ranges."""
    if device.lower() in GPUS:
        gpu = config.gpu_spec
        return ((0.02 * gpu.hbm_bandwidth_bytes_per_s, gpu.hbm_bandwidth_bytes_per_s),
                (0.005 * gpu.peak_bf16_flops, gpu.peak_bf16_flops), False)
    return (1e9, UNIDENTIFIED_BANDWIDTH), (1e9, 1e15), True


def profile_params(fit: StepFit, config: ReferenceConfig, device: str,
                   kv: KvCacheInfo | None) -> tuple[dict[str, Any], list[str]]:
    """The fit as ``CostModelParams`` fields, and notes on what could not be identified."""
    notes: list[str] = []
    values: dict[str, Any] = {"device": device}
    c = fit.coefficients
    if device.lower() in GPUS:
        gpu = config.gpu_spec
        values["memory_efficiency"] = min(1.0, fit.memory_bytes_per_s
                                          / gpu.hbm_bandwidth_bytes_per_s)
        values["compute_efficiency"] = min(1.0, fit.compute_flops_per_s / gpu.peak_bf16_flops)
    else:
        bw = fit.memory_bytes_per_s
        if not math.isfinite(bw):
            bw = UNIDENTIFIED_BANDWIDTH
            notes.append("no measured step was memory-bound, so the memory bandwidth is not "
                         f"identified; hbm_bandwidth_bytes_per_s is the search's top ({bw:.0e})")
        values.update(memory_efficiency=1.0, compute_efficiency=1.0,
                      hbm_bandwidth_bytes_per_s=bw, peak_bf16_flops=fit.compute_flops_per_s,
                      activation_fixed_bytes=0.0)
    values.update(
        step_overhead_s=c["step_overhead_s"], per_seq_overhead_s=c["per_seq_overhead_s"],
        per_token_overhead_s=0.0, per_kv_token_overhead_s=c["per_kv_token_overhead_s"],
        frontend_latency_s=c["frontend_latency_s"],
    )
    dtype_b = engine_dtype_bytes_of(config)
    if dtype_b is not None:
        values.update(weight_bytes_per_param=dtype_b, kv_bytes_per_element=dtype_b)
    if device.lower() not in GPUS:
        values["memory_bytes"] = _device_memory_bytes(config, values, kv, notes)
    return values, notes


def engine_dtype_bytes_of(config: ReferenceConfig) -> float | None:
    return config.params.weight_bytes_per_param


def _device_memory_bytes(config: ReferenceConfig, values: Mapping[str, Any],
                         kv: KvCacheInfo | None, notes: list[str]) -> float:
    """Memory such that the reference's KV budget (weights, activations, the rest for KV, at
    the knobs' memory utilisation) leaves the KV cache the engine reported."""
    params = replace(config.params, **{k: v for k, v in values.items() if k != "device"},
                     device=values["device"], memory_bytes=1e15)
    cm = CostModel(config.model_spec, config.gpu_spec, params,
                   weights_dtype=config.weights_dtype, kv_cache_dtype=config.kv_cache_dtype,
                   tp=config.tp, block_size=config.block_size)
    if kv is not None:
        kv_bytes = (kv.num_blocks + 0.5) * kv.block_size * cm.kv_bytes_per_token
    else:
        kv_bytes = 4 * 2**30
        notes.append("the engine did not report its KV cache size; memory_bytes leaves 4 GiB "
                     "for KV")
    reserve = cm.activation_reserve_bytes(config.max_num_batched_tokens, config.max_num_seqs)
    return float((cm.weight_bytes + reserve + kv_bytes) / config.gpu_memory_utilization)


# ---------------------------------------------------------------- calibrate


@dataclass(frozen=True)
class CalibrationResult:
    profile: dict[str, Any]
    fit: StepFit
    phases: list[PhaseResult]
    samples: list[StepSample]
    kv: KvCacheInfo | None


def calibrate(
    plan: LaunchPlan,
    knobs: Knobs,
    *,
    reference_model: str,
    device: str,
    out_path: Path,
    work_dir: Path,
    spec: WorkloadSpec | None = None,
    tokenizer_path: str | None = None,
    command: Sequence[str] | None = None,
    log: Callable[[str], None] = print,
) -> CalibrationResult:
    """Run the workload against the server ``plan`` describes, fit, and write the profile.

    ``knobs`` are the server's (launched with them, or declared for an attached server);
    ``reference_model`` is the model's shape for the cost model (a catalog name or a local
    config.json); ``device`` names the hardware (a catalog GPU keeps its datasheet figures
    and gets efficiencies; anything else is described by effective figures). The phases'
    run folders and ``samples.parquet`` go to ``work_dir``.
    """
    kv = probe_kv_cache(plan.base_url)
    version = asyncio.run(probe_version(plan.base_url, plan.version_paths)).get("version")
    config = reference_config(reference_model, knobs, device, kv=kv)
    if spec is None:
        spec = WorkloadSpec(max_num_seqs=knobs.max_num_seqs,
                            max_num_batched_tokens=knobs.max_num_batched_tokens,
                            max_model_len=config.resolved_max_model_len)
    phases = design_workload(spec)
    log(f"calibrating {plan.engine} {version or '(version unknown)'} at {plan.base_url} on "
        f"{device}: {len(phases)} phases, "
        f"{sum(len(p.requests) for p in phases)} requests")
    started = time.perf_counter()
    results = run_phases(plan, phases, work_dir, tokenizer_path=tokenizer_path, log=log)
    engine_s = time.perf_counter() - started
    samples = [s for r in results for s in r.samples]
    write_parquet_atomic(samples_table(samples), work_dir / SAMPLES_FILE)

    shape = CostShape.of(config.cost_model())
    bw_range, compute_range, no_memory_term = search_ranges(config, device)
    fit = fit_step_model(samples, shape, bandwidth_range=bw_range, compute_range=compute_range,
                         allow_no_memory_term=no_memory_term)
    values, notes = profile_params(fit, config, device, kv)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    profile: dict[str, Any] = {
        **values,
        "source": f"batchlab calibrate: {plan.engine} {version or ''} on {device}, "
                  f"model {reference_model}, {created}".replace("  ", " "),
        "metadata": {
            "created_at": created,
            "batchlab_version": batchlab_version(),
            "command": list(command) if command is not None else None,
            "engine": {
                "name": plan.engine, "version": version, "base_url": plan.base_url,
                "launched": plan.launch, "model": plan.model,
                "block_size": None if kv is None else kv.block_size,
                "num_kv_blocks": None if kv is None else kv.num_blocks,
            },
            "knobs": _jsonable(knobs.as_dict()),
            "reference_model": reference_model,
            "device": device,
            "host": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                     "load_average": _load_average()},
            "fit": fit.as_dict(),
            "notes": notes,
            "workload": [r.as_dict() for r in results],
            "engine_time_s": round(engine_s, 3),
            "work_dir": str(work_dir),
        },
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(profile, out_path)
    try:  # the profile must load as the reference engine will load it
        reference_config(reference_model, knobs, device, profile=str(out_path), kv=kv)
    except ValueError as exc:
        raise CalibrationError(f"{out_path}: the fitted profile does not load: {exc}") from None
    return CalibrationResult(profile, fit, results, samples, kv)


SAMPLES_FILE = "samples.parquet"


def samples_table(samples: Sequence[StepSample]) -> pa.Table:
    return pa.table({
        "phase": pa.array([s.phase for s in samples], pa.string()),
        "duration_s": pa.array([s.duration_s for s in samples], pa.float64()),
        "num_seqs": pa.array([s.num_seqs for s in samples], pa.int64()),
        "num_tokens": pa.array([s.num_tokens for s in samples], pa.int64()),
        "num_kv_tokens": pa.array([s.num_kv_tokens for s in samples], pa.int64()),
        "num_attention_pairs": pa.array([s.num_attention_pairs for s in samples], pa.int64()),
        "includes_frontend": pa.array([s.includes_frontend for s in samples], pa.bool_()),
    })


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
