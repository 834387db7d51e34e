"""EngineCore and simulate(): timelines, the steps table, the virtual clock, rejections."""

from __future__ import annotations

import math

import pytest

from adapters.reference import STEP_COLUMNS, EngineCore, ReferenceConfig
from adapters.reference.request import Request
from adapters.reference.scheduler import ExecutorOutput, SchedulerOutput
from harness.metrics import summarize
from harness.sim import simulate
from harness.traces import TraceRequest


def _trace(*specs: tuple[float, int, int], priority: int | None = None) -> list[TraceRequest]:
    return [TraceRequest(f"r{i}", t, p, o, priority) for i, (t, p, o) in enumerate(specs)]


def test_timelines_one_token_per_chunk_in_input_order() -> None:
    reqs = _trace((0.5, 100, 3), (0.0, 20, 2), (0.0, 5000, 4))  # input not in arrival order
    result = simulate(reqs, ReferenceConfig(num_gpu_blocks=1000), check_invariants=True)
    assert [tl.request_id for tl in result.timelines] == ["r0", "r1", "r2"]
    for tl, tr in zip(result.timelines, reqs, strict=True):
        assert tl.ok and tl.token_count_source == "engine" and tl.finish_reason == "length"
        assert tl.output_tokens == tr.num_output_tokens == len(tl.chunk_times_s)
        assert tl.chunk_num_tokens == (1,) * tr.num_output_tokens
        assert tl.finished_s == tl.chunk_times_s[-1]
        assert list(tl.chunk_times_s) == sorted(tl.chunk_times_s)
        assert tl.chunk_times_s[0] > tl.arrival_s
        assert tl.extra["first_scheduled_s"] >= tl.arrival_s
    summary = summarize(result.timelines)
    assert summary["num_completed"] == 3 and summary["ttft_s"]["mean"] > 0


def test_steps_table_columns_and_virtual_clock_jumps_idle_time() -> None:
    result = simulate(_trace((0.0, 10, 2), (100.0, 10, 2)), ReferenceConfig(num_gpu_blocks=50),
                      check_invariants=True)
    steps = result.steps
    assert tuple(steps.column_names) == STEP_COLUMNS
    assert steps.num_rows == 4 and result.num_kv_blocks_total == 50
    t = steps["t_s"].to_pylist()
    d = steps["duration_s"].to_pylist()
    assert t[0] == 0.0 and t[1] == pytest.approx(d[0])  # back to back while busy
    assert t[2] == 100.0  # idle: the clock jumped to the next arrival
    assert steps["num_prefill_tokens"].to_pylist() == [10, 0, 10, 0]
    assert steps["num_decode_tokens"].to_pylist() == [0, 1, 0, 1]
    assert set(steps["num_kv_blocks_total"].to_pylist()) == {50}
    assert steps["num_kv_blocks_used"].to_pylist() == [1, 1, 1, 1]
    second = result.timelines[1]
    assert second.ttft_s() == pytest.approx(d[2])


def test_rejected_requests_are_rows_and_the_rest_completes() -> None:
    config = ReferenceConfig(num_gpu_blocks=16, max_model_len=4096)  # 256 KV tokens
    result = simulate(_trace((0.0, 200, 10), (0.0, 300, 20), (0.0, 4000, 200)), config,
                      check_invariants=True)
    ok, never_fits, too_long = result.timelines
    assert ok.ok
    assert never_fits.error_kind == "rejected" and "KV blocks" in never_fits.error_message
    assert too_long.error_kind == "rejected" and "max_model_len" in too_long.error_message
    assert never_fits.finished_s is None and never_fits.chunk_times_s == ()
    assert summarize(result.timelines)["failures"] == {"rejected": 2}


def test_deterministic() -> None:
    reqs = _trace(*[(i * 0.01, 50 + 37 * i % 300, 1 + 13 * i % 40) for i in range(60)])
    config = ReferenceConfig(num_gpu_blocks=60, max_num_seqs=16, max_num_batched_tokens=256)
    a, b = simulate(reqs, config, check_invariants=True), simulate(reqs, config)
    assert a.timelines == b.timelines and a.steps.equals(b.steps)
    assert sum(tl.num_preemptions for tl in a.timelines) > 0  # memory pressure was real


@pytest.mark.parametrize("kw", [
    {}, {"policy": "priority"}, {"preemption": "swap"}, {"preemption": "none"},
    {"policy": "static", "max_model_len": 512, "max_num_batched_tokens": 1024},
    {"chunked_prefill": False, "max_model_len": 512, "max_num_batched_tokens": 512},
])
def test_decode_spans_give_the_same_results_as_stepping(kw: dict[str, object]) -> None:
    reqs = [TraceRequest(f"r{i}", i * 0.003, 20 + 53 * i % 400, 1 + 29 * i % 90, i % 3)
            for i in range(80)]
    settings: dict[str, object] = dict(num_gpu_blocks=80, max_num_seqs=16,
                                       max_num_batched_tokens=256)
    config = ReferenceConfig(**{**settings, **kw})  # type: ignore[arg-type]
    fast = simulate(reqs, config, check_invariants=True)
    slow = simulate(reqs, config, decode_spans=False, check_invariants=True)
    assert fast.timelines == slow.timelines
    assert fast.steps.equals(slow.steps)


def test_swap_adds_pcie_time_to_the_step() -> None:
    reqs = _trace(*[(0.0, 64, 64) for _ in range(6)])
    kw = dict(num_gpu_blocks=20, max_num_seqs=8, max_num_batched_tokens=512)
    swap = simulate(reqs, ReferenceConfig(preemption="swap", **kw),  # type: ignore[arg-type]
                    check_invariants=True)
    recompute = simulate(reqs, ReferenceConfig(**kw), check_invariants=True)  # type: ignore[arg-type]
    assert sum(tl.num_preemptions for tl in swap.timelines) > 0
    assert all(tl.ok for tl in swap.timelines) and all(tl.ok for tl in recompute.timelines)
    cost = swap.config.cost_model()
    preempting = [i for i, n in enumerate(swap.steps["num_preempted"].to_pylist()) if n]
    i = preempting[0]
    row = {c: swap.steps[c][i].as_py() for c in STEP_COLUMNS}
    no_swap_s = cost.step_s(row["num_prefill_tokens"] + row["num_decode_tokens"], 1, 1, 1)
    assert row["duration_s"] > cost.swap_s(1) and row["duration_s"] > no_swap_s


def test_a_step_that_only_swaps_out_costs_the_copy_not_a_forward() -> None:
    """Under priority the low-priority request, first in running, needs a block and is its
    own victim: it is swapped out and nothing is scheduled that step. The step costs the
    PCIe copy only, as vLLM V0's worker swaps and returns before the model when no sequence
    is scheduled; it used to cost a whole forward (weights read, fixed overhead)."""
    cfg = ReferenceConfig(policy="priority", preemption="swap", num_gpu_blocks=3,
                          block_size=16, max_num_seqs=4, max_num_batched_tokens=64,
                          max_model_len=1024)
    core = EngineCore(cfg)
    core.add_request(Request("low", 31, 8, priority=1, index=0))
    t = core.step(0.0).end_s
    core.add_request(Request("high", 16, 8, priority=0, index=1, arrival_s=t))
    t = core.step(t).end_s
    out = core.scheduler.schedule()
    assert not out.requests and out.preempted_request_ids == ("low",)
    assert out.num_swapped_out_blocks == 2
    assert core.executor.execute(out).duration_s == pytest.approx(core.cost_model.swap_s(2))


def test_progress_is_reported_to_the_end() -> None:
    calls: list[tuple[int, int]] = []
    simulate(_trace(*[(i * 0.1, 10, 2) for i in range(10)]), ReferenceConfig(),
             progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (10, 10)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


class _ConstantExecutor:
    """An in-memory fake executor: every step takes 1 ms."""

    def execute(self, out: SchedulerOutput) -> ExecutorOutput:
        return ExecutorOutput(0.001)


def test_engine_core_steps_for_a_live_driver() -> None:
    core = EngineCore(ReferenceConfig(num_gpu_blocks=10), executor=_ConstantExecutor())
    assert core.add_request(Request("a", 20, 2))
    assert not core.add_request(Request("huge", 1000, 10))
    step1 = core.step(5.0)
    assert (step1.start_s, step1.end_s, step1.token_request_ids) == (5.0, 5.001, ("a",))
    core.check_invariants()
    assert core.run_decode_span(step1.end_s, math.inf) is None  # spans need the cost model
    step2 = core.step(step1.end_s)
    assert step2.finished_request_ids == ("a",) and not core.has_unfinished()
    assert core.num_done == 2


def test_a_step_that_only_preempts_runs_no_model() -> None:
    """Priority scheduling whose first running request is its own victim schedules no token
    that step: vLLM runs no model then (EMPTY_MODEL_RUNNER_OUTPUT), so the step costs no GPU
    time; every step that computes tokens does."""
    core = EngineCore(ReferenceConfig(num_gpu_blocks=4, block_size=4, max_num_seqs=4,
                                      max_num_batched_tokens=64, policy="priority"))
    core.add_request(Request("lo", 4, 6, priority=1))
    t = core.step(0.0).end_s
    core.add_request(Request("hi", 4, 6, arrival_s=0.001, priority=0, index=1))
    while core.has_unfinished():
        t = core.step(t).end_s
    c = core.steps.columns
    rows = list(zip(c["duration_s"], c["num_prefill_tokens"], c["num_decode_tokens"],
                    c["num_preempted"], strict=True))
    empty = [r for r in rows if r[1] == 0 and r[2] == 0]
    assert empty and all(d == 0.0 and preempted > 0 for d, _, _, preempted in empty)
    assert all(d > 0 for d, prefill, decode, _ in rows if prefill or decode)
