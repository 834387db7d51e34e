"""The prefix-cache invariant checker (``BlockManager.check_invariants`` with caching on) must
catch each kind of corrupted bookkeeping: every test builds a real cache state through
allocations and frees, checks it passes, corrupts one thing and expects that check's error."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from adapters.reference.blocks import BlockManager, InvariantError, PrefixHit
from adapters.reference.request import Request, chain_block_hashes

BS = 4


@dataclass
class State:
    bm: BlockManager
    a: Request  # holds blocks [0, 3, 4]: 0 shared with b, 3 a copy of b's block 1
    b: Request  # holds blocks [0, 1, 2]: 1 cached under h1, 2 partly filled (uncached)
    e: Request  # waiting; its kept lookup found c's freed blocks (5, 6)
    hashes: tuple[int, ...]  # a's and b's prompt blocks: h0, h1
    c_hashes: tuple[int, ...]  # c's two full blocks, cached in the freed blocks 5 and 6

    @property
    def holders(self) -> list[Request]:
        return [self.a, self.b]


def _state() -> State:
    """8 blocks of 4 tokens, 2 host blocks: held shared, held alone, a copy, a partly filled
    block, cached-free and plain-free blocks, and a kept lookup, all from real transitions."""
    bm = BlockManager(8, block_size=BS, num_host_blocks=2, prefix_caching=True)
    hashes = chain_block_hashes(list(range(9)), BS)  # 2 full blocks
    a = Request("a", 9, 1, arrival_s=0.0, block_hashes=hashes)
    b = Request("b", 9, 1, arrival_s=0.0, block_hashes=hashes, index=1)
    assert bm.allocate(a, 4, bm.find_cached_prefix(a)) == [0]
    a.num_computed_tokens = 4
    hit = bm.find_cached_prefix(b)
    assert hit.block_ids == (0,)
    assert bm.allocate(b, 5, hit) == [1, 2]
    b.num_computed_tokens = 9
    assert bm.allocate(a, 5) == [3, 4]  # fills block 3: a second copy cached under h1
    a.num_computed_tokens = 9
    c_tokens = [100 + i for i in range(11)]
    c_hashes = chain_block_hashes(c_tokens, BS)  # 11 tokens: 2 full blocks, 1 partial
    c = Request("c", 11, 1, arrival_s=0.0, block_hashes=c_hashes, index=2)
    assert bm.allocate(c, 11, bm.find_cached_prefix(c)) == [5, 6, 7]
    c.num_computed_tokens = 11
    bm.free(c)  # 7 (uncached), then 6 and 5 (cached) join the free queue
    e_hashes = chain_block_hashes([*c_tokens[:8], 500, 501, 502, 503, 504], BS)
    e = Request("e", 13, 1, arrival_s=0.0, block_hashes=e_hashes, index=3)
    assert bm.find_cached_prefix(e) == PrefixHit((5, 6), 8)  # kept as the last lookup
    state = State(bm, a, b, e, hashes, c_hashes)
    # the state the corruptions start from is sound, and has every part they corrupt
    assert [bm.ref_count(i) for i in range(8)] == [2, 1, 1, 1, 1, 0, 0, 0]
    assert list(bm._free_queue) == [7, 6, 5]
    assert bm._block_hash == [hashes[0], hashes[1], None, hashes[1], None,
                              c_hashes[0], c_hashes[1], None]
    assert bm._cached_block_ids == {hashes[0]: 0, hashes[1]: 1, c_hashes[0]: 5,
                                    c_hashes[1]: 6}
    assert bm._copies == {hashes[1]: [3]}
    assert bm._lookup is not None and bm._lookup.request is e
    assert bm.num_cached_blocks == 5 and bm.num_free_host_blocks == 2
    bm.check_invariants(state.holders)
    return state


def _bump_ref_count(s: State) -> None:
    s.bm._ref_counts[2] += 1


def _drop_ref_count(s: State) -> None:
    s.bm._ref_counts[0] -= 1  # shared by a and b: 1 is still "held", but by whom?


def _held_block_into_free_queue(s: State) -> None:
    s.bm._free_queue[2] = None  # b still holds it: free + held exceeds the total


def _held_block_swapped_into_free_queue(s: State) -> None:
    # the counts still add up: only "a held block is in the free queue" can catch it
    del s.bm._free_queue[7]
    s.bm._free_queue[2] = None


def _free_block_lost(s: State) -> None:
    del s.bm._free_queue[7]  # neither held nor free


def _held_block_cached_under_a_wrong_hash(s: State) -> None:
    s.bm._block_hash[0] = s.c_hashes[0]  # a's and b's block 0 is named by h0


def _uncached_held_block_given_a_hash(s: State) -> None:
    s.bm._block_hash[2] = s.hashes[1]  # b's partly filled block 2 was never offered


def _free_block_cached_under_a_wrong_hash(s: State) -> None:
    s.bm._block_hash[5] = s.c_hashes[1]  # the map says 5 is c's first block


def _stale_map_entry(s: State) -> None:
    s.bm._block_hash[6] = None  # evicted as _take_cached would, but the map still finds it


def _stale_copy(s: State) -> None:
    # the copies list names block 7 (plain free) where block 3 is the copy of h1: the
    # number of hashed blocks still matches the map's
    s.bm._copies[s.hashes[1]] = [7]


def _copy_of_an_uncached_hash(s: State) -> None:
    # block 1 uncached as _uncache would, except that its copy (block 3) was not promoted:
    # every block's hash is still in the map or a copies list, and the counts agree
    del s.bm._cached_block_ids[s.hashes[1]]
    s.bm._block_hash[1] = None


def _empty_copies_list(s: State) -> None:
    s.bm._copies[s.c_hashes[0]] = []


def _hash_outside_the_map(s: State) -> None:
    s.bm._block_hash[7] = 12345  # a free block named by a hash the map does not know


def _stale_lookup(s: State) -> None:
    # evicting block 6 without forgetting the lookup that found it
    lookup = s.bm._lookup
    assert lookup is not None
    s.bm._lookup = lookup._replace(hit=PrefixHit((5,), 4))


def _host_block_lost(s: State) -> None:
    s.bm.num_free_host_blocks -= 1


def _block_held_twice(s: State) -> None:
    s.b.block_ids.append(0)


def _block_out_of_range(s: State) -> None:
    s.b.block_ids.append(8)


CORRUPTIONS: list[tuple[Callable[[State], None], str]] = [
    (_bump_ref_count, "a block's ref count differs from the requests holding it"),
    (_drop_ref_count, "a block's ref count differs from the requests holding it"),
    (_held_block_into_free_queue,
     r"GPU blocks: 4 free \+ 5 held != 8 total, or a held block is in the free queue"),
    (_held_block_swapped_into_free_queue,
     r"GPU blocks: 3 free \+ 5 held != 8 total, or a held block is in the free queue"),
    (_free_block_lost,
     r"GPU blocks: 2 free \+ 5 held != 8 total, or a held block is in the free queue"),
    (_held_block_cached_under_a_wrong_hash, r"'a'.*: block 0 is cached under another hash"),
    (_uncached_held_block_given_a_hash, r"'b'.*: block 2 is cached under another hash"),
    (_free_block_cached_under_a_wrong_hash,
     "the hash -> block map and the blocks' hashes disagree"),
    (_stale_map_entry, "the hash -> block map and the blocks' hashes disagree"),
    (_stale_copy, "the hash -> block map and the blocks' hashes disagree"),
    (_copy_of_an_uncached_hash, "the hash -> block map and the blocks' hashes disagree"),
    (_empty_copies_list, "the hash -> block map and the blocks' hashes disagree"),
    (_hash_outside_the_map, "the hash -> block map and the blocks' hashes disagree"),
    (_stale_lookup, r"a kept lookup for .*'e'.* is out of date"),
    (_host_block_lost, r"host blocks: 1 free \+ 0 held != 2 total"),
    (_block_held_twice, r"'b'.* holds a block twice or out of range"),
    (_block_out_of_range, r"'b'.* holds a block twice or out of range"),
]


@pytest.mark.parametrize(("corrupt", "message"), CORRUPTIONS,
                         ids=[f.__name__.strip("_") for f, _ in CORRUPTIONS])
def test_check_invariants_catches_one_corruption(corrupt: Callable[[State], None],
                                                 message: str) -> None:
    s = _state()
    corrupt(s)
    with pytest.raises(InvariantError, match=message):
        s.bm.check_invariants(s.holders)


def test_a_request_left_out_of_the_holders_is_a_ref_count_mismatch() -> None:
    s = _state()
    with pytest.raises(InvariantError, match="ref count differs"):
        s.bm.check_invariants([s.a])


def test_a_stale_lookup_from_a_real_eviction_is_caught() -> None:
    """A bug that evicts a found block without forgetting the kept lookup (here: the
    forgetting switched off) is what the lookup check is for; with the forgetting on, the
    same eviction leaves a sound state."""
    for forget in (True, False):
        s = _state()
        if not forget:
            s.bm._forget_lookup = lambda block_id, block_hash: None  # type: ignore[method-assign]
        f = Request("f", 8, 1, arrival_s=0.0, index=4)  # (no lookup: it would replace e's)
        assert s.bm.allocate(f, 8) == [7, 6]  # evicts block 6, which e's lookup found
        if forget:
            s.bm.check_invariants([*s.holders, f])
            assert s.bm.find_cached_prefix(s.e) == PrefixHit((5,), 4)
        else:
            with pytest.raises(InvariantError, match=r"kept lookup .* is out of date"):
                s.bm.check_invariants([*s.holders, f])


def test_a_lookup_kept_for_a_request_that_grew_is_not_checked() -> None:
    """find_cached_prefix redoes a lookup whose request's token count changed, so such a
    kept lookup can be out of date without harm."""
    s = _state()
    _stale_lookup(s)
    s.e.num_output_tokens += 1  # e sampled a token: num_tokens grew
    s.bm.check_invariants(s.holders)
