"""The scheduler stepped by hand with fabricated executor output (every step 10 ms).

Each test drives ``schedule()`` / ``update_from_output()`` itself and checks the invariants
after every step.
"""

from __future__ import annotations

import pytest

from adapters.reference.blocks import BlockManager
from adapters.reference.config import SchedulerConfig
from adapters.reference.request import Request, RequestStatus
from adapters.reference.scheduler import ExecutorOutput, Scheduler, SchedulerOutput, StepOutput

STEP_S = 0.01


class Harness:
    """A scheduler, a fake clock and a fake executor that says every step takes STEP_S."""

    def __init__(self, num_blocks: int = 10, *, block_size: int = 16, num_host_blocks: int = 0,
                 **config: object) -> None:
        defaults: dict[str, object] = dict(max_num_seqs=8, max_num_batched_tokens=64,
                                           max_model_len=1024)
        defaults.update(config)
        self.blocks = BlockManager(num_blocks, block_size, num_host_blocks)
        self.sched = Scheduler(SchedulerConfig(**defaults), self.blocks)  # type: ignore[arg-type]
        self.now_s = 0.0
        self.requests: dict[str, Request] = {}

    def add(self, name: str, prompt: int, output: int, priority: int = 0) -> Request:
        r = Request(name, prompt, output, arrival_s=self.now_s, priority=priority,
                    index=len(self.requests))
        self.requests[name] = r
        self.sched.add_request(r)
        self.sched.check_invariants()
        return r

    def step(self) -> tuple[SchedulerOutput, StepOutput]:
        out = self.sched.schedule()
        result = self.sched.update_from_output(out, ExecutorOutput(STEP_S), self.now_s)
        self.now_s = result.end_s
        self.sched.check_invariants()
        return out, result

    def scheduled(self, out: SchedulerOutput) -> dict[str, int]:
        return {r.request_id: n for r, n in zip(out.requests, out.num_new_tokens, strict=True)}

    def run_to_completion(self, max_steps: int = 1000) -> list[SchedulerOutput]:
        outs = []
        while self.sched.has_unfinished():
            assert len(outs) < max_steps, "the scheduler did not finish"
            outs.append(self.step()[0])
        assert self.blocks.num_free_blocks == self.blocks.num_gpu_blocks
        return outs


def test_block_counts_at_15_16_17_tokens() -> None:
    h = Harness()
    r = h.add("r", prompt=15, output=5)
    out, res = h.step()  # prefill 15 tokens -> 1 block, first token sampled
    assert h.scheduled(out) == {"r": 15} and res.token_request_ids == ("r",)
    assert (r.num_computed_tokens, r.num_tokens, len(r.block_ids)) == (15, 16, 1)
    h.step()  # token 16 fed back: still 1 block
    assert (r.num_computed_tokens, len(r.block_ids)) == (16, 1)
    h.step()  # token 17: a second block
    assert (r.num_computed_tokens, len(r.block_ids)) == (17, 2)
    assert len(h.sched.token_times_s(r)) == 3
    assert h.sched.token_times_s(r) == pytest.approx([0.01, 0.02, 0.03])
    assert r.token_steps == [0, 3]  # one run: steps 0, 1 and 2


def test_decode_counts_and_finish_frees_blocks() -> None:
    h = Harness()
    r = h.add("r", prompt=15, output=3)
    outs = h.run_to_completion()
    assert [(o.num_prefill_tokens, o.num_decode_tokens) for o in outs] == [(15, 0), (0, 1), (0, 1)]
    assert r.status is RequestStatus.FINISHED and r.finished_s == pytest.approx(0.03)
    assert r.block_ids == [] and r.num_output_tokens == 3


def test_chunked_prefill_fills_the_token_budget() -> None:
    h = Harness(num_blocks=20, max_num_batched_tokens=64)
    a = h.add("a", prompt=100, output=2)
    h.add("b", prompt=30, output=2)
    out, res = h.step()
    assert h.scheduled(out) == {"a": 64}  # budget spent on a's first chunk
    assert res.token_request_ids == () and a.num_computed_tokens == 64 and len(a.block_ids) == 4
    out, res = h.step()
    assert h.scheduled(out) == {"a": 36, "b": 28}  # a's last chunk, then b fills the rest
    assert res.token_request_ids == ("a",)  # only a caught up
    assert out.num_prefill_tokens == 64 and out.num_decode_tokens == 0
    out, res = h.step()
    assert h.scheduled(out) == {"a": 1, "b": 2}  # a decodes, b finishes its prompt
    assert out.num_decode_tokens == 1 and out.num_prefill_tokens == 2
    assert set(res.token_request_ids) == {"a", "b"} and res.finished_request_ids == ("a",)
    h.run_to_completion()


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget() -> None:
    h = Harness(num_blocks=20, max_num_batched_tokens=64, chunked_prefill=False, max_model_len=64)
    h.add("a", prompt=40, output=3)
    h.add("b", prompt=40, output=3)
    out, _ = h.step()
    assert h.scheduled(out) == {"a": 40}  # b does not fit in the 24 tokens left: not cut
    out, _ = h.step()
    assert h.scheduled(out) == {"a": 1, "b": 40}
    h.run_to_completion()


@pytest.mark.parametrize("preemption", ["recompute", "swap", "none"])
def test_without_chunked_prefill_a_prompt_over_the_budget_is_rejected(preemption: str) -> None:
    """TensorRT-LLM's rule (``oversized_prompts: reject``): the engine runs with a context
    longer than its step budget and rejects each request whose prefill cannot fit one step.
    A request that may be preempted and recomputed must fit with its output too."""
    h = Harness(num_blocks=20, max_num_batched_tokens=64, chunked_prefill=False,
                max_model_len=1024, preemption=preemption,
                admission="reserve" if preemption == "none" else "optimistic")
    over = Request("over", 65, 3)
    assert not h.sched.add_request(over)
    assert over.error_kind == "rejected"
    assert "prompt (65) tokens exceed max_num_batched_tokens (64)" in over.error_message
    edge = h.add("edge", prompt=64, output=1)  # 64 KV tokens: fits whichever the preemption
    long_output = Request("long-output", 40, 30)  # prompt fits; prompt + output do not
    accepted = h.sched.add_request(long_output)
    if preemption != "none":  # swap falls back to recompute when the host is full
        assert not accepted and "re-prefill" in long_output.error_message
    else:  # never preempted: only the prompt is ever prefilled
        assert accepted
        h.requests["long-output"] = long_output
    h.run_to_completion()
    assert edge.status is RequestStatus.FINISHED
    assert (long_output.status is RequestStatus.FINISHED) == (preemption == "none")


def _three_requests_one_block_each(h: Harness, priorities: tuple[int, int, int] = (0, 0, 0)
                                   ) -> None:
    for name, p in zip(("r1", "r2", "r3"), priorities, strict=True):
        h.add(name, prompt=16, output=4, priority=p)
    out, _ = h.step()  # all three prefill 16 tokens: one block each, the cache is full
    assert len(out.requests) == 3 and h.blocks.num_free_blocks == 0


def test_fcfs_preempts_the_latest_request_first_and_recompute_resets_progress() -> None:
    h = Harness(num_blocks=3)
    _three_requests_one_block_each(h)
    out, _ = h.step()  # every request needs a second block for its 17th token
    # r1 takes r3's block; r2 then finds nothing left and is itself the latest: preempted.
    assert out.preempted_request_ids == ("r3", "r2")
    assert h.scheduled(out) == {"r1": 1}
    r2, r3 = h.requests["r2"], h.requests["r3"]
    for r in (r2, r3):  # recompute: blocks freed, progress reset, generated token kept
        assert r.status is RequestStatus.WAITING and r.block_ids == []
        assert (r.num_computed_tokens, r.num_output_tokens, r.num_tokens) == (0, 1, 17)
        assert r.num_preemptions == 1
    assert [r.request_id for r in h.sched.waiting] == ["r2", "r3"]  # earliest first again
    assert out.num_running == 1 and out.num_waiting == 2
    h.run_to_completion()
    assert h.requests["r1"].num_preemptions == 0


def test_recomputed_prefill_covers_prompt_and_generated_tokens() -> None:
    h = Harness(num_blocks=3)
    _three_requests_one_block_each(h)
    h.step()  # r2, r3 preempted (see above)
    r1 = h.requests["r1"]
    while r1.status is not RequestStatus.FINISHED:
        out, _ = h.step()
    out, _ = h.step()
    # r2 comes back first and recomputes 16 prompt + 1 generated tokens in one prefill
    assert h.scheduled(out).get("r2") == 17
    assert out.num_prefill_tokens >= 17
    h.run_to_completion()
    assert all(len(h.sched.token_times_s(r)) == 4 for r in h.requests.values())


def test_priority_preempts_the_lowest_priority_then_the_latest() -> None:
    h = Harness(num_blocks=3, policy="priority")
    _three_requests_one_block_each(h, priorities=(1, 0, 0))
    assert [r.request_id for r in h.sched.running] == ["r2", "r3", "r1"]  # admitted by priority
    out, _ = h.step()
    # r2 needs a block: the worst (priority, arrival) is r1. r3 needs one: r3 is now the worst.
    assert out.preempted_request_ids == ("r1", "r3")
    assert h.scheduled(out) == {"r2": 1}
    assert [r.request_id for r in h.sched.waiting] == ["r3", "r1"]
    h.run_to_completion()


def test_priority_victim_already_scheduled_this_step_is_unscheduled() -> None:
    h = Harness(num_blocks=3, policy="priority")
    low = h.add("low", prompt=16, output=8, priority=1)
    h.step()  # low prefills alone: 1 block
    high = h.add("high", prompt=16, output=8, priority=0)
    out, _ = h.step()  # low's 17th token opens block 2; high is admitted into block 3
    assert h.scheduled(out) == {"low": 1, "high": 16} and h.blocks.num_free_blocks == 0
    out, _ = h.step()
    # low (first in the running list) fits and is scheduled; high's 17th token needs a block,
    # and the worst request is low: it is taken out of this step and preempted.
    assert out.preempted_request_ids == ("low",)
    assert h.scheduled(out) == {"high": 1}
    assert low.num_computed_tokens == 0 and low.block_ids == [] and len(high.block_ids) == 2
    h.run_to_completion()


def test_no_waiting_request_is_admitted_in_a_step_that_preempted() -> None:
    h = Harness(num_blocks=3, max_num_seqs=8)
    _three_requests_one_block_each(h)
    h.add("late", prompt=1, output=1)
    out, _ = h.step()
    assert out.preempted_request_ids and "late" not in h.scheduled(out)


def test_swap_preemption_keeps_progress_and_swaps_back_in() -> None:
    h = Harness(num_blocks=3, num_host_blocks=4, preemption="swap")
    _three_requests_one_block_each(h)
    out, _ = h.step()
    assert out.preempted_request_ids == ("r3", "r2")
    assert out.num_swapped_out_blocks == 2
    r2 = h.requests["r2"]
    assert r2.status is RequestStatus.SWAPPED
    assert (r2.num_computed_tokens, r2.num_host_blocks, r2.block_ids) == (16, 1, [])
    swapped_in = 0
    while r2.status is not RequestStatus.RUNNING:
        out, _ = h.step()
        swapped_in += out.num_swapped_in_blocks
    assert h.scheduled(out)["r2"] == 1  # resumes decoding: nothing recomputed
    assert swapped_in >= 1 and r2.num_host_blocks == 0
    h.run_to_completion()
    assert h.blocks.num_free_host_blocks == 4


def test_swap_falls_back_to_recompute_when_the_host_is_full() -> None:
    h = Harness(num_blocks=3, num_host_blocks=0, preemption="swap")
    _three_requests_one_block_each(h)
    out, _ = h.step()
    assert out.num_swapped_out_blocks == 0
    assert h.requests["r3"].num_computed_tokens == 0
    assert h.requests["r3"].status is RequestStatus.WAITING
    h.run_to_completion()


def test_reserve_admission_never_preempts() -> None:
    h = Harness(num_blocks=4, admission="reserve", preemption="none")
    for i in range(4):
        h.add(f"r{i}", prompt=16, output=17)  # 16 + 17 - 1 = 32 tokens: 2 blocks reserved
    out, _ = h.step()
    assert sorted(h.scheduled(out)) == ["r0", "r1"]  # only two reservations fit
    assert all(len(r.block_ids) == 2 for r in h.sched.running)
    outs = [out, *h.run_to_completion()]
    assert all(not o.preempted_request_ids for o in outs)
    assert all(r.num_preemptions == 0 for r in h.requests.values())
    # r2 was admitted only once a reservation was released
    assert h.requests["r2"].first_scheduled_s == pytest.approx(h.requests["r0"].finished_s)


@pytest.mark.parametrize("last_token", [False, True])
def test_reserve_admission_holds_the_last_token_where_the_engine_does(last_token: bool) -> None:
    """TGI reserves input + max_new_tokens - 1 (the last token is never fed back);
    TensorRT-LLM's GUARANTEED_NO_EVICT reserves ceilDiv(prompt + max_new_tokens, block)
    blocks (``reserve_last_token``). At a block boundary that is one block more: 16 + 17
    tokens take 1 block of 32 under TGI's rule, 2 under TensorRT-LLM's."""
    h = Harness(num_blocks=3, block_size=32, admission="reserve", preemption="none",
                reserve_last_token=last_token)
    for i in range(3):
        h.add(f"r{i}", prompt=16, output=17)
    out, _ = h.step()
    assert sorted(h.scheduled(out)) == (["r0"] if last_token else ["r0", "r1", "r2"])
    assert all(len(r.block_ids) == (2 if last_token else 1) for r in h.sched.running)
    h.run_to_completion()
    # alone in the cache: a request reserving more than all of it can never run
    big = Request("big", 64, 33)  # 96 tokens: 3 blocks; 97 with the last token: 4
    assert h.sched.add_request(big) is not last_token


def test_static_batches_pad_prompts_and_empty_slots() -> None:
    h = Harness(num_blocks=20, policy="static", admission="reserve", max_num_batched_tokens=128,
                chunked_prefill=False, max_model_len=128)
    h.add("a", prompt=10, output=1)
    h.add("b", prompt=20, output=2)
    h.add("c", prompt=30, output=3)
    out, _ = h.step()
    assert h.scheduled(out) == {"a": 10, "b": 20, "c": 30}
    assert out.num_prefill_tokens == 60 and out.num_padded_tokens == 3 * 30 - 60
    h.add("d", prompt=5, output=1)  # arrives mid-batch: waits for the whole batch
    out, _ = h.step()  # a finished: its slot is padding
    assert h.scheduled(out) == {"b": 1, "c": 1} and out.num_padded_tokens == 1
    assert out.num_padded_seqs == 1
    out, _ = h.step()
    assert h.scheduled(out) == {"c": 1} and out.num_padded_tokens == 2
    out, _ = h.step()
    assert h.scheduled(out) == {"d": 5} and out.num_padded_tokens == 0  # a new batch of one
    h.run_to_completion()


def test_static_batch_is_limited_by_padded_tokens() -> None:
    h = Harness(num_blocks=40, policy="static", admission="reserve", max_num_batched_tokens=100,
                chunked_prefill=False, max_model_len=100)
    h.add("a", prompt=10, output=1)
    h.add("b", prompt=40, output=1)
    h.add("c", prompt=20, output=1)
    out, _ = h.step()
    assert h.scheduled(out) == {"a": 10, "b": 40}  # 3 x 40 padded would exceed 100
    h.run_to_completion()


def test_max_num_seqs_caps_the_running_batch() -> None:
    h = Harness(num_blocks=20, max_num_seqs=2)
    for i in range(3):
        h.add(f"r{i}", prompt=4, output=2)
    out, _ = h.step()
    assert len(out.requests) == 2 and out.num_waiting == 1
    h.run_to_completion()


def test_requests_that_can_never_run_are_rejected() -> None:
    h = Harness(num_blocks=2, max_model_len=100)
    too_big = Request("big", 40, 10)  # 49 KV tokens = 4 blocks > 2 in the cache
    assert not h.sched.add_request(too_big)
    assert too_big.status is RequestStatus.REJECTED and too_big.error_kind == "rejected"
    assert "KV blocks" in too_big.error_message
    too_long = Request("long", 90, 20)
    assert not h.sched.add_request(too_long)
    assert "max_model_len" in too_long.error_message
    assert not h.sched.add_request(Request("empty", 5, 0))
    assert not h.sched.has_unfinished()
    ok = h.add("ok", prompt=16, output=17)  # exactly 2 blocks: fits
    h.run_to_completion()
    assert ok.status is RequestStatus.FINISHED
