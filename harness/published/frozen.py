"""A simulated row with its schedule frozen, re-timed in microseconds for new coefficients.

Which requests run in which step depends on the coefficients only through arrivals: with every
request at t=0 (offline, emulated concurrency) the schedule does not depend on them at all. So
one simulation records, per step, what the cost model was asked (tokens, sequences, KV tokens,
attention pairs) and, per request, the steps of its first token and of its finish. New
coefficients then re-time every step with numpy:

    d_k = max(memory_s_k / memory_efficiency, compute_s_k / compute_efficiency)
          + allreduce_bytes_s_k + step_overhead_s + per_seq_overhead_s * S_k
          + per_token_overhead_s * T_k + 2 * layers * allreduce_latency_s   (tp > 1)
          + per_fp8_kv_token_overhead_s * KV_k                              (FP8 KV cache)
    start_k = max(end_{k-1}, arrival + frontend_latency_s of requests first scheduled at k)

where ``memory_s_k``, ``compute_s_k`` and ``allreduce_bytes_s_k`` come from the reference cost
model itself at efficiency 1 with no overheads (``CostModel.step_cost``).

With Poisson arrivals a frozen step order would let any slowdown pile up over the whole run
(the steps between two arrivals are fixed, so later arrivals wait ever longer). Rate rows are
therefore re-timed per request instead: its wait for the step in progress (scaled with that
step), the steps from its admission to its first token, and the steps to its finish. That
keeps each request's own steps and ignores how queueing would change; the fit re-simulates a
few times (harness/published/fit.py) and reported errors always come from full simulations
(replay.predict_row).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from adapters.reference.config import ReferenceConfig
from adapters.reference.cost_model import CostModel, CostModelParams
from harness.published.profiles import EngineProfile
from harness.published.replay import row_workload, simulate
from harness.published.rows import PublishedRow

StepCall = tuple[int, int, int, int, int]


class _RecordingConfig(ReferenceConfig):
    """A ReferenceConfig whose cost models log every ``step_s`` call into ``calls``."""

    calls: list[StepCall]

    def cost_model(self) -> CostModel:
        model = super().cost_model()
        calls = getattr(self, "calls", None)  # unset while __post_init__ validates
        if calls is None:
            return model
        timed = model.step_s

        def step_s(num_tokens: int, num_seqs: int, num_kv_tokens: int,
                   num_attention_pairs: int, num_swap_blocks: int = 0) -> float:
            calls.append((num_tokens, num_seqs, num_kv_tokens, num_attention_pairs,
                          num_swap_blocks))
            return timed(num_tokens, num_seqs, num_kv_tokens, num_attention_pairs,
                         num_swap_blocks)

        setattr(model, "step_s", step_s)  # noqa: B010 - an instance attribute, on purpose
        return model


def _recording(config: ReferenceConfig) -> _RecordingConfig:
    kwargs = {f.name: getattr(config, f.name) for f in fields(config) if f.init}
    rec = _RecordingConfig(**kwargs)
    object.__setattr__(rec, "calls", [])
    return rec


@dataclass(frozen=True)
class FrozenRow:
    """One row's schedule: arrays per step and per request (see module doc)."""

    row: PublishedRow
    memory_s: np.ndarray  # per step, at memory_efficiency 1
    compute_s: np.ndarray  # per step, at compute_efficiency 1
    fixed_s: np.ndarray  # per step: the all-reduce bandwidth term (not fitted)
    num_tokens: np.ndarray
    num_seqs: np.ndarray
    num_kv_tokens: np.ndarray
    fp8_kv: bool
    step_arrival_s: np.ndarray  # latest trace arrival among requests first scheduled here
    arrival_s: np.ndarray  # per request (trace arrival)
    first_token_step: np.ndarray
    finish_step: np.ndarray
    num_output: np.ndarray
    itl_weight: np.ndarray  # per step: non-first tokens it emitted (pooled ITL median)
    first_sched_step: np.ndarray  # per request
    wait_s: np.ndarray  # per request: admission step start - (arrival + front end), simulated
    sim_duration_s: np.ndarray  # per step, as simulated
    num_allreduce_layers: int  # 2 x layers when tp > 1, else 0
    concurrency: int | None
    base_frontend_s: float  # the row's own front-end override, if any (NaN: fitted)


def freeze(row: PublishedRow, profile: EngineProfile,
           params: CostModelParams | None = None) -> FrozenRow:
    """Simulate ``row`` once and record its schedule (a closed loop emulated, see
    harness/published/replay.py; whole-run windows only)."""
    if row.window != "run":
        raise ValueError(f"{row.row_id}: the fit re-times whole runs only, not a "
                         f"{row.window!r} window")
    work = row_workload(row, profile, params)
    config = _recording(work.config)
    result = simulate(work.requests, config)
    calls = np.array(config.calls, dtype=np.float64).reshape(-1, 5)
    steps = result.steps
    starts = steps.column("t_s").to_numpy()
    ends = starts + steps.column("duration_s").to_numpy()
    if len(calls) != len(starts):
        raise RuntimeError(f"{row.row_id}: {len(calls)} cost-model calls for {len(starts)} steps")

    unit = replace(config.params, memory_efficiency=1.0, compute_efficiency=1.0,
                   step_overhead_s=0.0, per_seq_overhead_s=0.0, per_token_overhead_s=0.0,
                   per_kv_token_overhead_s=0.0, per_attention_pair_overhead_s=0.0,
                   per_fp8_kv_token_overhead_s=0.0, allreduce_latency_s=0.0)
    cm = CostModel(config.model_spec, config.gpu_spec, unit, weights_dtype=config.weights_dtype,
                   kv_cache_dtype=config.kv_cache_dtype, tp=config.tp,
                   block_size=config.block_size)
    parts = [cm.step_cost(*map(int, c)) for c in calls]
    memory_s = np.array([p.memory_s for p in parts])
    compute_s = np.array([p.compute_s for p in parts])
    fixed_s = np.array([p.overhead_s for p in parts])

    n = len(result.timelines)
    arrival = np.array([tl.arrival_s for tl in result.timelines])
    first_tok = np.zeros(n, dtype=np.int64)
    finish = np.zeros(n, dtype=np.int64)
    first_sched = np.zeros(n, dtype=np.int64)
    num_output = np.zeros(n, dtype=np.int64)
    weight = np.zeros(len(starts))
    for i, tl in enumerate(result.timelines):
        times = np.asarray(tl.chunk_times_s)
        idx = _nearest(ends, times)
        first_tok[i], finish[i] = idx[0], idx[-1]
        np.add.at(weight, idx[1:], 1.0)
        num_output[i] = len(times)
        first_sched[i] = _nearest(starts, np.array([tl.extra["first_scheduled_s"]]))[0]
    step_arrival = np.full(len(starts), -math.inf)
    np.maximum.at(step_arrival, first_sched, arrival)
    overrides = {k for k, v in row.settings().items() if k == "frontend_latency_s"}
    return FrozenRow(
        row=row, memory_s=memory_s, compute_s=compute_s, fixed_s=fixed_s,
        num_tokens=calls[:, 0], num_seqs=calls[:, 1], num_kv_tokens=calls[:, 2],
        fp8_kv=config.kv_cache_dtype == "fp8", step_arrival_s=step_arrival,
        arrival_s=arrival, first_token_step=first_tok, finish_step=finish,
        num_output=num_output, itl_weight=weight, first_sched_step=first_sched,
        wait_s=np.maximum(0.0, starts[first_sched] - arrival - config.params.frontend_latency_s),
        sim_duration_s=ends - starts,
        num_allreduce_layers=2 * config.model_spec.num_layers if config.tp > 1 else 0,
        concurrency=work.concurrency,
        base_frontend_s=config.params.frontend_latency_s if overrides else math.nan,
    )


def _nearest(sorted_values: np.ndarray, x: np.ndarray) -> np.ndarray:
    idx = np.clip(np.searchsorted(sorted_values, x), 1, len(sorted_values) - 1)
    left = sorted_values[idx - 1]
    return np.where(np.abs(x - left) <= np.abs(sorted_values[idx] - x), idx - 1, idx)


def evaluate(f: FrozenRow, p: CostModelParams) -> float:
    """The row's metric under coefficients ``p`` on the frozen schedule."""
    frontend = p.frontend_latency_s if math.isnan(f.base_frontend_s) else f.base_frontend_s
    d = (np.maximum(f.memory_s / p.memory_efficiency, f.compute_s / p.compute_efficiency)
         + f.fixed_s + p.step_overhead_s + p.per_seq_overhead_s * f.num_seqs
         + p.per_token_overhead_s * f.num_tokens
         + f.num_allreduce_layers * p.allreduce_latency_s
         + (p.per_fp8_kv_token_overhead_s if f.fp8_kv else 0.0) * f.num_kv_tokens)
    sent = f.arrival_s.copy()
    if f.row.arrival == "rate":
        first, last = _per_request_times(f, d, frontend)
    else:
        before = np.concatenate(([0.0], np.cumsum(d)[:-1]))  # time spent in earlier steps
        ready = f.step_arrival_s + frontend
        start = before + np.maximum.accumulate(ready - before)
        end = start + d
        first, last = end[f.first_token_step], end[f.finish_step]
        if f.concurrency is not None and len(sent) > f.concurrency:
            sent[f.concurrency:] = np.sort(last)[: len(sent) - f.concurrency] - frontend
    ttft, e2e = first - sent, last - sent
    n = f.num_output
    duration = float(last.max() - f.arrival_s.min())
    many = n > 1
    metrics: dict[str, Callable[[], Any]] = {
        "output_tok_s": lambda: n.sum() / duration,
        "req_s": lambda: len(n) / duration,
        "duration_s": lambda: duration,
        "ttft_mean_s": lambda: ttft.mean(),
        "ttft_p50_s": lambda: np.median(ttft),
        "itl_mean_s": lambda: (e2e - ttft)[many].sum() / (n[many] - 1).sum(),
        "itl_p50_s": lambda: _weighted_median(d, f.itl_weight),
        "tpot_mean_s": lambda: ((e2e - ttft)[many] / (n[many] - 1)).mean(),
        "e2e_mean_s": lambda: e2e.mean(),
    }
    return float(metrics[f.row.metric]())


def _per_request_times(f: FrozenRow, d: np.ndarray,
                       frontend: float) -> tuple[np.ndarray, np.ndarray]:
    """First-token and finish instants, each request re-timed on its own steps."""
    cum = np.concatenate(([0.0], np.cumsum(d)))  # cum[k] = sum of d[:k]
    k0 = f.first_sched_step
    prev = np.maximum(k0 - 1, 0)
    scale = np.where(k0 > 0, d[prev] / f.sim_duration_s[prev], 1.0)
    admitted = f.arrival_s + frontend + f.wait_s * scale
    first = admitted + cum[f.first_token_step + 1] - cum[k0]
    last = admitted + cum[f.finish_step + 1] - cum[k0]
    return first, last


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, cum[-1] / 2)])
