"""All KV-block accounting of the reference engine, in one class.

The KV cache is ``num_gpu_blocks`` blocks of ``block_size`` token slots. A request's blocks
are listed in order in ``request.block_ids``; token ``t`` lives in block ``t // block_size``::

    block_size = 16, num_computed_tokens = 35        -> ceil(35 / 16) = 3 blocks
    request.block_ids = [7, 2, 9]
        block 7: tokens  0..15   (full)
        block 2: tokens 16..31   (full)
        block 9: tokens 32..34   (3 of 16 slots used; token 35 will fit, token 48 will not)

A swapped-out request keeps its KV in ``request.num_host_blocks`` host blocks instead (counts
only: the host pool is ``num_host_blocks`` blocks, sized from ``swap_space_gib``).

"Does not fit" is a return value (``None``), never an exception. Blocks are released through
``free`` (a terminal transition or a recompute preemption) or ``swap_out``; nothing else
touches ``block_ids``.
"""

from __future__ import annotations

from collections.abc import Iterable

from adapters.reference.request import Request


class InvariantError(AssertionError):
    """An internal consistency check failed: a bug in the engine, never a user error."""


class BlockManager:
    def __init__(self, num_gpu_blocks: int, block_size: int = 16, num_host_blocks: int = 0) -> None:
        if num_gpu_blocks < 1 or block_size < 1 or num_host_blocks < 0:
            raise ValueError("num_gpu_blocks and block_size must be >= 1, num_host_blocks >= 0")
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.num_host_blocks = num_host_blocks
        # A stack: the lowest ids come out first, which keeps test output readable.
        self._free_block_ids: list[int] = list(range(num_gpu_blocks - 1, -1, -1))
        self.num_free_host_blocks = num_host_blocks

    # ---- queries

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_gpu_blocks - len(self._free_block_ids)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def num_blocks_to_allocate(self, request: Request, num_new_tokens: int) -> int:
        """Blocks ``allocate`` would add for ``num_new_tokens`` more tokens (0 if they fit)."""
        need = (self.blocks_for(request.num_computed_tokens + num_new_tokens)
                - len(request.block_ids))
        return need if need > 0 else 0

    # ---- transitions

    def allocate(self, request: Request, num_new_tokens: int) -> list[int] | None:
        """Grow ``request`` to hold ``num_computed_tokens + num_new_tokens`` tokens.

        Returns the new block ids (empty when the held blocks suffice), or None when there are
        not enough free blocks; then nothing changes.
        """
        need = (self.blocks_for(request.num_computed_tokens + num_new_tokens)
                - len(request.block_ids))
        if need <= 0:
            return []
        if need > len(self._free_block_ids):
            return None
        new = self._take(need)
        request.block_ids.extend(new)
        return new

    def allocate_all(self, requests: list[Request], num_new_tokens: int) -> bool:
        """``allocate(r, num_new_tokens)`` for each request, all or nothing; False if short."""
        bs = self.block_size
        needs = [-(-(r.num_computed_tokens + num_new_tokens) // bs) - len(r.block_ids)
                 for r in requests]
        free = self._free_block_ids
        if sum(n for n in needs if n > 0) > len(free):
            return False
        for r, need in zip(requests, needs, strict=True):
            if need > 0:
                r.block_ids.extend(self._take(need))
        return True

    def reserve(self, request: Request, num_tokens: int) -> list[int] | None:
        """Hold blocks for ``num_tokens`` tokens now (reserve admission); None if they don't fit."""
        need = self.blocks_for(num_tokens) - len(request.block_ids)
        if need <= 0:
            return []
        if need > len(self._free_block_ids):
            return None
        new = self._take(need)
        request.block_ids.extend(new)
        return new

    def _take(self, num_blocks: int) -> list[int]:
        free = self._free_block_ids
        new = free[-num_blocks:]
        del free[-num_blocks:]
        new.reverse()
        return new

    def free(self, request: Request) -> None:
        """Release everything ``request`` holds, on the GPU and on the host."""
        self._free_block_ids.extend(reversed(request.block_ids))
        request.block_ids = []
        self.num_free_host_blocks += request.num_host_blocks
        request.num_host_blocks = 0

    def swap_out(self, request: Request) -> int | None:
        """Copy ``request``'s computed KV to host memory: the blocks moved (None: host full).

        Blocks allocated for tokens not computed yet (this step's) are freed, not copied.
        """
        num_blocks = self.blocks_for(request.num_computed_tokens)
        if num_blocks > self.num_free_host_blocks:
            return None
        self.num_free_host_blocks -= num_blocks
        request.num_host_blocks = num_blocks
        self._free_block_ids.extend(reversed(request.block_ids))
        request.block_ids = []
        return num_blocks

    def swap_in(self, request: Request, num_new_tokens: int) -> list[int] | None:
        """Bring a swapped request back with room for ``num_new_tokens`` more tokens, or None."""
        new = self.allocate(request, num_new_tokens)
        if new is None:
            return None
        self.num_free_host_blocks += request.num_host_blocks
        request.num_host_blocks = 0
        return new

    # ---- invariants

    def check_invariants(self, holders: Iterable[Request]) -> None:
        """free + held == total on the GPU and on the host; no block held twice or out of range."""
        held: list[int] = []
        num_host_held = 0
        for request in holders:
            held.extend(request.block_ids)
            num_host_held += request.num_host_blocks
        ids = held + self._free_block_ids
        if len(ids) != self.num_gpu_blocks or set(ids) != set(range(self.num_gpu_blocks)):
            raise InvariantError(
                f"GPU blocks: {len(self._free_block_ids)} free + {len(held)} held != "
                f"{self.num_gpu_blocks} total, or a block is held twice")
        if num_host_held + self.num_free_host_blocks != self.num_host_blocks:
            raise InvariantError(
                f"host blocks: {self.num_free_host_blocks} free + {num_host_held} held != "
                f"{self.num_host_blocks} total")
