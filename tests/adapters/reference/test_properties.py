"""Property tests over random small traces and configurations.

Every request completes or is rejected for a documented reason, blocks never leak, a step
never exceeds max_num_seqs or max_num_batched_tokens, and decode spans never change results.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from adapters.reference import ReferenceConfig
from adapters.reference.blocks import BlockManager
from adapters.reference.config import SchedulerConfig
from adapters.reference.request import Request, RequestStatus
from adapters.reference.scheduler import ExecutorOutput, Scheduler
from harness.sim import simulate
from harness.traces import TraceRequest

_SETTINGS = settings(max_examples=150, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Case:
    config: SchedulerConfig
    block_size: int
    num_blocks: int
    num_host_blocks: int
    requests: tuple[tuple[int, int, int, int], ...]  # (arrival step, prompt, output, priority)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    # Weighted towards optimistic admission with several running requests: preemption.
    policy = draw(st.sampled_from(["fcfs", "fcfs", "priority", "priority", "static"]))
    admission = "reserve" if policy == "static" else draw(st.sampled_from(
        ["optimistic", "optimistic", "optimistic", "reserve"]))
    preemption = "none" if admission == "reserve" else draw(st.sampled_from(["recompute",
                                                                             "swap"]))
    max_num_seqs = draw(st.integers(1, 8))
    chunked = policy != "static" and draw(st.booleans())
    budget = draw(st.integers(max(max_num_seqs, 16), 160 if chunked else 256))
    max_model_len = draw(st.integers(64, 512)) if chunked else budget
    requests = draw(st.lists(
        st.tuples(st.integers(0, 8), st.integers(1, 80), st.integers(1, 60),
                  st.integers(0, 2)),
        min_size=1, max_size=16))
    block_size = draw(st.sampled_from([1, 4, 16]))
    kv_tokens = draw(st.integers(32, 256))  # small: many cases run out of blocks
    return Case(
        config=SchedulerConfig(policy=policy, admission=admission, preemption=preemption,
                               max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                               chunked_prefill=chunked, max_model_len=max_model_len),
        block_size=block_size,
        num_blocks=max(1, kv_tokens // block_size),
        num_host_blocks=draw(st.integers(0, 320)) // block_size,
        requests=tuple(requests),
    )


@_SETTINGS
@given(cases())
def test_every_request_completes_or_is_rejected_and_no_block_leaks(case: Case) -> None:
    blocks = BlockManager(case.num_blocks, case.block_size, case.num_host_blocks)
    sched = Scheduler(case.config, blocks)
    reqs = [Request(f"r{i}", p, o, arrival_s=float(a), priority=pr, index=i)
            for i, (a, p, o, pr) in enumerate(case.requests)]
    pending = sorted(reqs, key=lambda r: (r.arrival_s, r.index))
    step_no = 0
    now_s = 0.0
    while pending or sched.has_unfinished():
        while pending and pending[0].arrival_s <= step_no:
            sched.add_request(pending.pop(0))
            sched.check_invariants()
        step_no += 1
        assert step_no < 20_000, "the scheduler made no progress"
        if not sched.has_unfinished():
            continue
        out = sched.schedule()
        assert len(out.requests) <= case.config.max_num_seqs
        assert out.num_scheduled_tokens + out.num_padded_tokens \
            <= case.config.max_num_batched_tokens
        assert sum(out.num_new_tokens) == out.num_scheduled_tokens
        assert out.requests or out.preempted_request_ids, "a step with nothing to do"
        if case.config.admission == "reserve":
            assert not out.preempted_request_ids
        event(f"preempted: {bool(out.preempted_request_ids)}; swapped: "
              f"{bool(out.num_swapped_out_blocks)}")
        res = sched.update_from_output(out, ExecutorOutput(0.01), now_s)
        now_s = res.end_s
        sched.check_invariants()

    assert blocks.num_free_blocks == case.num_blocks
    assert blocks.num_free_host_blocks == case.num_host_blocks
    for r in reqs:
        if r.status is RequestStatus.REJECTED:
            too_long = r.num_prompt_tokens + r.max_output_tokens > case.config.max_model_len
            never_fits = blocks.blocks_for(r.num_max_kv_tokens) > case.num_blocks
            assert too_long or never_fits, r.error_message
            assert r.error_kind == "rejected" and sched.token_times_s(r) == []
        else:
            assert r.status is RequestStatus.FINISHED
            times = sched.token_times_s(r)
            assert r.num_output_tokens == r.max_output_tokens == len(times)
            assert times == sorted(times)
            assert r.finished_s == times[-1]


@st.composite
def sim_cases(draw: st.DrawFn) -> tuple[list[TraceRequest], ReferenceConfig]:
    policy = draw(st.sampled_from(["fcfs", "priority", "static"]))
    preemption = draw(st.sampled_from(["recompute", "swap", "none"]))
    max_num_seqs = draw(st.integers(1, 8))
    budget = draw(st.integers(max(max_num_seqs, 64), 512))
    chunked = draw(st.booleans())
    whole = policy == "static" or not chunked
    config = ReferenceConfig(
        policy=policy, preemption=preemption, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget, chunked_prefill=chunked,
        max_model_len=budget if whole else 1024,
        num_gpu_blocks=draw(st.integers(4, 60)), block_size=draw(st.sampled_from([4, 16])),
        swap_space_gib=draw(st.sampled_from([0.0, 0.01, 1.0])),
    )
    arrivals = draw(st.lists(st.floats(0, 0.5), min_size=1, max_size=25))
    reqs = [
        TraceRequest(f"r{i}", a, draw(st.integers(1, 300)), draw(st.integers(1, 60)),
                     draw(st.integers(0, 2)))
        for i, a in enumerate(arrivals)
    ]
    return reqs, config


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sim_cases())
def test_decode_spans_never_change_results(case: tuple[list[TraceRequest], ReferenceConfig]
                                           ) -> None:
    reqs, config = case
    fast = simulate(reqs, config, check_invariants=True)
    slow = simulate(reqs, config, decode_spans=False, check_invariants=True)
    assert fast.timelines == slow.timelines
    assert fast.steps.equals(slow.steps)
    for tl in fast.timelines:
        assert tl.ok or tl.error_kind == "rejected"
    used = fast.steps["num_kv_blocks_used"].to_pylist()
    assert all(0 <= u <= fast.num_kv_blocks_total for u in used)
    assert max(fast.steps["num_running"].to_pylist(), default=0) <= config.max_num_seqs


def test_decode_spans_count_the_last_prompt_token_as_prefill() -> None:
    """A request whose last prompt token is left for its own step (chunked prefill filled
    the budget) is still prefilling: no decode span may start before that step."""
    reqs = [TraceRequest("r0", 0.46875, 100, 1, 0), TraceRequest("r1", 0.0, 1, 1, 0),
            TraceRequest("r2", 0.4375, 1, 6, 0), TraceRequest("r3", 0.25, 1, 36, 0)]
    config = ReferenceConfig(policy="fcfs", max_num_seqs=3, max_num_batched_tokens=101,
                             chunked_prefill=True, num_gpu_blocks=11, max_model_len=1024,
                             swap_space_gib=0.0)
    fast = simulate(reqs, config, check_invariants=True)
    slow = simulate(reqs, config, decode_spans=False, check_invariants=True)
    assert fast.steps.equals(slow.steps)
