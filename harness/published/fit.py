"""Fit each engine profile's coefficients on published rows; hold whole sources out.

    training sources --> rows of profile <engine>-<gpu> --> freeze each (one simulation)
        --> Levenberg-Marquardt, then Nelder-Mead, on the frozen rows: minimise
            sum_i w_i rho(log(predicted_i / published_i)) + priors
            (soft-L1 rho: a row off by 2x cannot drag the fit alone)
        --> re-freeze at the new coefficients, three rounds (arrival-driven rows move a little)

The split is by source (``HELD_OUT_SOURCES``): no row of a held-out source is ever seen by the
fit, so the held-out error says how the profile does on a publisher's numbers it never saw.
A profile with no training rows takes the coefficients of a donor (``DONORS``) and says so.
No scipy: both optimisers below are plain textbook versions on a transformed, unbounded
vector (efficiencies through a logistic, overheads through exp).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from adapters.reference.cost_model import CostModelParams
from harness.published.frozen import FrozenRow, evaluate, freeze
from harness.published.profiles import EngineProfile
from harness.published.rows import PublishedRow

# Whole sources kept out of every fit (see harness/data/published/README.md for each).
HELD_OUT_SOURCES = (
    "trtllm-perf-v1.0",
    "vllm-blog-v0.6.0",
    "vllm-ci-perf-9515",
    "nim-llama-3.3-70b-1.8.0",
    "tgi-v3-overview",
)
# Profiles without training rows borrow the coefficients of the same engine on H100, or, for
# TGI (no training rows at all), vLLM's: both run FlashAttention/FlashInfer kernels.
DONORS = {
    "vllm-h200": "vllm-h100-sxm",
    "vllm-a100-80gb": "vllm-h100-sxm",
    "tgi-h100-sxm": "vllm-h100-sxm",
}


@dataclass(frozen=True)
class Coefficient:
    """One fitted field, how the unbounded optimiser variable maps onto it, and its prior.

    The prior is log-normal: ``((log(value) - log(prior)) / width) ** 2``, weighted by
    ``PRIOR_WEIGHT``. Widths say how far the published serving figures of the engines move
    these coefficients from the built-in values (docs/cost-model.md): efficiencies by tens of
    percent, overheads by up to an order of magnitude. Rows that pin a coefficient down outweigh
    its prior; rows that cannot (no TP rows, concurrency <= 8 only) leave it near the prior
    instead of letting it trade off against the others.
    """

    name: str
    low: float  # bounded fields: value = low + (high - low) * sigmoid(x)
    high: float
    scale: float  # unbounded (>= 0) fields: value = scale * exp(x); 0 for bounded ones
    prior: float
    width: float  # in natural-log units

    def value(self, x: float) -> float:
        if self.scale:
            return self.scale * math.exp(max(-30.0, min(30.0, x)))
        return self.low + (self.high - self.low) / (1.0 + math.exp(-max(-30.0, min(30.0, x))))

    def variable(self, value: float) -> float:
        if self.scale:
            return math.log(max(value, self.scale * 1e-3) / self.scale)
        frac = min(max((value - self.low) / (self.high - self.low), 1e-4), 1 - 1e-4)
        return math.log(frac / (1.0 - frac))

    def penalty(self, value: float) -> float:
        return ((math.log(max(value, 1e-30)) - math.log(self.prior)) / self.width) ** 2


COEFFICIENTS = {
    c.name: c for c in (
        Coefficient("memory_efficiency", 0.3, 1.0, 0.0, prior=0.8, width=0.15),
        Coefficient("compute_efficiency", 0.15, 1.0, 0.0, prior=0.6, width=0.3),
        Coefficient("step_overhead_s", 0.0, 0.0, 1e-3, prior=0.8e-3, width=1.0),
        Coefficient("per_seq_overhead_s", 0.0, 0.0, 1e-5, prior=5e-6, width=1.0),
        Coefficient("frontend_latency_s", 0.0, 0.0, 5e-3, prior=5e-3, width=1.5),
        Coefficient("allreduce_latency_s", 0.0, 0.0, 1e-5, prior=5e-6, width=1.5),
        Coefficient("per_fp8_kv_token_overhead_s", 0.0, 0.0, 1e-8, prior=1e-8, width=3.0),
    )
}
# A coefficient one prior width away costs as much as a 3% error on every row.
PRIOR_WEIGHT = 1e-3
LOSS_SCALE = 0.1  # soft-L1 turns from quadratic to linear at ~10% log error
VARIABLE_RANGE = 6.0  # |x| beyond this is fenced: efficiencies within 0.25% of a bound


@dataclass(frozen=True)
class FitResult:
    params: CostModelParams
    coefficients: tuple[str, ...]
    train_row_ids: tuple[str, ...]
    rounds: int
    loss: float


def split(rows: Sequence[PublishedRow]) -> tuple[list[PublishedRow], list[PublishedRow]]:
    """(training rows, held-out rows), by source."""
    train = [r for r in rows if r.source_id not in HELD_OUT_SOURCES]
    held = [r for r in rows if r.source_id in HELD_OUT_SOURCES]
    return train, held


def free_coefficients(rows: Sequence[PublishedRow]) -> tuple[str, ...]:
    """The coefficients the rows can determine (all-reduce needs tensor-parallel rows, the
    FP8-KV term FP8-KV rows)."""
    names = ["memory_efficiency", "compute_efficiency", "step_overhead_s", "per_seq_overhead_s"]
    if any(r.metric.startswith(("ttft", "e2e", "duration")) for r in rows):
        names.append("frontend_latency_s")
    if any(r.tensor_parallel_size > 1 for r in rows):
        names.append("allreduce_latency_s")
    if any(r.kv_cache_dtype == "fp8" for r in rows):
        names.append("per_fp8_kv_token_overhead_s")
    return tuple(names)


def row_weights(rows: Sequence[PublishedRow]) -> np.ndarray:
    """1/sqrt(n) per (source, metric) group, so one large table does not outvote the rest."""
    groups = Counter((r.source_id, r.metric) for r in rows)
    return np.array([1.0 / math.sqrt(groups[(r.source_id, r.metric)]) for r in rows])


def fit_profile(profile: EngineProfile, rows: Sequence[PublishedRow], *, rounds: int = 3,
                max_evals: int = 1500, restarts: int = 1, prior_weight: float = PRIOR_WEIGHT,
                log: Callable[[str], None] | None = None) -> FitResult:
    """Fit ``profile``'s coefficients on ``rows`` (its training rows)."""
    names = free_coefficients(rows)
    coefs = [COEFFICIENTS[n] for n in names]
    weights = row_weights(rows)
    params = profile.params
    loss = math.inf
    if not any(r.arrival == "rate" for r in rows):
        rounds = 1  # every request at t=0: the schedule does not depend on the coefficients
    for k in range(rounds):
        frozen = [freeze(r, profile, params) for r in rows]
        base = params

        def residuals(x: np.ndarray, frozen: list[FrozenRow] = frozen,
                      base: CostModelParams = base) -> np.ndarray:
            return _residuals(frozen, _apply(base, coefs, x), coefs, x, weights, prior_weight)

        def objective(x: np.ndarray) -> float:
            return float((residuals(x) ** 2).sum())

        starts = _starts(params, coefs) if k == 0 else _starts(params, coefs)[:1]
        # Levenberg-Marquardt from every start, Nelder-Mead from the best of them and from the
        # current coefficients (it crosses the kinks of max() that stop the former).
        best_lm = min((levenberg_marquardt(residuals, x0) for x0 in starts),
                      key=lambda found: found[1])
        candidates = [nelder_mead(objective, best_lm[0], max_evals=max_evals)]
        if k == 0:
            candidates.append(nelder_mead(objective, starts[0], max_evals=max_evals))
        x, loss = min(candidates, key=lambda found: found[1])
        for _ in range(restarts):  # a fresh simplex around the best point escapes stalls
            x, loss = nelder_mead(objective, x, max_evals=max_evals // 2)
        params = _apply(base, coefs, x)
        if log:
            shown = ", ".join(f"{c.name}={getattr(params, c.name):.4g}" for c in coefs)
            log(f"  round {k + 1}: loss {loss:.4f}: {shown}")
    return FitResult(params=_rounded(params, names), coefficients=names,
                     train_row_ids=tuple(r.row_id for r in rows), rounds=rounds, loss=loss)


# Memory against compute efficiency has local minima (the roofline's max() switches sides):
# every round starts from the current coefficients and from a small grid of both.
START_EFFICIENCIES = ((0.55, 0.45), (0.55, 0.75), (0.95, 0.45), (0.95, 0.75))


def _starts(params: CostModelParams, coefs: Sequence[Coefficient]) -> list[np.ndarray]:
    points = [params] + [replace(params, memory_efficiency=m, compute_efficiency=c)
                         for m, c in START_EFFICIENCIES]
    return [np.array([c.variable(getattr(p, c.name)) for c in coefs]) for p in points]


def _apply(base: CostModelParams, coefs: Sequence[Coefficient], x: np.ndarray) -> CostModelParams:
    values: dict[str, Any] = {c.name: c.value(float(v)) for c, v in zip(coefs, x, strict=True)}
    return replace(base, **values)


def _residuals(frozen: Sequence[FrozenRow], p: CostModelParams, coefs: Sequence[Coefficient],
               x: np.ndarray, weights: np.ndarray, prior_weight: float) -> np.ndarray:
    """Residuals whose sum of squares is the loss: rows (soft-L1 of the log error, weighted),
    priors, and a fence that keeps the optimiser off the flat ends of the transforms."""
    errors = np.array([math.log(max(evaluate(f, p), 1e-12) / f.row.value) for f in frozen])
    soft_l1 = 2.0 * LOSS_SCALE**2 * (np.sqrt(1.0 + (errors / LOSS_SCALE) ** 2) - 1.0)
    rows = np.sign(errors) * np.sqrt(soft_l1 * weights / weights.sum())
    prior = np.array([math.sqrt(prior_weight * c.penalty(getattr(p, c.name))) for c in coefs])
    fence = np.maximum(0.0, np.abs(x) - VARIABLE_RANGE)
    return np.concatenate([rows, prior, fence])


def levenberg_marquardt(residuals: Callable[[np.ndarray], np.ndarray], x0: np.ndarray, *,
                        max_iter: int = 60, step: float = 1e-4,
                        tol: float = 1e-10) -> tuple[np.ndarray, float]:
    """Minimise ``sum(residuals(x) ** 2)`` (forward-difference Jacobian, adaptive damping)."""
    x = x0.astype(float)
    r = residuals(x)
    cost = float(r @ r)
    damping = 1e-2
    for _ in range(max_iter):
        jac = np.column_stack([(residuals(x + step * e) - r) / step for e in np.eye(len(x))])
        grad = jac.T @ r
        hess = jac.T @ jac
        improved = False
        while damping < 1e8:
            delta = np.linalg.solve(hess + damping * np.diag(np.diag(hess) + 1e-12), -grad)
            r_new = residuals(x + delta)
            cost_new = float(r_new @ r_new)
            if cost_new < cost:
                improved = cost - cost_new > tol * max(cost, 1e-30)
                x, r, cost = x + delta, r_new, cost_new
                damping = max(damping / 3.0, 1e-9)
                break
            damping *= 4.0
        if not improved:
            break
    return x, cost


def _rounded(params: CostModelParams, names: Sequence[str]) -> CostModelParams:
    """Four significant digits: what the profile file shows is what was checked."""
    values: dict[str, Any] = {n: float(f"{getattr(params, n):.4g}") for n in names}
    return replace(params, **values)


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, *, max_evals: int = 400,
                step: float = 0.5, tol: float = 1e-7) -> tuple[np.ndarray, float]:
    """Minimise ``f`` from ``x0`` (standard reflection/expansion/contraction/shrink)."""
    n = len(x0)
    simplex = [x0.astype(float)] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    evals = n + 1
    while evals < max_evals:
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if values[-1] - values[0] < tol:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        worst = simplex[-1]
        reflected = centroid + (centroid - worst)
        fr = f(reflected)
        evals += 1
        if fr < values[0]:
            expanded = centroid + 2.0 * (centroid - worst)
            fe = f(expanded)
            evals += 1
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            inside = fr >= values[-1]
            contracted = centroid + (0.5 * (worst - centroid) if inside
                                     else 0.5 * (reflected - centroid))
            fc = f(contracted)
            evals += 1
            if fc < min(values[-1], fr):
                simplex[-1], values[-1] = contracted, fc
            else:  # shrink towards the best point
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0])
                                          for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
                evals += n
    best = int(np.argmin(values))
    return simplex[best], float(values[best])
