"""The step-time model and its fit to measured step samples (pure numpy, no I/O)."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from adapters.reference.cost_model import CostModel


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
# The least spread of relative errors the outlier rule assumes (1%), however well the fit
# matches the other samples: with the default 10 spreads, a sample within 10% of the fit is
# never an outlier. Noise-free steps (a simulated engine) leave a median absolute deviation
# of rounding, and without a floor the rule would drop samples merely a millionth off (the
# few first-token samples, and with them the prefill and front-end terms they alone pin).
OUTLIER_MIN_SPREAD = 0.01
# Fits without the outliers, each judging every sample again, before the outliers are taken as
# found (the same samples left out twice in a row ends it sooner).
OUTLIER_ROUNDS = 4


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
    # samples (outliers left out) whose step the fit makes compute-bound: with none, the
    # compute figure is not identified by anything measured (a fit's guess)
    num_compute_bound: int | None = None

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
            "num_compute_bound": self.num_compute_bound,
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

    # Effective bytes/s and FLOP/s: from a slow CPU to beyond today's fastest accelerators
    # (H200 4.8 TB/s and B200 8 TB/s of HBM; B200 2.25 PFLOP/s dense BF16).
    bandwidth_range: tuple[float, float] = (1e9, 3e13)
    compute_range: tuple[float, float] = (1e9, 1e16)
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

    scan([math.inf] if no_memory_term else _coarse(*bandwidth_range, 13),
         _coarse(*compute_range, 19))
    for factor in _REFINE_FACTORS:
        _, bw0, peak0, _ = best
        scan(around(bw0, *bandwidth_range, factor), around(peak0, *compute_range, factor))
    return best


# Each finer grid spans best / f .. best * f; the coarse grid's steps are at most
# _COARSE_STEP, so the first span covers a step either side; the last pins 0.1%.
_REFINE_FACTORS = (2.0, 1.3, 1.08, 1.02, 1.005)
_COARSE_STEP = 1.8


def _coarse(lo: float, hi: float, min_points: int) -> list[float]:
    """``min_points`` or more log-spaced values from ``lo`` to ``hi``, neighbours at most
    ``_COARSE_STEP`` apart however wide the range."""
    num = math.ceil(math.log(hi / lo) / math.log(_COARSE_STEP)) + 1
    return list(np.geomspace(lo, hi, max(min_points, num)))


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
    efficiencies stay <= 1). Samples whose relative error lies further from the median one
    than ``outlier_mads`` spreads (a step glued to an unrelated stall) are left out of the last
    solve, and counted; the spread is 1.4826 median absolute deviations (the standard deviation
    of normal errors), but at least ``OUTLIER_MIN_SPREAD`` (1%), so a sample within
    ``outlier_mads`` x 1% (10%) of the fit is kept however closely the rest match it. The
    samples are judged by the fit of all of them, then again by each fit without those
    dropped until the same ones are dropped (at most ``OUTLIER_ROUNDS`` times), so that
    samples an outlier pulled the first fit away from are kept.
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
    # weights 1/y; 1/prediction; then 1/prediction without outliers, every sample judged
    # again by each cleaner fit until the same ones are left out: good samples an outlier had
    # pulled the fit away from (a bad first-token sample drags the few others, which together
    # weigh as much as all decode steps) come back, and the last solve leaves out the
    # outliers alone
    for rnd in range(2 + OUTLIER_ROUNDS):
        sub = [s for s, k in zip(samples, kept, strict=True) if k]
        best = _search(design.subset(kept), y[kept], _group_weights(sub, scale[kept]), space)
        pred = design.predict(best[1], best[2], best[3])
        scale = np.maximum(pred, 1e-9)
        if rnd >= 1:
            rel = (y - pred) / scale
            centre = float(np.median(rel))
            spread = max(1.4826 * float(np.median(np.abs(rel - centre))), OUTLIER_MIN_SPREAD)
            judged = np.abs(rel - centre) <= outlier_mads * spread
            if rnd >= 2 and np.array_equal(judged, kept):
                break  # this fit leaves out the samples it was made without
            kept = judged
    else:  # still moving: the last judgement's samples, solved once more
        sub = [s for s, k in zip(samples, kept, strict=True) if k]
        best = _search(design.subset(kept), y[kept], _group_weights(sub, scale[kept]), space)
    _, bw, peak, coef = best
    rel = np.abs(design.predict(bw, peak, coef) - y) / np.maximum(y, 1e-9)
    compute_bound = design.flops / peak > design.memory_bytes / bw
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
        num_compute_bound=int((compute_bound & kept).sum()),
    )
