"""Prefix caching, stepped by hand with block size 16 (every step 10 ms).

Prompts are token ids (``_tokens``), named per full block by ``chain_block_hashes``. Each test
checks the scheduler's and the block manager's invariants after every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from adapters.reference.blocks import NO_HIT, BlockManager, InvariantError, PrefixHit
from adapters.reference.config import ReferenceConfig, SchedulerConfig
from adapters.reference.engine import EngineCore
from adapters.reference.request import (
    Request,
    RequestStatus,
    block_hashes_from_prefix_ids,
    chain_block_hashes,
)
from adapters.reference.scheduler import ExecutorOutput, Scheduler, SchedulerOutput

BS = 16
STEP_S = 0.01


def _tokens(seed: int, n: int) -> list[int]:
    """``n`` token ids no other seed uses."""
    return list(range(seed * 10_000, seed * 10_000 + n))


class Harness:
    def __init__(self, num_blocks: int = 10, *, num_host_blocks: int = 0,
                 prefix_caching: bool = True, **config: object) -> None:
        defaults: dict[str, object] = dict(max_num_seqs=8, max_num_batched_tokens=64,
                                           max_model_len=1024, prefix_caching=prefix_caching)
        defaults.update(config)
        self.blocks = BlockManager(num_blocks, BS, num_host_blocks)
        self.sched = Scheduler(SchedulerConfig(**defaults), self.blocks)  # type: ignore[arg-type]
        self.now_s = 0.0
        self.num_added = 0

    def add(self, name: str, tokens: list[int], output: int, *, hashes: bool = True) -> Request:
        r = _request(name, tokens, output, index=self.num_added, hashes=hashes)
        r.arrival_s = self.now_s
        self.num_added += 1
        self.sched.add_request(r)
        self.sched.check_invariants()
        return r

    def step(self) -> SchedulerOutput:
        out = self.sched.schedule()
        self.now_s = self.sched.update_from_output(out, ExecutorOutput(STEP_S), self.now_s).end_s
        self.sched.check_invariants()
        return out

    def run_to_completion(self) -> list[SchedulerOutput]:
        outs: list[SchedulerOutput] = []
        while self.sched.has_unfinished():
            assert len(outs) < 1000
            outs.append(self.step())
        assert self.blocks.num_free_blocks == self.blocks.num_gpu_blocks
        return outs


def _request(name: str, tokens: list[int], output: int, *, index: int = 0,
             hashes: bool = True) -> Request:
    return Request(name, len(tokens), output, index=index,
                   block_hashes=chain_block_hashes(tokens, BS) if hashes else ())


def _scheduled(out: SchedulerOutput) -> dict[str, int]:
    return {r.request_id: n for r, n in zip(out.requests, out.num_new_tokens, strict=True)}


def _hit_blocks(h: Harness, tokens: list[int]) -> tuple[int, ...]:
    """The blocks a new request with ``tokens`` would share now (a lookup changes nothing)."""
    return h.blocks.find_cached_prefix(_request("probe", tokens, 1)).block_ids


# ---------------------------------------------------------------- block hashes


@pytest.mark.parametrize(("num_tokens", "num_hashes"), [(15, 0), (16, 1), (17, 1), (40, 2)])
def test_only_full_blocks_have_hashes(num_tokens: int, num_hashes: int) -> None:
    assert len(chain_block_hashes(_tokens(1, num_tokens), BS)) == num_hashes


def test_block_hashes_are_chained_on_the_whole_prefix() -> None:
    a = chain_block_hashes(_tokens(1, 16) + _tokens(3, 16), BS)
    b = chain_block_hashes(_tokens(2, 16) + _tokens(3, 16), BS)
    c = chain_block_hashes(_tokens(1, 16) + _tokens(4, 16), BS)
    assert a[1] != b[1]  # same tokens 16..31, different prefix
    assert a[0] == c[0] and a[1] != c[1]


def test_prefix_ids_expand_to_32_blocks_each_and_only_full_blocks() -> None:
    one = block_hashes_from_prefix_ids([7], 512)
    assert len(one) == 32
    two = block_hashes_from_prefix_ids([7, 8], 600)  # 512 + 88 tokens: 32 + 5 full blocks
    assert len(two) == 37 and two[:32] == one
    assert block_hashes_from_prefix_ids([7, 9], 600)[:32] == one
    assert block_hashes_from_prefix_ids([7, 9], 600)[32] != two[32]
    assert block_hashes_from_prefix_ids([6, 8], 600)[32] != two[32]  # chained
    assert len(block_hashes_from_prefix_ids([7], 15)) == 0


def test_a_block_spanning_two_prefix_ids_is_named_by_both() -> None:
    # 24 tokens per id: block 1 (tokens 16..31) overlaps both ids; the ids cover 3 blocks.
    ab = block_hashes_from_prefix_ids([7, 8], 1000, tokens_per_id=24)
    ac = block_hashes_from_prefix_ids([7, 9], 1000, tokens_per_id=24)
    assert len(ab) == 3 and ab[0] == ac[0] and ab[1] != ac[1]


# ---------------------------------------------------------------- hits and sharing


def test_shared_prefix_second_request_hits_and_shares_blocks() -> None:
    h = Harness()
    prefix = _tokens(1, 32)
    a = h.add("a", prefix + _tokens(2, 8), 3)
    h.step()  # a: prefill 40 tokens -> 3 blocks, the 2 full ones cached
    assert a.block_ids == [0, 1, 2] and h.blocks.num_cached_blocks == 2
    b = h.add("b", prefix + _tokens(3, 8), 3)
    out = h.step()
    assert _scheduled(out) == {"a": 1, "b": 8}  # b computes only its last 8 tokens
    assert out.num_prefill_tokens == 8 and out.num_decode_tokens == 1
    assert out.num_kv_tokens == (40 + 1) + (32 + 8)  # b's step reads its cached 32 tokens
    assert b.block_ids == [0, 1, 3] and b.num_computed_tokens == 40
    assert [h.blocks.ref_count(i) for i in range(4)] == [2, 2, 1, 1]
    assert h.blocks.num_used_blocks == 4
    assert (h.blocks.prefix_cache_queries_tokens, h.blocks.prefix_cache_hits_tokens) == (80, 32)
    h.run_to_completion()
    assert h.blocks.num_cached_blocks == 2  # b's blocks duplicate a's or are partly filled
    assert _hit_blocks(h, [*prefix, 1]) == (0, 1)


def test_two_copies_of_a_prefix_are_both_cached_and_the_second_found_once_the_first_goes(
        ) -> None:
    """vLLM's BlockHashToBlockMap does not de-duplicate: a request that computed a prefix at
    the same time as another caches its copy too. Here only the first copy was cached; when
    its owner's blocks were evicted, a later request found nothing that vLLM would find."""
    bm = BlockManager(6, block_size=4, prefix_caching=True)
    hashes = chain_block_hashes(list(range(9)), 4)  # 2 full blocks
    a = Request("a", 9, 1, arrival_s=0.0, block_hashes=hashes)
    b = Request("b", 9, 1, arrival_s=0.0, block_hashes=hashes, index=1)
    assert bm.allocate(a, 4, bm.find_cached_prefix(a)) == [0]  # a's first chunk: block 0
    a.num_computed_tokens = 4
    hit = bm.find_cached_prefix(b)
    assert hit.block_ids == (0,)
    assert bm.allocate(b, 5, hit) == [1, 2]  # b computes the rest: caches block 1 under h1
    b.num_computed_tokens = 9
    assert bm.allocate(a, 5) == [3, 4]  # a's second chunk fills block 3: a copy of block 1
    a.num_computed_tokens = 9
    assert bm.num_cached_blocks == 3
    bm.check_invariants([a, b])
    d = Request("d", 9, 1, arrival_s=0.0, block_hashes=hashes, index=3)
    assert bm.find_cached_prefix(d).block_ids == (0, 1)  # the copy cached first
    bm.free(b)  # b's tail first: 2, then 1 (block 0 is a's too)
    c_hashes = chain_block_hashes([100 + i for i in range(12)], 4)
    c = Request("c", 12, 1, arrival_s=0.0, block_hashes=c_hashes, index=2)
    assert bm.allocate(c, 12, bm.find_cached_prefix(c)) == [5, 2, 1]  # evicts b's copy
    c.num_computed_tokens = 12
    bm.check_invariants([a, c])
    assert bm.find_cached_prefix(d).block_ids == (0, 3)  # a's copy, found now
    bm.free(a)
    bm.free(c)
    bm.check_invariants([])
    assert bm.find_cached_prefix(d) == PrefixHit((0, 3), 8)


def test_eviction_takes_least_recently_freed_first_tail_first() -> None:
    h = Harness(8, max_num_batched_tokens=128)
    a_tokens, b_tokens = _tokens(1, 32), _tokens(2, 32)
    h.add("a", a_tokens, 1)
    h.step()  # a finishes: its 2 blocks are cached-free
    h.add("b", b_tokens, 1)
    h.step()  # b takes the never-used blocks 2, 3, then finishes
    assert h.blocks.num_cached_blocks == 4 and h.blocks.num_free_blocks == 8
    assert _hit_blocks(h, [*a_tokens, 1]) == (0, 1)
    assert _hit_blocks(h, [*b_tokens, 1]) == (2, 3)
    # free queue, least recently freed first: 4 5 6 7 | a: 1 0 | b: 3 2
    d = h.add("d", _tokens(3, 80), 1)
    h.step()  # 5 blocks: the 4 never used, then a's tail block
    assert d.status is RequestStatus.FINISHED and h.blocks.num_free_blocks == 8
    assert _hit_blocks(h, [*a_tokens, 1]) == (0,)
    assert _hit_blocks(h, [*b_tokens, 1]) == (2, 3)
    # queue: 0 | 3 2 | d: 1 7 6 5 4
    h.add("e", _tokens(4, 48), 1)
    h.step()
    assert _hit_blocks(h, [*a_tokens, 1]) == ()
    assert _hit_blocks(h, [*b_tokens, 1]) == ()
    assert _hit_blocks(h, [*_tokens(3, 80), 1]) == (4, 5, 6, 7, 1)


@pytest.mark.parametrize(("prompt", "num_cached", "hit_tokens", "num_blocks"),
                         [(15, 0, 0, 1), (16, 1, 0, 1), (17, 1, 16, 2)])
def test_partly_filled_last_block_is_never_cached(prompt: int, num_cached: int,
                                                  hit_tokens: int, num_blocks: int) -> None:
    h = Harness()
    tokens = _tokens(1, prompt)
    first = h.add("first", tokens, 3)
    h.step()
    assert len(first.block_ids) == num_blocks
    assert h.blocks.num_cached_blocks == num_cached
    h.run_to_completion()  # output tokens fill blocks too: those are never cached
    assert h.blocks.num_cached_blocks == num_cached
    second = h.add("second", tokens, 3)
    out = h.step()
    assert _scheduled(out) == {"second": prompt - hit_tokens}
    assert len(second.block_ids) == num_blocks
    assert h.blocks.prefix_cache_hits_tokens == hit_tokens
    assert h.blocks.prefix_cache_queries_tokens == 2 * prompt
    h.run_to_completion()


def test_whole_prompt_cached_still_computes_its_last_token() -> None:
    h = Harness()
    tokens = _tokens(1, 32)
    h.add("a", tokens, 1)
    h.step()
    # 32 tokens, both blocks cached: the last block is computed again (as vLLM), 16 tokens.
    again = h.add("again", tokens, 2)
    out = h.step()
    assert _scheduled(out) == {"again": 16} and again.num_output_tokens == 1
    # 33 tokens: the 2 cached blocks are hit and only the last token is computed.
    longer = h.add("longer", [*tokens, 1], 2)
    out = h.step()
    assert _scheduled(out) == {"again": 1, "longer": 1}
    assert out.num_prefill_tokens == 1 and out.num_decode_tokens == 1
    assert longer.num_output_tokens == 1 and longer.num_computed_tokens == 33
    assert longer.block_ids[:2] == [0, 1]
    h.run_to_completion()


def test_preempted_request_hits_its_own_blocks_on_readmission() -> None:
    h = Harness(5)
    h.add("a", _tokens(1, 40), 20)
    b = h.add("b", _tokens(2, 20), 30)
    h.step()  # a: 3 blocks, b: 2 blocks; every block in use
    b_first_block = b.block_ids[0]
    for _ in range(8):  # a decodes to 48 tokens; b to 28
        out = h.step()
        assert not out.preempted_request_ids
    out = h.step()  # a's 49th token needs a block: b (the latest) is preempted
    assert out.preempted_request_ids == ("b",) and b.status is RequestStatus.WAITING
    assert h.blocks.num_cached_blocks == 3  # a's 2 and b's first; b's tail was taken by a
    while b.status is RequestStatus.WAITING:
        out = h.step()
    # Re-admitted after a finished: b's first block is hit, the rest recomputed.
    assert b.block_ids[0] == b_first_block
    assert _scheduled(out) == {"b": 20 + 9 - 16}
    assert h.blocks.prefix_cache_preempted_queries_tokens == 29
    assert h.blocks.prefix_cache_preempted_hits_tokens == 16
    assert (h.blocks.prefix_cache_queries_tokens, h.blocks.prefix_cache_hits_tokens) == (60, 0)
    h.run_to_completion()


def test_swapped_out_blocks_stay_cached() -> None:
    h = Harness(5, num_host_blocks=8, preemption="swap")
    h.add("a", _tokens(1, 40), 20)
    b = h.add("b", _tokens(2, 20), 30)
    h.step()
    b_first_block = b.block_ids[0]
    for _ in range(9):  # as above: the 10th step preempts b, here by swapping it out
        out = h.step()
    assert out.preempted_request_ids == ("b",) and b.status is RequestStatus.SWAPPED
    assert b.num_host_blocks == 2
    assert _hit_blocks(h, [*_tokens(2, 16), 1]) == (b_first_block,)
    h.run_to_completion()


def test_caching_off_ignores_hashes_and_changes_nothing() -> None:
    def run(prefix_caching: bool, hashes: bool) -> list[tuple[dict[str, int], tuple[str, ...]]]:
        h = Harness(5, prefix_caching=prefix_caching)
        h.add("a", _tokens(1, 40), 20, hashes=hashes)
        h.add("b", _tokens(1, 20), 30, hashes=hashes)
        steps = []
        for i in range(60):
            if i == 3:
                h.add("c", _tokens(1, 36), 5, hashes=hashes)
            if h.sched.has_unfinished():
                out = h.step()
                steps.append((_scheduled(out), out.preempted_request_ids))
        assert h.blocks.prefix_cache_queries_tokens == (0 if not prefix_caching else 96)
        return steps

    plain = run(False, False)
    assert run(False, True) == plain
    assert run(True, False) == plain  # caching on, but no request names its blocks
    assert run(True, True) != plain
    h = Harness(prefix_caching=False)
    assert h.blocks.find_cached_prefix(_request("r", _tokens(1, 40), 1)) is NO_HIT


def test_reserve_admission_shares_prefix_blocks() -> None:
    h = Harness(admission="reserve", preemption="none")
    prefix = _tokens(1, 32)
    a = h.add("a", [*prefix, 5], 4)  # reserves 33 + 4 - 1 = 36 tokens: 3 blocks
    h.step()
    b = h.add("b", [*prefix, 6], 4)
    out = h.step()
    assert _scheduled(out) == {"a": 1, "b": 1}
    assert b.block_ids[:2] == a.block_ids[:2] and len(b.block_ids) == 3
    assert h.blocks.num_used_blocks == 4
    h.run_to_completion()


def test_config_turns_prefix_caching_on_for_the_scheduler() -> None:
    assert not ReferenceConfig(num_gpu_blocks=8).scheduler_config().prefix_caching
    config = ReferenceConfig(num_gpu_blocks=8, prefix_caching=True).scheduler_config()
    assert config.prefix_caching
    blocks = BlockManager(8, BS)
    Scheduler(config, blocks)
    assert blocks.prefix_caching


def test_enabling_prefix_caching_needs_an_empty_cache() -> None:
    bm = BlockManager(4, BS)
    r = _request("r", _tokens(1, 20), 1)
    assert bm.allocate(r, 20) == [0, 1]
    with pytest.raises(InvariantError, match="no block is held"):
        bm.enable_prefix_caching()
    bm.free(r)
    bm.enable_prefix_caching()
    assert bm.num_free_blocks == 4 and bm.prefix_caching


# ---------------------------------------------------------------- properties


@dataclass(frozen=True)
class Case:
    config: SchedulerConfig
    block_size: int
    num_blocks: int
    num_host_blocks: int
    # (arrival step, shared prefix: which and how long, own suffix length, output, priority)
    requests: tuple[tuple[int, int, int, int, int, int], ...]

    def prompts(self) -> list[list[int]]:
        return [_tokens(base, shared) + _tokens(100 + i, own)
                for i, (_, base, shared, own, _, _) in enumerate(self.requests)]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    policy = draw(st.sampled_from(["fcfs", "fcfs", "priority", "static"]))
    admission = "reserve" if policy == "static" else draw(st.sampled_from(
        ["optimistic", "optimistic", "reserve"]))
    preemption = "none" if admission == "reserve" else draw(st.sampled_from(
        ["recompute", "recompute", "swap"]))
    max_num_seqs = draw(st.integers(1, 6))
    chunked = policy != "static" and draw(st.booleans())
    budget = draw(st.integers(max(max_num_seqs, 16), 160 if chunked else 256))
    block_size = draw(st.sampled_from([4, 16]))
    requests = draw(st.lists(
        st.tuples(st.integers(0, 8), st.integers(1, 3), st.integers(0, 96), st.integers(1, 40),
                  st.integers(1, 40), st.integers(0, 2)),
        min_size=1, max_size=14))
    return Case(
        config=SchedulerConfig(policy=policy, admission=admission, preemption=preemption,
                               max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                               chunked_prefill=chunked,
                               max_model_len=draw(st.integers(64, 512)) if chunked else budget,
                               prefix_caching=True),
        block_size=block_size,
        num_blocks=max(1, draw(st.integers(48, 320)) // block_size),
        num_host_blocks=draw(st.integers(0, 160)) // block_size,
        requests=tuple(requests),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_with_caching_every_request_completes_and_no_block_leaks(case: Case) -> None:
    blocks = BlockManager(case.num_blocks, case.block_size, case.num_host_blocks)
    sched = Scheduler(case.config, blocks)
    reqs = [Request(f"r{i}", len(tokens), spec[4], arrival_s=float(spec[0]), priority=spec[5],
                    index=i, block_hashes=chain_block_hashes(tokens, case.block_size))
            for i, (tokens, spec) in enumerate(zip(case.prompts(), case.requests, strict=True))]
    pending = sorted(reqs, key=lambda r: (r.arrival_s, r.index))
    step_no, now_s = 0, 0.0
    while pending or sched.has_unfinished():
        while pending and pending[0].arrival_s <= step_no:
            sched.add_request(pending.pop(0))
        step_no += 1
        assert step_no < 20_000, "the scheduler made no progress"
        if not sched.has_unfinished():
            continue
        out = sched.schedule()
        assert out.num_scheduled_tokens + out.num_padded_tokens \
            <= case.config.max_num_batched_tokens
        now_s = sched.update_from_output(out, ExecutorOutput(0.01), now_s).end_s
        sched.check_invariants()
    event(f"hits: {blocks.prefix_cache_hits_tokens > 0}; preempted hits: "
          f"{blocks.prefix_cache_preempted_hits_tokens > 0}")
    assert blocks.num_free_blocks == case.num_blocks
    assert blocks.num_free_host_blocks == case.num_host_blocks
    assert all(blocks.ref_count(i) == 0 for i in range(case.num_blocks))
    assert 0 <= blocks.prefix_cache_hits_tokens <= blocks.prefix_cache_queries_tokens
    assert blocks.prefix_cache_hits_tokens % case.block_size == 0
    for r in reqs:
        assert r.status in (RequestStatus.FINISHED, RequestStatus.REJECTED)
        if r.status is RequestStatus.FINISHED:
            assert r.num_output_tokens == r.max_output_tokens == len(sched.token_times_s(r))


def _drive(config: ReferenceConfig, case: Case, *, decode_spans: bool
           ) -> tuple[list[list[float]], pa.Table, tuple[int, int], int]:
    """The simulation loop on EngineCore, with requests that name their prompt blocks."""
    core = EngineCore(config)
    reqs = [Request(f"r{i}", len(tokens), spec[4], arrival_s=spec[0] * 0.02, priority=spec[5],
                    index=i, block_hashes=chain_block_hashes(tokens, config.block_size))
            for i, (tokens, spec) in enumerate(zip(case.prompts(), case.requests, strict=True))]
    order = sorted(reqs, key=lambda r: (r.arrival_s, r.index))
    now, i, num_spans = 0.0, 0, 0
    while i < len(order) or core.has_unfinished():
        while i < len(order) and order[i].arrival_s <= now:
            core.add_request(order[i])
            i += 1
        if not core.has_unfinished():
            if i == len(order):
                break
            now = order[i].arrival_s
            continue
        until = order[i].arrival_s if i < len(order) else math.inf
        end = core.run_decode_span(now, until) if decode_spans else None
        num_spans += end is not None
        now = core.step(now).end_s if end is None else end
        core.check_invariants()
    stats = (core.blocks.prefix_cache_queries_tokens, core.blocks.prefix_cache_hits_tokens)
    return ([core.scheduler.token_times_s(r) for r in reqs], core.steps.to_table(), stats,
            num_spans)


# A request holds block 2 of a cached chain but its own copy of block 1 (it computed the
# prefix at the same time as another): the held blocks of a hit are not a leading run.
_HELD_NOT_LEADING = Case(
    SchedulerConfig(preemption="swap", max_num_seqs=5, max_num_batched_tokens=75,
                    chunked_prefill=False, max_model_len=75, prefix_caching=True),
    block_size=4, num_blocks=41, num_host_blocks=0,
    requests=((0, 1, 0, 1, 1, 0),) * 8 + ((0, 1, 0, 22, 26, 0), (0, 1, 0, 27, 28, 0),
                                           (0, 1, 0, 1, 1, 0), (2, 1, 4, 1, 21, 0),
                                           (2, 1, 24, 40, 11, 0), (2, 1, 8, 25, 1, 0)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
@example(_HELD_NOT_LEADING)
def test_with_caching_decode_spans_never_change_results(case: Case) -> None:
    c = case.config
    config = ReferenceConfig(
        policy=c.policy, preemption=c.preemption, max_num_seqs=c.max_num_seqs,
        max_num_batched_tokens=c.max_num_batched_tokens, chunked_prefill=c.chunked_prefill,
        max_model_len=c.max_model_len, num_gpu_blocks=case.num_blocks,
        block_size=case.block_size, swap_space_gib=0.01, prefix_caching=True)
    fast = _drive(config, case, decode_spans=True)
    slow = _drive(config, case, decode_spans=False)
    event(f"spans: {fast[3] > 0}; hits: {fast[2][1] > 0}")
    assert fast[0] == slow[0]
    assert fast[1].equals(slow[1])
    assert fast[2] == slow[2]
