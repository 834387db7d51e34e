"""Calibrate the reference engine's cost model against a live engine.

``batchlab calibrate`` runs a short designed workload against a real server, measures engine
step times from the streamed token timestamps, fits the cost model's coefficients and writes a
profile (``adapters.reference.cost_model.load_profile`` reads it)::

    phases (one server, one after another)        what they isolate
      pilot         the prefill ladder, 1 user    nothing (warm-up; times the next phase)
      prefill       prompts 16..L, one at a time  prefill cost per token, front-end latency
      decode-cN     N requests at once, short     step cost per running sequence
      decode-long-cN  N at once, long prompts     step cost per KV token
           │
           ▼  token timestamps of all requests of a phase, clustered into engine steps
    StepSample(duration_s, num_seqs, num_tokens, num_kv_tokens, num_attention_pairs, ...)
           │
           ▼  weighted non-negative least squares inside a grid search (fit_step_model)
    step_s = max(bytes / B, flops / F) + step_overhead + per_seq·seqs + per_kv_token·kv
             + per_attention_pair·pairs
    ttft_s = frontend_latency + step_s(the prefill step)          (on an idle engine)
           │
           ▼
    PROFILE.json: CostModelParams fields (+ "metadata": the fit, its residuals, the workload)

Why token timestamps work: a running request gets exactly one token per engine step (vLLM V1,
TGI, TensorRT-LLM all stream each step's token as soon as the step ends), so the tokens of all
running requests arrive together, one cluster per step, and the gap between a request's
consecutive tokens is one step's duration. A span of steps is used only when everything it
computed is visible: the same members throughout, each advanced by the same number of tokens,
and no request waiting for its first token (an unseen prefill chunk could hide in it).
docs/cost-model.md ("Calibration") describes the method and its limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
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
from harness.manifest import jsonable
from harness.replay import ReplayConfig, batchlab_version, replay_sync
from harness.results import read_timelines, write_json_atomic, write_parquet_atomic
from harness.telemetry import (
    DEFAULT_INTERVAL_S,
    TELEMETRY_FILE,
    TelemetryScraper,
    parse_exposition,
    source_for,
)
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

    duration_s: float  # of one step (the mean, over ``num_steps`` steps)
    num_seqs: int
    num_tokens: int
    num_kv_tokens: float  # sum over scheduled requests of (computed + new) tokens
    num_attention_pairs: float  # causal (query, key) pairs
    includes_frontend: bool = False
    phase: str = ""
    num_steps: int = 1  # consecutive steps this sample averages (the fit weighs it so)


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
            per_kv_token_overhead_s=0.0, per_attention_pair_overhead_s=0.0),
            weights_dtype=cm.weights_dtype,
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
    """Pure decode steps, timed between clusters of tokens that were delivered on time.

    Chunks of all requests are sorted and cut into clusters where consecutive instants are
    more than ``threshold_s`` apart (default: 0.3 x the median token gap): each cluster is one
    step's output. A cluster is *on time* when each of its chunks carries one token and the
    gaps on both sides are at least half the median gap: a server that fell behind (rendering
    /metrics, say) delivers several steps' tokens late and in a lump, and the cluster next to
    such a lump is not an instant to time anything from.

    Between two on-time clusters with the same members, each of them advanced by the same
    number of tokens D >= 1, and no other request in flight (a request waiting for its first
    token may have had an unseen prefill chunk in those steps), the engine ran D pure decode
    steps of those members. That span is one sample: its mean step duration (median over the
    members), ``num_steps`` D, and the KV tokens of the average step.
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
    times = np.array([np.median([c.t_s for c in cl]) for cl in clusters])
    gaps = np.diff(times)
    short = 0.5 * float(np.median(gaps)) if gaps.size else 0.0

    def on_time(k: int) -> bool:
        cl = clusters[k]
        return (all(c.num_tokens == 1 for c in cl)
                and len({c.request_index for c in cl}) == len(cl)
                and (k == 0 or gaps[k - 1] >= short)
                and (k == len(clusters) - 1 or gaps[k] >= short))

    spans = [(tl.start_s, tl.chunk_times_s[-1]) for tl in timelines]
    out: list[StepSample] = []
    anchor: dict[int, _Chunk] | None = None
    t_anchor = 0.0
    for k, cluster in enumerate(clusters):
        if not on_time(k):
            continue
        members = {c.request_index: c for c in cluster}
        t_k = float(times[k])
        if anchor is not None and set(anchor) == set(members):
            advanced = {c.last_token_index - anchor[i].last_token_index
                        for i, c in members.items()}
            others = any(i not in members and start < t_k + tau and end > t_anchor - tau
                         for i, (start, end) in enumerate(spans))
            if len(advanced) == 1 and (d := advanced.pop()) >= 1 and not others:
                durations = [c.t_s - anchor[i].t_s for i, c in members.items()]
                # KV of the average step: request i holds prompt + j tokens at the step that
                # produces its token j, for j = anchor's + 1 .. this cluster's
                kv = sum(timelines[i].num_prompt_tokens
                         + (anchor[i].last_token_index + 1 + c.last_token_index) / 2
                         for i, c in members.items())
                out.append(StepSample(
                    duration_s=float(np.median(durations)) / d, num_seqs=len(members),
                    num_tokens=len(members), num_kv_tokens=kv, num_attention_pairs=kv,
                    phase=phase, num_steps=d,
                ))
        anchor, t_anchor = members, t_k
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
    the best of them is the optimum. Solved on the normal equations of unit-norm columns:
    2^n tiny systems, fast enough to sit inside the grid search.
    """
    n = a.shape[1]
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    an = a / norms
    gram = an.T @ an
    rhs = an.T @ y
    yy = float(y @ y)
    best = np.zeros(n)
    best_sse = yy
    for idx, block in _subsets(n):
        try:
            coef = np.linalg.solve(gram[block], rhs[idx])
        except np.linalg.LinAlgError:
            continue
        if coef.min() < 0:
            continue
        sse = yy - float(coef @ rhs[idx])  # at the least-squares optimum of the subset
        if sse < best_sse - 1e-15 * yy:
            best_sse = sse
            best = np.zeros(n)
            best[idx] = coef
    return best / norms


@functools.cache
def _subsets(n: int) -> tuple[tuple[np.ndarray, tuple[np.ndarray, ...]], ...]:
    """Every non-empty subset of ``range(n)``: its indices and its ``np.ix_`` block."""
    out = []
    for size in range(1, n + 1):
        for cols in itertools.combinations(range(n), size):
            idx = np.array(cols)
            out.append((idx, np.ix_(idx, idx)))
    return tuple(out)


# The linear part of the model: one coefficient per column of _Design.x.
LINEAR_TERMS = ("step_overhead_s", "per_seq_overhead_s", "per_kv_token_overhead_s",
                "per_attention_pair_overhead_s", "frontend_latency_s")
_ATTENTION_TERMS = ("per_kv_token_overhead_s", "per_attention_pair_overhead_s")
# A finite memory bandwidth must cut the weighted squared error by this much to be kept.
MEMORY_TERM_MIN_GAIN = 0.05


@dataclass(frozen=True)
class StepFit:
    """A fitted step-time model: the roofline's two effective figures, then linear overheads.

        step_s = max(bytes / memory_bytes_per_s, flops / compute_flops_per_s)
                 + step_overhead_s + per_seq_overhead_s * seqs + per_kv_token_overhead_s * kv
                 + per_attention_pair_overhead_s * pairs
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
        return _Design.of(shape, samples).predict(self.memory_bytes_per_s,
                                                  self.compute_flops_per_s, coef)

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


@dataclass(frozen=True, slots=True)
class FitSpace:
    """Where the fit looks. ``fit_space(config, device)`` picks it per device.

    A catalog GPU keeps its datasheet figures as upper bounds (efficiencies <= 1), always
    has a memory term (decode is memory-bound) and no attention overheads: KV reads are in
    the memory term and attention FLOPs in the compute term, and extra KV or pair
    coefficients would trade off against the bandwidth. Any other device (a CPU) gets wide
    ranges, may have no memory term at all, and gets the per-KV-token and per-pair overheads
    its attention kernels need (they run far below its matmul rate).
    """

    bandwidth_range: tuple[float, float] = (1e9, 1e12)  # effective bytes/s
    compute_range: tuple[float, float] = (1e9, 1e15)  # effective FLOP/s
    allow_no_memory_term: bool = True
    attention_overheads: bool = True  # per-KV-token and per-pair terms


@dataclass(frozen=True)
class _Design:
    """The samples as arrays: what the two figures divide, and the linear features."""

    memory_bytes: np.ndarray
    flops: np.ndarray
    fixed_s: np.ndarray  # the cost model's own all-reduce terms
    x: np.ndarray  # columns: LINEAR_TERMS

    @classmethod
    def of(cls, shape: CostShape, samples: Sequence[StepSample]) -> _Design:
        return cls(
            memory_bytes=np.array([shape.memory_bytes(s) for s in samples], dtype=np.float64),
            flops=np.array([shape.flops(s) for s in samples], dtype=np.float64),
            fixed_s=np.array([shape.fixed(s) for s in samples], dtype=np.float64),
            x=np.array([[1.0, s.num_seqs, s.num_kv_tokens, s.num_attention_pairs,
                         float(s.includes_frontend)]
                        for s in samples], dtype=np.float64).reshape(-1, len(LINEAR_TERMS)),
        )

    def subset(self, keep: np.ndarray) -> _Design:
        return _Design(self.memory_bytes[keep], self.flops[keep], self.fixed_s[keep],
                       self.x[keep])

    def given(self, bw: float, peak: float) -> np.ndarray:
        return np.maximum(self.memory_bytes / bw, self.flops / peak) + self.fixed_s

    def predict(self, bw: float, peak: float, coef: np.ndarray) -> np.ndarray:
        return self.given(bw, peak) + self.x @ coef

    def solve(self, y: np.ndarray, w: np.ndarray, bw: float, peak: float,
              columns: np.ndarray) -> tuple[float, np.ndarray]:
        """The best non-negative linear terms (only ``columns``) for these two figures, and
        the weighted SSE."""
        target = y - self.given(bw, peak)
        coef = np.zeros(len(LINEAR_TERMS))
        coef[columns] = nnls(self.x[:, columns] * w[:, None], target * w)
        r = (target - self.x @ coef) * w
        return float(r @ r), coef


_Best = tuple[float, float, float, np.ndarray]  # (weighted SSE, bandwidth, FLOP/s, linear)


def _grid_search(d: _Design, y: np.ndarray, w: np.ndarray, space: FitSpace,
                 no_memory_term: bool) -> _Best:
    """A log-spaced grid over the two figures, then two finer grids around the best point."""
    best: _Best = (math.inf, math.inf, math.inf, np.zeros(len(LINEAR_TERMS)))
    columns = np.array([t not in _ATTENTION_TERMS or space.attention_overheads
                        for t in LINEAR_TERMS])
    bandwidth_range, compute_range = space.bandwidth_range, space.compute_range

    def scan(bws: Sequence[float], peaks: Sequence[float]) -> None:
        nonlocal best
        for bw in bws:
            for peak in peaks:
                sse, coef = d.solve(y, w, bw, peak, columns)
                if sse < best[0]:
                    best = (sse, bw, peak, coef)

    def around(value: float, lo: float, hi: float, factor: float) -> list[float]:
        if math.isinf(value):
            return [math.inf]
        return list(np.geomspace(max(lo, value / factor), min(hi, value * factor), 9))

    scan([math.inf] if no_memory_term else list(np.geomspace(*bandwidth_range, 13)),
         list(np.geomspace(*compute_range, 19)))
    for factor in _REFINE_FACTORS:
        _, bw0, peak0, _ = best
        scan(around(bw0, *bandwidth_range, factor), around(peak0, *compute_range, factor))
    return best


# Each finer grid spans best / f .. best * f; the coarse grid's steps are about 1.8x (13
# bandwidths over 1e9..1e12), so the first span covers a step; the last pins 0.1%.
_REFINE_FACTORS = (2.0, 1.3, 1.08, 1.02, 1.005)


def _search(d: _Design, y: np.ndarray, w: np.ndarray, space: FitSpace) -> _Best:
    """The best fit; with ``allow_no_memory_term`` a finite bandwidth must earn its place
    (``MEMORY_TERM_MIN_GAIN``): otherwise a memory floor (weights / bandwidth) and the fixed
    overhead trade off against each other and the split between them is noise."""
    finite = _grid_search(d, y, w, space, False)
    if not space.allow_no_memory_term:
        return finite
    none = _grid_search(d, y, w, space, True)
    return finite if finite[0] < (1 - MEMORY_TERM_MIN_GAIN) * none[0] else none


def _group_weights(samples: Sequence[StepSample], scale: np.ndarray) -> np.ndarray:
    """Relative errors (1 / the expected duration) count; first-token samples weigh as much in
    total as the steps, because they are few and alone pin the prefill cost and front end."""
    w = np.sqrt([s.num_steps for s in samples]) / np.maximum(scale, 1e-9)
    front = np.array([s.includes_frontend for s in samples])
    if front.any() and (~front).any():
        w[front] *= math.sqrt((~front).sum() / front.sum())
    return w


def fit_step_model(
    samples: Sequence[StepSample],
    shape: CostShape,
    space: FitSpace = FitSpace(),
    *,
    outlier_mads: float = 10.0,
) -> StepFit:
    """Fit the step-time model (``StepFit``) to measured samples.

    Weighted least squares on relative errors, reweighted once by the prediction (weights of
    1/measured would favour samples that came out short), so the fit follows mean step times,
    which is what TPOT averages. Linear terms non-negative; the two roofline figures by grid
    search within ``space`` (``fit_space``: a catalog GPU's datasheet figures bound them, so
    efficiencies stay <= 1). Samples further than ``outlier_mads`` median absolute
    deviations from the fit (a step glued to an unrelated stall) are left out of the last
    solve, and counted.
    """
    if len(samples) < len(LINEAR_TERMS) + 2:
        raise ValueError(f"calibration: only {len(samples)} usable step samples; need at least "
                         f"{len(LINEAR_TERMS) + 2} (did the workload's requests fail?)")
    if not any(s.includes_frontend for s in samples):
        raise ValueError("calibration: no first-token sample (a request sent to an idle "
                         "engine); the prefill phase is missing or failed")
    samples = list(samples)
    design = _Design.of(shape, samples)
    y = np.array([s.duration_s for s in samples])
    kept = np.ones(len(samples), dtype=bool)
    scale = y.copy()
    best: _Best = (math.inf, math.inf, math.inf, np.zeros(len(LINEAR_TERMS)))
    for rnd in range(3):  # weights 1/y; 1/prediction; 1/prediction without outliers
        sub = [s for s, k in zip(samples, kept, strict=True) if k]
        best = _search(design.subset(kept), y[kept], _group_weights(sub, scale[kept]), space)
        pred = design.predict(best[1], best[2], best[3])
        scale = np.maximum(pred, 1e-9)
        if rnd == 1:
            rel = (y - pred) / scale
            centre = float(np.median(rel))
            mad = float(np.median(np.abs(rel - centre))) or 1e-9
            kept = np.abs(rel - centre) <= outlier_mads * 1.4826 * mad
    _, bw, peak, coef = best
    rel = np.abs(design.predict(bw, peak, coef) - y) / np.maximum(y, 1e-9)
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


# Every request is sent at least this long after the replay's warm-up request and after the
# previous response on the connection: a keep-alive connection reused within ~40 ms of the
# previous exchange stalls the next response by ~40 ms (measured on uvicorn servers, vLLM's
# and the served reference's alike), which would pass for front-end latency.
SEND_GAP_S = 0.1


@dataclass(frozen=True, slots=True)
class Phase:
    """One part of the calibration workload, replayed on its own against the same server.

    Open loop: requests are sent at their ``arrival_s``. A phase with ``spaced_by`` gets its
    arrivals after that (earlier) phase ran: one request at a time, each sent once the
    previous one has surely finished (``space_arrivals``), so each meets an idle engine.
    """

    name: str
    requests: tuple[TraceRequest, ...]
    measures: str  # what it isolates, for the profile's metadata
    concurrency: int | None = None  # closed loop with this many users (None: open loop)
    spaced_by: str | None = None  # the phase whose durations space this one's arrivals
    first_token_samples: bool = False  # its TTFTs are idle-engine samples
    steps_used: bool = True  # its decode steps are samples


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
    num_repeats: int = 3  # of each prefill length (first-token samples are noisy)

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

    - ``pilot``: the prefill ladder once, one user: warms the engine up and times each
      length, to space the next phase (its own numbers are not used).
    - ``prefill``: the ladder (prompts 16, 32, ... up to the step budget) 3 times, 4 output
      tokens, one request at a time on an idle engine: its TTFT is the front end plus one
      prefill step (the prefill cost per token, the front-end latency); its next tokens are
      decode steps of one sequence.
    - ``decode-cN``: N requests at once with short prompts: after their prefills, N sequences
      decode together for ``num_output_tokens`` steps (the cost per running sequence).
    - ``decode-long-cN``: the same with long prompts at two batch sizes (the cost per KV
      token at equal batch sizes).
    """
    spec.validate()
    n_out = spec.num_output_tokens
    short = spec.short_prompt_tokens
    long_ = min(spec.long_prompt_tokens, spec.max_model_len - n_out)
    ladder = spec.prefill_lengths()
    pilot = tuple(TraceRequest(f"pilot-{p}", 0.0, p, 4) for p in ladder)
    prefill = tuple(TraceRequest(f"prefill-{p}-{k}", 0.0, p, 4)
                    for k in range(spec.num_repeats) for p in ladder)
    phases = [
        Phase("pilot", pilot, "warm-up; times the prefill phase's requests", concurrency=1,
              steps_used=False),
        Phase("prefill", prefill, "prefill cost per token; front-end latency",
              spaced_by="pilot", first_token_samples=True),
    ]
    sizes = spec.batch_sizes()
    for c in sizes:
        phases.append(Phase(f"decode-c{c}", _burst(f"decode-c{c}", c, short, n_out),
                            f"decode steps of {c} sequences, short contexts"))
    if long_ > 2 * short:
        for c in sorted({sizes[len(sizes) // 2], sizes[-1]}):
            phases.append(Phase(f"decode-long-c{c}", _burst(f"decode-long-c{c}", c, long_, n_out),
                                f"decode steps of {c} sequences, {long_}-token contexts"))
    return tuple(phases)


def _burst(name: str, n: int, prompt: int, output: int) -> tuple[TraceRequest, ...]:
    return tuple(TraceRequest(f"{name}-{i}", SEND_GAP_S, prompt, output) for i in range(n))


def space_arrivals(phase: Phase, timed: Sequence[RequestTimeline]) -> Phase:
    """``phase`` with one request at a time: each sent 1.5x its prompt length's longest
    end-to-end time in ``timed`` (plus ``SEND_GAP_S``) after the previous one, so that the
    previous one has finished (the engine is idle) and its connection has rested."""
    e2e: dict[int, float] = {}
    for tl in timed:
        if tl.ok:
            e2e[tl.num_prompt_tokens] = max(e2e.get(tl.num_prompt_tokens, 0.0), tl.e2e_s())
    fallback = max(e2e.values(), default=1.0)
    t = SEND_GAP_S
    spaced = []
    for r in phase.requests:
        spaced.append(replace(r, arrival_s=t))
        t += 1.5 * e2e.get(r.num_prompt_tokens, fallback) + SEND_GAP_S
    return replace(phase, requests=tuple(spaced))


def phase_trace(phase: Phase) -> Trace:
    text = repr([(r.request_id, r.num_prompt_tokens, r.num_output_tokens)
                 for r in phase.requests])
    return Trace(requests=phase.requests, source=f"calibration:{phase.name}",
                 format="synthetic", digest=hashlib.sha256(text.encode()).hexdigest())


def samples_from_phase(phase: Phase, timelines: Sequence[RequestTimeline]) -> list[StepSample]:
    """What a finished phase contributes to the fit."""
    out = decode_step_samples(timelines, phase=phase.name) if phase.steps_used else []
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
    return None if text is None else kv_cache_from_metrics(text)


def kv_cache_from_metrics(text: str) -> KvCacheInfo | None:
    """vLLM's ``vllm:cache_config_info`` gauge carries the cache configuration as labels."""
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:
        return None
    for family in families:
        if not family.name.endswith("cache_config_info"):
            continue
        for sample in family.samples:
            labels = sample.labels
            blocks = labels.get("num_gpu_blocks") or labels.get("num_blocks") or ""
            size = labels.get("block_size") or ""
            if blocks.isdigit() and size.isdigit() and int(blocks) > 0 and int(size) > 0:
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
            "mean_decode_step_s": self.mean_decode_step_s,
            "wall_s": round(self.wall_s, 3),
        }

    @property
    def mean_decode_step_s(self) -> float | None:
        """Mean duration of the phase's measured decode steps (its speed, for probes)."""
        steps = [s for s in self.samples if not s.includes_frontend]
        total = sum(s.num_steps for s in steps)
        return sum(s.duration_s * s.num_steps for s in steps) / total if total else None


def run_phases(
    plan: LaunchPlan,
    phases: Sequence[Phase],
    out_dir: Path,
    *,
    tokenizer_path: str | None,
    telemetry_interval_s: float | None = DEFAULT_INTERVAL_S,
    log: Callable[[str], None] = print,
) -> list[PhaseResult]:
    """Replay each phase against the server, one after another; a folder per phase.

    The engine's metrics are scraped during each phase as a live run scrapes them (every
    ``telemetry_interval_s``; None: not at all): on a CPU, rendering vLLM's /metrics takes
    ~0.1 s of the server's time and slows its steps by several percent at 4 Hz, and the
    profile must describe the engine as ``validate`` and ``replay --engine`` will measure it.
    """
    counter = _step_counter(plan)
    results: list[PhaseResult] = []
    timed: dict[str, list[RequestTimeline]] = {}
    for phase in phases:
        if phase.spaced_by is not None:
            phase = space_arrivals(phase, timed.get(phase.spaced_by, []))
        config = ReplayConfig(
            target_url=plan.base_url, protocol=plan.protocol,  # type: ignore[arg-type]
            model=plan.model, tokenizer_path=tokenizer_path,
            mode="closed" if phase.concurrency else "open", concurrency=phase.concurrency,
        )
        before = counter()
        start = time.perf_counter()
        scraper = None if telemetry_interval_s is None else TelemetryScraper(
            source_for(plan.telemetry, plan.base_url), out_dir / phase.name / TELEMETRY_FILE,
            interval_s=telemetry_interval_s)
        summary = replay_sync(phase_trace(phase), config, out_dir / phase.name,
                              telemetry=scraper)
        wall = time.perf_counter() - start
        after = counter()
        steps = after[0] - before[0] if before is not None and after is not None else None
        failed = summary.get("num_failed") or 0
        if failed:
            raise CalibrationError(
                f"calibration phase {phase.name}: {failed} of {len(phase.requests)} requests "
                f"failed ({summary.get('failures')}); see {out_dir / phase.name}")
        timelines = read_timelines(out_dir / phase.name)
        timed[phase.name] = timelines
        samples = samples_from_phase(phase, timelines)
        results.append(PhaseResult(phase, samples, summary, wall, steps))
        log(f"  {phase.name:<18} {len(phase.requests):>3} requests  {wall:6.1f} s  "
            f"{len(samples):>3} samples")
    return results


def speed_probe(plan: LaunchPlan, reference: Mapping[str, Any], out_dir: Path, *,
                tokenizer_path: str | None,
                telemetry_interval_s: float | None = DEFAULT_INTERVAL_S) -> float | None:
    """How much slower (+) or faster (-) the engine runs now than when it was calibrated.

    ``reference`` is a decode phase of the profile's workload (``metadata.workload``); the
    same burst runs again and its mean decode step is compared with the one measured then.
    A machine whose speed drifts (neighbours on a shared host) shows here, apart from any
    error of the model. None when the reference has no figure or the burst no usable step.
    """
    then = reference.get("mean_decode_step_s")
    prompts, outputs = reference.get("prompt_tokens") or [], reference.get("output_tokens") or []
    n = reference.get("num_requests")
    if not then or len(prompts) != 1 or len(outputs) != 1 or not isinstance(n, int):
        return None
    phase = Phase("probe", _burst("probe", n, int(prompts[0]), int(outputs[0])),
                  "the engine's speed, now")
    (result,) = run_phases(plan, [phase], out_dir, tokenizer_path=tokenizer_path,
                           telemetry_interval_s=telemetry_interval_s, log=lambda _: None)
    now = result.mean_decode_step_s
    return None if now is None else now / float(then) - 1.0


def probe_reference(workload: Sequence[Mapping[str, Any]], max_num_seqs: int
                    ) -> Mapping[str, Any] | None:
    """The calibration phase a speed probe repeats: the short-context burst of 4 (or fewer)."""
    bursts = [w for w in workload if str(w.get("name", "")).startswith("decode-c")
              and isinstance(w.get("num_requests"), int) and w["num_requests"] <= max_num_seqs]
    if not bursts:
        return None
    return min(bursts, key=lambda w: abs(int(w["num_requests"]) - 4))


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


def fit_space(config: ReferenceConfig, device: str) -> FitSpace:
    """Where the fit looks for ``device`` (see ``FitSpace``)."""
    if device.lower() in GPUS:
        gpu = config.gpu_spec
        return FitSpace(
            bandwidth_range=(0.02 * gpu.hbm_bandwidth_bytes_per_s, gpu.hbm_bandwidth_bytes_per_s),
            compute_range=(0.005 * gpu.peak_bf16_flops, gpu.peak_bf16_flops),
            allow_no_memory_term=False, attention_overheads=False)
    return FitSpace(bandwidth_range=(1e9, UNIDENTIFIED_BANDWIDTH))


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
        per_attention_pair_overhead_s=c["per_attention_pair_overhead_s"],
        frontend_latency_s=c["frontend_latency_s"],
    )
    dtype_b = config.params.weight_bytes_per_param  # set from the engine's --dtype
    if dtype_b is not None:
        values.update(weight_bytes_per_param=dtype_b, kv_bytes_per_element=dtype_b)
    if device.lower() not in GPUS:
        values["memory_bytes"] = _device_memory_bytes(config, values, kv, notes)
    return values, notes


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
    telemetry_interval_s: float | None = DEFAULT_INTERVAL_S,
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
    results = run_phases(plan, phases, work_dir, tokenizer_path=tokenizer_path,
                         telemetry_interval_s=telemetry_interval_s, log=log)
    engine_s = time.perf_counter() - started
    samples = [s for r in results for s in r.samples]
    write_parquet_atomic(samples_table(samples), work_dir / SAMPLES_FILE)

    shape = CostShape.of(config.cost_model())
    fit = fit_step_model(samples, shape, fit_space(config, device))
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
            "knobs": jsonable(knobs.as_dict()),
            "reference_model": reference_model,
            "device": device,
            "host": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                     "load_average": _load_average()},
            "fit": fit.as_dict(),
            "notes": notes,
            "workload": [r.as_dict() for r in results],
            "telemetry_interval_s": telemetry_interval_s,
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
        "num_kv_tokens": pa.array([s.num_kv_tokens for s in samples], pa.float64()),
        "num_attention_pairs": pa.array([s.num_attention_pairs for s in samples], pa.float64()),
        "includes_frontend": pa.array([s.includes_frontend for s in samples], pa.bool_()),
        "num_steps": pa.array([s.num_steps for s in samples], pa.int64()),
    })



def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
