"""BlockManager: exact block counts, "does not fit" as None, swap bookkeeping, invariants."""

from __future__ import annotations

import pytest

from adapters.reference.blocks import BlockManager, InvariantError
from adapters.reference.request import Request


def _request(computed: int = 0, name: str = "r") -> Request:
    r = Request(name, num_prompt_tokens=100, max_output_tokens=10)
    r.num_computed_tokens = computed
    return r


@pytest.mark.parametrize(("num_tokens", "num_blocks"), [(1, 1), (15, 1), (16, 1), (17, 2),
                                                        (32, 2), (33, 3)])
def test_blocks_for_token_counts(num_tokens: int, num_blocks: int) -> None:
    bm = BlockManager(10, block_size=16)
    r = _request()
    assert bm.allocate(r, num_tokens) is not None
    assert len(r.block_ids) == num_blocks
    assert bm.num_free_blocks == 10 - num_blocks
    bm.check_invariants([r])


def test_allocate_grows_only_at_block_boundaries() -> None:
    bm = BlockManager(10, block_size=16)
    r = _request()
    assert bm.allocate(r, 15) == [0]
    r.num_computed_tokens = 15
    assert bm.allocate(r, 1) == []  # token 16 still fits in block 0
    r.num_computed_tokens = 16
    assert bm.allocate(r, 1) == [1]  # token 17 opens block 1
    r.num_computed_tokens = 17
    assert len(r.block_ids) == 2
    bm.check_invariants([r])


def test_allocate_returns_none_and_changes_nothing_when_short() -> None:
    bm = BlockManager(2, block_size=16)
    a, b = _request(name="a"), _request(name="b")
    assert bm.allocate(a, 32) == [0, 1]
    assert bm.allocate(b, 1) is None
    assert b.block_ids == [] and bm.num_free_blocks == 0
    bm.free(a)
    assert bm.num_free_blocks == 2 and a.block_ids == []
    bm.check_invariants([a, b])


def test_allocate_all_is_all_or_nothing() -> None:
    bm = BlockManager(3, block_size=4)
    a, b = _request(4, "a"), _request(4, "b")
    assert bm.allocate(a, 0) is not None and bm.allocate(b, 0) is not None
    assert bm.allocate(a, 0) == []
    assert bm.reserve(a, 4) == [] and len(a.block_ids) == 1
    assert not bm.allocate_all([a, b], 4)  # each needs 1 more, only 1 free
    assert len(a.block_ids) == 1 and len(b.block_ids) == 1
    assert bm.allocate_all([a], 4)
    bm.check_invariants([a, b])


def test_swap_out_and_in_move_blocks_through_the_host() -> None:
    bm = BlockManager(4, block_size=16, num_host_blocks=3)
    r = _request(40)
    bm.allocate(r, 0)
    assert len(r.block_ids) == 3
    assert bm.swap_out(r) == 3
    assert r.block_ids == [] and r.num_host_blocks == 3
    assert bm.num_free_blocks == 4 and bm.num_free_host_blocks == 0
    bm.check_invariants([r])
    assert bm.swap_in(r, 1) is not None  # 41 tokens: still 3 blocks
    assert len(r.block_ids) == 3 and r.num_host_blocks == 0 and bm.num_free_host_blocks == 3
    bm.check_invariants([r])


def test_swap_out_copies_only_computed_tokens_and_refuses_when_host_full() -> None:
    bm = BlockManager(4, block_size=16, num_host_blocks=1)
    r = _request(16)
    bm.allocate(r, 1)  # this step's token opened a second block
    assert len(r.block_ids) == 2
    assert bm.swap_out(r) == 1  # only the block of the 16 computed tokens is copied
    assert bm.num_free_blocks == 4
    other = _request(20, "o")
    bm.allocate(other, 0)
    assert bm.swap_out(other) is None  # host full: the caller recomputes instead
    assert len(other.block_ids) == 2
    bm.check_invariants([r, other])


def test_check_invariants_catches_a_leak() -> None:
    bm = BlockManager(4, block_size=16)
    r = _request()
    bm.allocate(r, 20)
    with pytest.raises(InvariantError):
        bm.check_invariants([])  # r's blocks are neither free nor held by a known request
