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

Prefix caching (off by default) follows vLLM V1's ``KVCacheManager`` and ``BlockPool``. Full
prompt blocks are named by chained hashes (``request.block_hashes``, see request.py)::

    held (ref count = requests holding it) --last holder frees--> free, cached (hash kept)
    free, cached --a lookup hits it--> held again (shared)
    free, cached --allocation takes it (least recently freed first)--> evicted: plain free

- A block is offered to the cache when the tokens scheduled for it fill it (as vLLM: at
  allocation, so a request admitted later in the same step can share it). A partly filled
  block is never cached. Two requests that computed the same prefix at the same time each
  cache their copy, as vLLM's ``BlockHashToBlockMap`` does (it does not de-duplicate): a
  lookup finds the copy cached first, and when that one is evicted, the next.
- A lookup (``find_cached_prefix``, at admission only) takes the longest run of leading cached
  blocks, but never the whole prompt: at least its last token is computed, to sample from.
- Free blocks, cached or not, queue in the order they were freed; allocation takes the least
  recently freed. A request frees its blocks tail first, so its tail is evicted first.
- Freeing a request (finish, preemption, swap-out) keeps the hashes of the blocks its computed
  tokens fill; a block offered this step whose tokens were never computed (the request was
  preempted before its step ran) is dropped from the cache.

A run whose requests carry no block hashes at all (a trace of lengths only: Azure, ShareGPT,
synthetic) can never cache a block, so the order of the free blocks decides nothing but their
ids. ``expect_no_prefix_ids`` then keeps them on the plain stack: lookups are still counted
(every one a miss), and every count and every schedule is the one the free queue gives.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from adapters.reference.request import Request


class InvariantError(AssertionError):
    """An internal consistency check failed: a bug in the engine, never a user error."""


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """A request's leading full prompt blocks found in the prefix cache."""

    block_ids: tuple[int, ...]  # in prompt order; held by running requests or cached-free
    num_tokens: int  # len(block_ids) * block_size: prompt tokens whose KV needs no compute


NO_HIT = PrefixHit((), 0)


class _Lookup(NamedTuple):
    """The last ``find_cached_prefix``: valid while none of its hashes changes."""

    request: Request
    num_tokens: int
    hit: PrefixHit
    block_ids: frozenset[int]  # the hit's blocks: evicting one shrinks it
    next_hash: int | None  # the first hash not found: caching it grows the hit


class BlockManager:
    def __init__(self, num_gpu_blocks: int, block_size: int = 16, num_host_blocks: int = 0,
                 *, prefix_caching: bool = False) -> None:
        if num_gpu_blocks < 1 or block_size < 1 or num_host_blocks < 0:
            raise ValueError("num_gpu_blocks and block_size must be >= 1, num_host_blocks >= 0")
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.num_host_blocks = num_host_blocks
        # A stack: the lowest ids come out first, which keeps test output readable.
        self._free_block_ids: list[int] = list(range(num_gpu_blocks - 1, -1, -1))
        self.num_free_host_blocks = num_host_blocks
        # Prefix caching state (see enable_prefix_caching).
        self.prefix_caching = False
        self._lru = False  # free blocks in the least-recently-freed queue (not the stack)
        self._free_queue: OrderedDict[int, None] = OrderedDict()
        self._ref_counts: list[int] = []
        self._block_hash: list[int | None] = []
        self._cached_block_ids: dict[int, int] = {}
        self._copies: dict[int, list[int]] = {}
        self._lookup: _Lookup | None = None
        # Lookups at admission, in tokens, as vLLM's vllm:prefix_cache_queries / _hits count
        # them: ``queries`` += the request's tokens, ``hits`` += the tokens found cached. A
        # request re-admitted after a recompute preemption counts in the ``preempted`` pair.
        self.prefix_cache_queries_tokens = 0
        self.prefix_cache_hits_tokens = 0
        self.prefix_cache_preempted_queries_tokens = 0
        self.prefix_cache_preempted_hits_tokens = 0
        if prefix_caching:
            self.enable_prefix_caching()

    def enable_prefix_caching(self) -> None:
        """Turn prefix caching on; only while no block is held."""
        if self.prefix_caching:
            return
        if self.num_used_blocks:
            raise InvariantError("prefix caching can only be turned on while no block is held")
        n = self.num_gpu_blocks
        self.prefix_caching = self._lru = True
        # Every free block, least recently freed first (vLLM's FreeKVCacheBlockQueue): the
        # stack is not used while caching.
        self._free_queue = OrderedDict.fromkeys(range(n))
        self._free_block_ids = []
        self._ref_counts = [0] * n  # running requests holding each block
        self._block_hash = [None] * n  # the hash a block is cached under, if any
        self._cached_block_ids = {}  # hash -> the block a lookup finds under it
        self._copies = {}  # hash -> further blocks cached under it, first cached first
        self._lookup = None

    def expect_no_prefix_ids(self) -> None:
        """No request of this run will carry block hashes (module doc): free blocks go back
        on the stack, lookups are counted as misses. Only while no block is held."""
        if not self.prefix_caching or not self._lru:
            return
        if self.num_used_blocks:
            raise InvariantError("the free blocks can only be restacked while none is held")
        self._lru = False
        self._free_queue = OrderedDict()
        self._free_block_ids = list(range(self.num_gpu_blocks - 1, -1, -1))

    # ---- queries

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds (cached-free ones included: they are evictable)."""
        if self._lru:
            return len(self._free_queue)
        return len(self._free_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_gpu_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks cached under a hash, held or free (copies of one prefix included)."""
        return len(self._cached_block_ids) + sum(map(len, self._copies.values()))

    def ref_count(self, block_id: int) -> int:
        """Running requests holding ``block_id`` (prefix caching only)."""
        return self._ref_counts[block_id]

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def num_blocks_to_allocate(self, request: Request, num_new_tokens: int) -> int:
        """Blocks ``allocate`` would add for ``num_new_tokens`` more tokens (0 if they fit)."""
        need = (self.blocks_for(request.num_computed_tokens + num_new_tokens)
                - len(request.block_ids))
        return need if need > 0 else 0

    def find_cached_prefix(self, request: Request, *, held_only: bool = False) -> PrefixHit:
        """The longest run of ``request``'s leading prompt blocks in the cache (vLLM's
        ``get_computed_blocks``); NO_HIT when caching is off or the request has progress.

        Never the whole prompt: at least the last token is left to compute. ``held_only``
        stops at the first block no running request holds (one that eviction cannot take).
        """
        if not self.prefix_caching or request.num_computed_tokens or request.num_host_blocks:
            return NO_HIT
        if not self._lru:
            if request.block_hashes:
                raise InvariantError(f"{request!r} has block hashes in a run expected to have "
                                     "none (expect_no_prefix_ids)")
            return NO_HIT
        # The waiting head is looked up every step until it fits, and prompts run to thousands
        # of blocks: the last lookup is kept until a block it found is evicted or the hash
        # after them is cached (see _forget_lookup).
        lookup = self._lookup
        if lookup is None or lookup.request is not request or \
                lookup.num_tokens != request.num_tokens:
            lookup = self._lookup = self._look_up(request)
        hit = lookup.hit
        if held_only and hit.block_ids:
            refs = list(map(self._ref_counts.__getitem__, hit.block_ids))
            if 0 in refs:
                k = refs.index(0)
                hit = PrefixHit(hit.block_ids[:k], k * self.block_size) if k else NO_HIT
        return hit

    def _look_up(self, request: Request) -> _Lookup:
        hashes, cached = request.block_hashes, self._cached_block_ids
        hit: list[int] = []
        next_hash = None
        for i in range(min(len(hashes), (request.num_tokens - 1) // self.block_size)):
            block_id = cached.get(hashes[i])
            if block_id is None:
                next_hash = hashes[i]
                break
            hit.append(block_id)
        return _Lookup(request, request.num_tokens,
                       PrefixHit(tuple(hit), len(hit) * self.block_size) if hit else NO_HIT,
                       frozenset(hit), next_hash)

    def _forget_lookup(self, block_id: int, block_hash: int) -> None:
        """``block_id`` was evicted from, or cached under ``block_hash`` in, the cache."""
        lookup = self._lookup
        if lookup is not None and (block_id in lookup.block_ids
                                   or block_hash == lookup.next_hash):
            self._lookup = None

    def num_held_blocks(self, block_ids: tuple[int, ...]) -> int:
        """Blocks of a hit that running requests hold: sharing them takes no free block.

        Not always a leading run: a request that computed a prefix at the same time as
        another holds its own copy of a block whose hash names the other's.
        """
        refs = list(map(self._ref_counts.__getitem__, block_ids))
        return len(refs) - refs.count(0)

    # ---- transitions

    def allocate(self, request: Request, num_new_tokens: int,
                 hit: PrefixHit | None = None) -> list[int] | None:
        """Grow ``request`` to hold ``num_computed_tokens + num_new_tokens`` tokens.

        At admission the caller passes the request's ``find_cached_prefix`` hit (NO_HIT for
        none): its blocks come first and its tokens count as computed (the caller then adds
        ``hit.num_tokens`` to ``num_computed_tokens``). Returns the new block ids (empty when
        the held blocks suffice), or None when there are not enough free blocks; then nothing
        changes.
        """
        if self._lru:
            filled = request.num_computed_tokens + (hit.num_tokens if hit else 0) + num_new_tokens
            return self._grow_cached(request, filled, filled, hit)
        return self._grow_plain(
            request, self.blocks_for(request.num_computed_tokens + num_new_tokens), hit)

    def allocate_all(self, requests: list[Request], num_new_tokens: int) -> bool:
        """``allocate(r, num_new_tokens)`` for each request, all or nothing; False if short.

        For decode only: the new tokens are generated ones, which fill no prompt block.
        """
        bs = self.block_size
        needs = [-(-(r.num_computed_tokens + num_new_tokens) // bs) - len(r.block_ids)
                 for r in requests]
        if sum(n for n in needs if n > 0) > self.num_free_blocks:
            return False
        for r, need in zip(requests, needs, strict=True):
            if need > 0:
                r.block_ids.extend(self._take(need))
        return True

    def reserve(self, request: Request, num_tokens: int, num_new_tokens: int = 0,
                hit: PrefixHit | None = None) -> list[int] | None:
        """Hold blocks for ``num_tokens`` tokens now (reserve admission); None if they don't fit.

        ``num_new_tokens`` are scheduled now on top of the computed ones and ``hit`` (as in
        ``allocate``); they say which blocks the step fills, for the prefix cache.
        """
        if self._lru:
            filled = request.num_computed_tokens + (hit.num_tokens if hit else 0) + num_new_tokens
            return self._grow_cached(request, num_tokens, filled, hit)
        return self._grow_plain(request, self.blocks_for(num_tokens), hit)

    def _grow_plain(self, request: Request, num_blocks: int,
                    hit: PrefixHit | None) -> list[int] | None:
        """Grow ``request`` to ``num_blocks`` blocks from the plain stack; None (nothing
        changed) when short. ``hit``: an admission's lookup, a miss (expect_no_prefix_ids)."""
        need = num_blocks - len(request.block_ids)
        if need > len(self._free_block_ids):
            return None
        if hit is not None and self.prefix_caching:
            self._record_lookup(request, hit)
        if need <= 0:
            return []
        new = self._take(need)
        request.block_ids.extend(new)
        return new

    def _take(self, num_blocks: int) -> list[int]:
        if self._lru:
            return self._take_cached(num_blocks)
        free = self._free_block_ids
        new = free[-num_blocks:]
        del free[-num_blocks:]
        new.reverse()
        return new

    def free(self, request: Request) -> None:
        """Release everything ``request`` holds, on the GPU and on the host."""
        self._release(request)
        self.num_free_host_blocks += request.num_host_blocks
        request.num_host_blocks = 0

    def _release(self, request: Request) -> None:
        if self._lru:
            self._release_cached(request)
        else:
            self._free_block_ids.extend(reversed(request.block_ids))
        request.block_ids = []

    def swap_out(self, request: Request) -> int | None:
        """Copy ``request``'s computed KV to host memory: the blocks moved (None: host full).

        Blocks allocated for tokens not computed yet (this step's) are freed, not copied.
        """
        num_blocks = self.blocks_for(request.num_computed_tokens)
        if num_blocks > self.num_free_host_blocks:
            return None
        self.num_free_host_blocks -= num_blocks
        request.num_host_blocks = num_blocks
        self._release(request)
        return num_blocks

    def swap_in(self, request: Request, num_new_tokens: int) -> list[int] | None:
        """Bring a swapped request back with room for ``num_new_tokens`` more tokens, or None."""
        new = self.allocate(request, num_new_tokens)
        if new is None:
            return None
        self.num_free_host_blocks += request.num_host_blocks
        request.num_host_blocks = 0
        return new

    # ---- prefix caching internals

    def _grow_cached(self, request: Request, num_tokens: int, num_filled_tokens: int,
                     hit: PrefixHit | None) -> list[int] | None:
        """Share ``hit``'s blocks, hold ``num_tokens`` tokens, cache the full prompt blocks of
        ``num_filled_tokens``; None (nothing changed) when the free blocks are short."""
        queue = self._free_queue
        hit_ids = hit.block_ids if hit is not None else ()
        need = self.blocks_for(num_tokens) - len(request.block_ids) - len(hit_ids)
        if need < 0:
            need = 0
        # The hit's cached-free blocks leave the free queue too (counted only when it matters).
        if need > len(queue) or (hit_ids and need + len(hit_ids) > len(queue)
                                 and need + len(hit_ids) - self.num_held_blocks(hit_ids)
                                 > len(queue)):
            return None
        if hit is not None:
            self._record_lookup(request, hit)
        if hit_ids:  # touch first, so that taking new blocks cannot evict them
            refs = self._ref_counts
            for block_id in hit_ids:
                if not refs[block_id]:
                    del queue[block_id]
                refs[block_id] += 1
            request.block_ids.extend(hit_ids)
            request.num_cached_blocks = len(hit_ids)
        new = self._take_cached(need) if need else []
        request.block_ids.extend(new)
        if request.num_cached_blocks < len(request.block_hashes):
            self._cache_full_blocks(request, num_filled_tokens)
        return new

    def _record_lookup(self, request: Request, hit: PrefixHit) -> None:
        if request.num_preemptions:
            self.prefix_cache_preempted_queries_tokens += request.num_tokens
            self.prefix_cache_preempted_hits_tokens += hit.num_tokens
        else:
            self.prefix_cache_queries_tokens += request.num_tokens
            self.prefix_cache_hits_tokens += hit.num_tokens

    def _take_cached(self, num_blocks: int) -> list[int]:
        """The least recently freed blocks, evicted from the cache if they were cached."""
        queue, refs, block_hash = self._free_queue, self._ref_counts, self._block_hash
        new = []
        for _ in range(num_blocks):
            block_id, _ = queue.popitem(last=False)
            h = block_hash[block_id]
            if h is not None:
                self._uncache(block_id, h)
            refs[block_id] = 1
            new.append(block_id)
        return new

    def _cache_full_blocks(self, request: Request, num_filled_tokens: int) -> None:
        """Offer the prompt blocks ``num_filled_tokens`` fill (vLLM's ``cache_full_blocks``)."""
        hashes = request.block_hashes
        end = min(num_filled_tokens // self.block_size, len(hashes))
        cached, block_hash = self._cached_block_ids, self._block_hash
        for i in range(request.num_cached_blocks, end):
            h = hashes[i]
            block_id = request.block_ids[i]
            block_hash[block_id] = h
            if h not in cached:
                cached[h] = block_id
                if self._lookup is not None:
                    self._forget_lookup(block_id, h)
            else:  # another request computed this prefix at the same time: a copy
                self._copies.setdefault(h, []).append(block_id)
        if end > request.num_cached_blocks:
            request.num_cached_blocks = end

    def _uncache(self, block_id: int, h: int) -> None:
        """``block_id``, cached under ``h``, is no longer: a lookup then finds the next copy
        cached under ``h``, if any."""
        self._block_hash[block_id] = None
        copies = self._copies.get(h)
        if self._cached_block_ids[h] != block_id:  # a copy: lookups never found it
            copies.remove(block_id)  # type: ignore[union-attr]
        elif copies:
            self._cached_block_ids[h] = copies.pop(0)
        else:
            del self._cached_block_ids[h]
        if copies == []:
            del self._copies[h]
        if self._lookup is not None:
            self._forget_lookup(block_id, h)

    def _release_cached(self, request: Request) -> None:
        """Drop one reference to each block, tail first; blocks nobody holds join the free
        queue (most recently freed), cached if their tokens were computed."""
        refs, queue, block_hash = self._ref_counts, self._free_queue, self._block_hash
        block_ids = request.block_ids
        # Past the blocks offered to the cache, a block is this request's alone and uncached.
        num_offered = request.num_cached_blocks
        tail = block_ids[num_offered:]
        for block_id in tail:
            refs[block_id] = 0
        tail.reverse()
        queue.update(dict.fromkeys(tail))
        num_computed_blocks = request.num_computed_tokens // self.block_size
        for i in range(num_offered - 1, -1, -1):
            block_id = block_ids[i]
            refs[block_id] -= 1
            if refs[block_id]:
                continue
            h = block_hash[block_id]
            if h is not None and i >= num_computed_blocks:
                self._uncache(block_id, h)
            queue[block_id] = None
        request.num_cached_blocks = 0

    # ---- invariants

    def check_invariants(self, holders: Iterable[Request]) -> None:
        """free + held == total on the GPU and on the host; no block held twice or out of range.

        With prefix caching: a block is held by as many requests as its ref count says, is
        free exactly when none holds it, and the hash -> block map (copies included) and the
        blocks' hashes agree.
        """
        if self._lru:
            self._check_cached(list(holders))
            return
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

    def _check_cached(self, holders: list[Request]) -> None:
        n = self.num_gpu_blocks
        holds = [0] * n
        num_host_held = 0
        for request in holders:
            ids = request.block_ids
            if len(set(ids)) != len(ids) or any(not 0 <= b < n for b in ids):
                raise InvariantError(f"{request!r} holds a block twice or out of range")
            for i, block_id in enumerate(ids):
                holds[block_id] += 1
                h = self._block_hash[block_id]
                if h is not None and (i >= request.num_cached_blocks
                                      or h != request.block_hashes[i]):
                    raise InvariantError(f"{request!r}: block {i} is cached under another hash")
            num_host_held += request.num_host_blocks
        if holds != self._ref_counts:
            raise InvariantError("a block's ref count differs from the requests holding it")
        lookup = self._lookup  # if find_cached_prefix would return it, it must be right
        if (lookup is not None and lookup.num_tokens == lookup.request.num_tokens
                and lookup.hit != self._look_up(lookup.request).hit):
            raise InvariantError(f"a kept lookup for {lookup.request!r} is out of date")
        num_held = sum(1 for count in holds if count)
        if (num_held + len(self._free_queue) != n
                or any(holds[block_id] for block_id in self._free_queue)):
            raise InvariantError(f"GPU blocks: {len(self._free_queue)} free + {num_held} held "
                                 f"!= {n} total, or a held block is in the free queue")
        cached = self._cached_block_ids
        if (any(self._block_hash[b] != h for h, b in cached.items())
                or any(h not in cached or not copies or any(self._block_hash[b] != h
                                                            for b in copies)
                       for h, copies in self._copies.items())
                or sum(h is not None for h in self._block_hash) != self.num_cached_blocks):
            raise InvariantError("the hash -> block map and the blocks' hashes disagree")
        if num_host_held + self.num_free_host_blocks != self.num_host_blocks:
            raise InvariantError(
                f"host blocks: {self.num_free_host_blocks} free + {num_host_held} held != "
                f"{self.num_host_blocks} total")
