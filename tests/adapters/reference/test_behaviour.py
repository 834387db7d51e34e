"""The claims the reference engine exists to show, on the shipped Azure conversation excerpt.

Each test runs the first 400 requests of harness/data/azure_conv_excerpt.csv (real arrivals
and lengths, arrivals compressed to load the simulated H100) and compares summaries computed
by harness.metrics, exactly as `batchlab simulate` reports them.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from adapters.reference import ReferenceConfig
from harness.metrics import summarize
from harness.sim import simulate
from harness.traces import TraceOptions, TraceRequest, load_trace

EXCERPT = Path(__file__).resolve().parents[3] / "harness" / "data" / "azure_conv_excerpt.csv"


def _requests(time_scale: float, priority_fraction: float | None = None
              ) -> tuple[TraceRequest, ...]:
    options = TraceOptions(limit=400, time_scale=time_scale, priority_fraction=priority_fraction)
    return load_trace(EXCERPT, options).requests


def test_continuous_batching_beats_static_on_throughput_and_ttft() -> None:
    reqs = _requests(time_scale=0.25)  # 4x the trace's rate: about 15 requests/s
    continuous = summarize(simulate(reqs, ReferenceConfig(policy="fcfs")).timelines)
    # static prefills whole batches: its token budget must hold the longest request
    static_config = ReferenceConfig(policy="static", max_model_len=16384,
                                    max_num_batched_tokens=16384)
    static = summarize(simulate(reqs, static_config).timelines)
    assert continuous["num_completed"] == static["num_completed"] == len(reqs)
    assert (continuous["throughput"]["output_tokens_per_s"]
            > 2 * static["throughput"]["output_tokens_per_s"])
    assert continuous["ttft_s"]["mean"] < static["ttft_s"]["mean"] / 10
    assert continuous["ttft_s"]["p99"] < static["ttft_s"]["p99"]


def test_priority_serves_class_0_faster_than_fcfs_does() -> None:
    reqs = _requests(time_scale=0.05, priority_fraction=0.3)  # overloaded: a queue forms
    fcfs = summarize(simulate(reqs, ReferenceConfig(policy="fcfs")).timelines)
    prio = summarize(simulate(reqs, ReferenceConfig(policy="priority")).timelines)
    fcfs_0 = fcfs["by_priority"]["0"]["ttft_s"]["mean"]
    prio_0 = prio["by_priority"]["0"]["ttft_s"]["mean"]
    prio_1 = prio["by_priority"]["1"]["ttft_s"]["mean"]
    assert prio_0 < fcfs_0 / 2
    assert prio_0 < prio_1  # ... paid for by class 1
    # FCFS ignores classes: both see about the same queueing
    assert fcfs_0 == pytest.approx(fcfs["by_priority"]["1"]["ttft_s"]["mean"], rel=0.5)


def test_fp8_kv_admits_more_concurrent_requests_under_memory_pressure() -> None:
    reqs = _requests(time_scale=0.05)
    runs = {}
    for kv in ("bf16", "fp8"):
        # 30% of 80 GB leaves ~6.6 GiB for KV next to 15 GiB of weights: KV-bound
        config = ReferenceConfig(kv_cache_dtype=kv, gpu_memory_utilization=0.3)
        runs[kv] = simulate(reqs, config)
    bf16, fp8 = runs["bf16"], runs["fp8"]
    assert fp8.num_kv_blocks_total in (2 * bf16.num_kv_blocks_total,
                                       2 * bf16.num_kv_blocks_total + 1)
    running = {kv: r.steps["num_running"].to_pylist() for kv, r in runs.items()}
    assert max(running["fp8"]) > 1.5 * max(running["bf16"])
    assert statistics.mean(running["fp8"]) > 1.3 * statistics.mean(running["bf16"])
    # bf16 hit the KV limit and preempted; both finished everything
    assert summarize(bf16.timelines)["num_preemptions"] > 0
    assert all(tl.ok for tl in bf16.timelines) and all(tl.ok for tl in fp8.timelines)
    assert (summarize(fp8.timelines)["throughput"]["output_tokens_per_s"]
            > summarize(bf16.timelines)["throughput"]["output_tokens_per_s"])
