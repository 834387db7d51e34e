"""Simulate one published row: its workload through the reference engine under a profile.

    row (workload, engine, GPU, model)  +  profile (scheduler defaults, coefficients)
        -> synthetic trace:  offline      all requests at t=0
                             rate         Poisson arrivals at arrival_value/s, seed from row_id
                             concurrency  a closed loop of arrival_value users
                                          (harness.target.ClosedLoop, the capacity planner's)
        -> simulate(trace, ReferenceConfig) -> timelines
        -> the row's window (run: every request; steady: a closed loop without its ramp and
           drain) -> harness.metrics.summarize -> value

The fit (harness/published/frozen.py) needs a schedule that does not depend on the
coefficients, so it emulates a closed loop instead (``emulate_closed_loop``): every request at
t=0 with max_num_seqs = C, request j >= C taken as sent when the (j - C + 1)-th finished.
The emulated request never waits for a step in progress; on the training rows (8 users) the two
agree within 1%.

Large published runs are cut to ``max_simulated_requests`` (docs/fidelity.md): with every
request the same length the engine reaches its steady state within a few batches.
"""

from __future__ import annotations

import csv
import math
import os
import zlib
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from adapters.reference.config import ReferenceConfig
from adapters.reference.cost_model import CostModelParams
from harness.metrics import summarize
from harness.published.profiles import (
    COST_OVERRIDE_KEYS,
    EngineProfile,
    parse_setting,
    read_profile,
)
from harness.published.rows import PublishedRow
from harness.target import ClosedLoop
from harness.timeline import RequestTimeline
from harness.traces import TraceRequest

try:  # the simulation driver is moving into harness.sim
    from harness.sim import simulate
except ImportError:  # pragma: no cover - older layout
    from adapters.reference import simulate  # type: ignore[attr-defined,no-redef]

# Data sets with varying lengths (a row's input/output tokens are then their means):
#   sharegpt         the requests of vLLM's ShareGPT sampler in its order (seed 0; the bundled
#                    harness/data/sharegpt_vllm_sample_excerpt.csv), scaled to the row's means
#   uniform-15pct    uniform within +-15% of the means
# Any other data set is simulated at fixed lengths.
DATA_DIR = Path(__file__).resolve().parent.parent / "data"
VLLM_SHAREGPT_CSV = DATA_DIR / "sharegpt_vllm_sample_excerpt.csv"
SHAREGPT_8K_CSV = DATA_DIR / "sharegpt_lengths_excerpt.csv"
AZURE_CONV_CSV = DATA_DIR / "azure_conv_excerpt.csv"
# Where a ShareGPT row's per-request lengths come from (the sources publish means only):
#   vllm-sample  the first N requests vLLM's ShareGPT sampler draws with seed 0 (what the check
#                uses: the benchmarks behind these rows ran that sampler)
#   fixed        every request at the means
#   sharegpt-8k  random draws from the bundled 8k-filtered ShareGPT excerpt (multi-turn
#                contexts, Llama-2 tokenizer)
#   azure-conv   random draws from the bundled Azure conversation excerpt (a production chat
#                service's prompt and response lengths)
# each scaled to the row's means. The other three only show how much a row depends on the
# length distribution (harness/published/sensitivity.py).
LENGTH_SHAPES = ("vllm-sample", "fixed", "sharegpt-8k", "azure-conv")


@dataclass(frozen=True)
class RowWorkload:
    """What is simulated for a row."""

    requests: tuple[TraceRequest, ...]
    config: ReferenceConfig
    concurrency: int | None  # closed-loop users
    num_published_requests: int


@dataclass(frozen=True)
class RowPrediction:
    row_id: str
    predicted: float
    published: float
    num_simulated_requests: int
    num_preemptions: int

    @property
    def ratio(self) -> float:
        return self.predicted / self.published


def num_simulated_requests(row: PublishedRow) -> int:
    """The published request count, all of it: a benchmark's figure is over its whole run
    (trtllm-bench's throughput from the first request's start to the last one's end, a
    steady-state window of a closed loop over what is left after its first and last C), so a
    shorter run is another figure (its ramp-down weighs more: up to 13% on TensorRT-LLM's
    offline rows, docs/published.md)."""
    return row.num_requests


def row_params(row: PublishedRow, params: CostModelParams) -> CostModelParams:
    """``params`` with the row's own cost-model settings (an offline API has no front end)."""
    overrides = {k: parse_setting(k, v) for k, v in row.settings().items()
                 if k in COST_OVERRIDE_KEYS}
    return replace(params, **overrides) if overrides else params


def row_config(row: PublishedRow, profile: EngineProfile,
               params: CostModelParams | None = None,
               max_request_tokens: int | None = None) -> ReferenceConfig:
    """The reference engine's configuration for ``row`` under ``profile``."""
    sched: dict[str, Any] = dict(profile.scheduler)
    sched.update({k: parse_setting(k, v) for k, v in row.settings().items()
                  if k not in COST_OVERRIDE_KEYS})
    sched.pop("prefix_caching", None)  # an engine default the reference does not simulate
    if row.concurrency is not None:
        sched["max_num_seqs"] = min(int(sched.get("max_num_seqs", 256)), row.concurrency)
    longest = max_request_tokens or row.input_tokens + row.output_tokens
    max_model_len = max(int(sched.pop("max_model_len", 0)), _round_up(longest, 256))
    budget = int(sched.get("max_num_batched_tokens", 8192))
    if not sched.get("chunked_prefill", True):
        budget = max(budget, max_model_len)  # a whole prompt must fit one step
    sched["max_num_batched_tokens"] = max(budget, int(sched.get("max_num_seqs", 256)))
    return ReferenceConfig(
        model=row.model, gpu=row.gpu, tp=row.tensor_parallel_size,
        weights_dtype=row.weights_dtype, kv_cache_dtype=row.kv_cache_dtype,
        max_model_len=max_model_len, cost_params=row_params(row, params or profile.params),
        **sched,
    )


def row_workload(row: PublishedRow, profile: EngineProfile,
                 params: CostModelParams | None = None, *,
                 lengths: str = "vllm-sample") -> RowWorkload:
    n = num_simulated_requests(row)
    rng = np.random.default_rng(zlib.crc32(row.row_id.encode()))
    arrivals = np.zeros(n)
    if row.arrival == "rate":
        assert row.arrival_value is not None
        arrivals = np.cumsum(rng.exponential(1.0 / row.arrival_value, size=n))
        arrivals -= arrivals[0]
    inputs, outputs = request_lengths(row, n, rng, lengths)
    requests = tuple(
        TraceRequest(f"{row.row_id}-{i}", float(a), int(i_len), int(o_len))
        for i, (a, i_len, o_len) in enumerate(zip(arrivals, inputs, outputs, strict=True)))
    max_len = int((inputs + outputs).max())
    return RowWorkload(requests, row_config(row, profile, params, max_len), row.concurrency,
                       row.num_requests)


def request_lengths(row: PublishedRow, n: int, rng: np.random.Generator,
                    shape: str = "vllm-sample") -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths of the ``n`` simulated requests (means: the row's).

    ``shape`` (one of LENGTH_SHAPES) only matters for ShareGPT rows."""
    if shape not in LENGTH_SHAPES:
        raise ValueError(f"lengths: one of {', '.join(LENGTH_SHAPES)}, got {shape!r}")
    if row.dataset == "sharegpt" and shape != "fixed":
        if shape == "vllm-sample":  # the sampler's order: request i is its i-th draw
            prompts, outputs = _length_columns(VLLM_SHAREGPT_CSV, "num_prefill_tokens",
                                               "num_decode_tokens")
            pick = np.arange(n) % len(prompts)
        else:
            prompts, outputs = (
                _length_columns(SHAREGPT_8K_CSV, "num_prefill_tokens", "num_decode_tokens")
                if shape == "sharegpt-8k"
                else _length_columns(AZURE_CONV_CSV, "ContextTokens", "GeneratedTokens"))
            pick = rng.integers(0, len(prompts), size=n)
        return (_scaled(prompts[pick], row.input_tokens),
                _scaled(outputs[pick], row.output_tokens))
    if row.dataset == "uniform-15pct":
        return (_scaled(rng.uniform(0.85, 1.15, n), row.input_tokens),
                _scaled(rng.uniform(0.85, 1.15, n), row.output_tokens))
    return (np.full(n, row.input_tokens), np.full(n, row.output_tokens))


def _scaled(values: np.ndarray, mean: int) -> np.ndarray:
    return np.maximum(1, np.rint(values * (mean / values.mean()))).astype(np.int64)


@cache
def _length_columns(path: Path, prompt_col: str, output_col: str
                    ) -> tuple[np.ndarray, np.ndarray]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return (np.array([float(r[prompt_col]) for r in rows]),
            np.array([float(r[output_col]) for r in rows]))


def closed_loop_timelines(timelines: Sequence[RequestTimeline], concurrency: int,
                          frontend_latency_s: float) -> list[RequestTimeline]:
    """Timelines re-based on when C closed-loop clients would have sent each request."""
    finishes = np.sort(np.array([tl.finished_s if tl.finished_s is not None else math.inf
                                 for tl in timelines]))
    out = []
    for j, tl in enumerate(timelines):
        if j < concurrency:
            out.append(tl)
            continue
        sent = float(finishes[j - concurrency]) - frontend_latency_s
        out.append(replace(tl, sent_s=sent, scheduled_s=sent))
    return out


def metric_value(summary: dict[str, Any], metric: str) -> float:
    """The published metric ``metric`` read from a ``harness.metrics.summarize`` summary."""
    throughput = summary["throughput"]
    table = {
        "output_tok_s": throughput["output_tokens_per_s"],
        "req_s": throughput["requests_per_s"],
        "duration_s": summary["duration_s"],
        "ttft_mean_s": summary["ttft_s"]["mean"],
        "ttft_p50_s": summary["ttft_s"]["p50"],
        "itl_mean_s": summary["itl_s"]["mean"],
        "itl_p50_s": summary["itl_s"]["p50"],
        "tpot_mean_s": summary["tpot_s"]["mean"],
        "e2e_mean_s": summary["e2e_s"]["mean"],
    }
    value = table[metric]
    return math.nan if value is None else float(value)


def predict_row(row: PublishedRow, profile: EngineProfile,
                params: CostModelParams | None = None, *,
                lengths: str = "vllm-sample",
                emulate_closed_loop: bool = False) -> RowPrediction:
    """Simulate ``row`` under ``profile`` (or ``params`` instead of its coefficients);
    ``lengths``: see LENGTH_SHAPES; ``emulate_closed_loop``: the fit's emulation (see the
    module docstring) instead of the closed-loop simulation."""
    work = row_workload(row, profile, params, lengths=lengths)
    concurrency = work.concurrency
    if concurrency is None:
        timelines = simulate(work.requests, work.config).timelines
    elif emulate_closed_loop:
        timelines = closed_loop_timelines(simulate(work.requests, work.config).timelines,
                                          concurrency, work.config.params.frontend_latency_s)
    else:
        timelines = simulate(work.requests, work.config,
                             closed_loop=ClosedLoop(concurrency)).timelines
    summary = window_summary(timelines, row)
    return RowPrediction(row.row_id, metric_value(summary, row.metric), row.value,
                         len(work.requests), int(summary["num_preemptions"]))


@cache
def _shipped(name: str, catalog: bool = False) -> EngineProfile:
    profile = read_profile(name)
    return catalog_coefficients(profile) if catalog else profile


def catalog_coefficients(profile: EngineProfile) -> EngineProfile:
    """``profile``'s engine defaults with the catalog's datasheet coefficients instead of its
    fitted ones: what a simulation without ``--profile`` predicts for that engine."""
    return profile.with_params(CostModelParams(device=profile.params.device,
                                               source="catalog datasheet coefficients"))


def _predict_shipped(job: tuple[PublishedRow, str, bool]) -> RowPrediction:
    row, lengths, catalog = job
    return predict_row(row, _shipped(row.profile_name, catalog), lengths=lengths)


def predict_shipped(work: Sequence[tuple[PublishedRow, str]], *, jobs: int | None = None,
                    catalog: bool = False) -> list[RowPrediction]:
    """Each (row, length shape) simulated with the shipped profile of its engine and GPU
    (``catalog``: with its engine defaults but the catalog's coefficients), in ``jobs``
    processes (default: one per core); results in order."""
    jobs = jobs or min(len(work), os.cpu_count() or 1)
    tasks = [(row, lengths, catalog) for row, lengths in work]
    if jobs > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(_predict_shipped, tasks, chunksize=2))
    return [_predict_shipped(task) for task in tasks]


def window_summary(timelines: Sequence[RequestTimeline], row: PublishedRow) -> dict[str, Any]:
    """``summarize`` over the row's window. ``steady``: the requests sent after the first C
    and before the last C (the ramp and the drain of a closed loop of C users), latencies of
    those requests, throughput = what every request produced inside the window, from the send
    of the first steady request to the send of the first drained one."""
    if row.window != "steady":
        return summarize(timelines, by_priority=False)
    concurrency = row.concurrency
    assert concurrency is not None  # rows.py refuses a steady window without one
    order = sorted(timelines, key=lambda tl: tl.start_s)
    lo, hi = concurrency, len(order) - concurrency
    if hi - lo < concurrency:
        raise ValueError(f"{row.row_id}: a steady window needs at least 3 x {concurrency} "
                         f"requests, got {len(order)}")
    t0, t1 = order[lo].start_s, order[hi].start_s
    summary = summarize(order[lo:hi], by_priority=False, duration_s=t1 - t0)
    tokens = sum(n for tl in timelines
                 for t, n in zip(tl.chunk_times_s, tl.chunk_num_tokens, strict=True)
                 if t0 <= t < t1)
    done = sum(1 for tl in timelines
               if tl.finished_s is not None and t0 <= tl.finished_s < t1)
    summary["throughput"].update(output_tokens_per_s=tokens / (t1 - t0),
                                 requests_per_s=done / (t1 - t0))
    return summary


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple
