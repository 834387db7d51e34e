"""A request inside the reference engine, with one progress model.

``num_computed_tokens`` (tokens whose KV is in the cache) chases ``num_tokens`` (prompt +
generated so far). Each step the scheduler gives a request ``num_tokens - num_computed_tokens``
tokens (or fewer: a prefill chunk); when a step brings ``num_computed_tokens`` up to
``num_tokens`` the model samples one more token, so ``num_tokens`` grows by one::

    prompt = 5, max_output_tokens = 3             c = num_computed_tokens, n = num_tokens
    step 1 (prefill chunk of 3)   c 0 -> 3   n = 5   no token (prompt not done)
    step 2 (prefill chunk of 2)   c 3 -> 5   n = 6   token 1 sampled
    step 3 (decode: 1 token)      c 5 -> 6   n = 7   token 2
    step 4 (decode: 1 token)      c 6 -> 7   n = 8   token 3 = max_output_tokens: finished
    preempted by recompute        c -> 0     n kept  the next prefill covers prompt + output

Prefill, chunked prefill, decode and recompute after preemption are all this one rule; the
request's sizes are never rewritten. The last sampled token is never fed back, so a request
holds KV for at most ``num_prompt_tokens + max_output_tokens - 1`` tokens.

For prefix caching a request names the content of each full block of its prompt by a hash
chained over all blocks before it, so two requests share a block hash only if they share the
whole prefix up to and including that block (vLLM's ``hash_block_tokens``)::

    prompt of 40 tokens, block_size 16             request.block_hashes = (h0, h1)
        h0 = hash((ROOT_BLOCK_HASH, key of tokens  0..15))
        h1 = hash((h0,              key of tokens 16..31))
        tokens 32..39 fill no block: no hash, never cached

Only prompt blocks get hashes: simulated requests have no output token identities, so the
blocks of generated tokens are never cached (vLLM also caches full blocks of output).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence

ROOT_BLOCK_HASH = 0  # the parent of a prompt's first block


def chain_block_hashes(token_keys: Sequence[int], block_size: int) -> tuple[int, ...]:
    """One hash per full block of ``token_keys`` (token ids), each chained on the one before."""
    return _chain(tuple(token_keys[start:start + block_size])
                  for start in range(0, len(token_keys) - block_size + 1, block_size))


def block_hashes_from_prefix_ids(
    prefix_hash_ids: Sequence[int],
    num_prompt_tokens: int,
    *,
    tokens_per_id: int = 512,
    block_size: int = 16,
) -> tuple[int, ...]:
    """Chained block hashes for a prompt named by Mooncake-style ``hash_ids``.

    Each id names ``tokens_per_id`` prompt tokens (the last id: the rest of the prompt), so a
    ``block_size`` block is named by the ids it overlaps and its offset into the first; with
    512 and 16, each id expands into 32 blocks. Only full blocks of the prompt are covered.
    """
    ids = tuple(prefix_hash_ids)
    hashes = []
    parent = ROOT_BLOCK_HASH
    for start in range(0, min(num_prompt_tokens, len(ids) * tokens_per_id) - block_size + 1,
                       block_size):
        first, last = start // tokens_per_id, (start + block_size - 1) // tokens_per_id
        names = ids[first] if first == last else ids[first:last + 1]
        parent = hash((parent, start - first * tokens_per_id, names))
        hashes.append(parent)
    return tuple(hashes)


def _chain(block_keys: Iterable[object]) -> tuple[int, ...]:
    hashes = []
    parent = ROOT_BLOCK_HASH
    for key in block_keys:
        parent = hash((parent, key))  # ints and tuples of ints: the same in every process
        hashes.append(parent)
    return tuple(hashes)


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued: new, or preempted by recompute (holds no blocks)
    SWAPPED = "swapped"  # queued: preempted by swap (KV in host blocks, progress kept)
    RUNNING = "running"
    FINISHED = "finished"
    REJECTED = "rejected"  # can never be served (too long, never fits): a row, not an exception


class Request:
    """One request's state and history. Mutable; owned by the scheduler."""

    __slots__ = (
        "arrival_s",
        "block_hashes",
        "block_ids",
        "error_kind",
        "error_message",
        "finished_s",
        "first_scheduled_s",
        "index",
        "max_output_tokens",
        "num_cached_blocks",
        "num_computed_tokens",
        "num_host_blocks",
        "num_output_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "priority",
        "request_id",
        "sort_key",
        "status",
        "token_steps",
    )

    def __init__(
        self,
        request_id: str,
        num_prompt_tokens: int,
        max_output_tokens: int,
        *,
        arrival_s: float = 0.0,
        priority: int = 0,
        index: int = 0,
        block_hashes: tuple[int, ...] = (),
    ) -> None:
        self.request_id = request_id
        self.index = index  # position in the input; breaks ties deterministically
        self.arrival_s = arrival_s
        self.priority = priority  # lower is served first (vLLM's convention)
        self.sort_key = (priority, arrival_s, index)  # priority queue order and victim order
        self.num_prompt_tokens = num_prompt_tokens
        self.max_output_tokens = max_output_tokens
        self.num_output_tokens = 0  # tokens sampled so far
        self.num_computed_tokens = 0  # tokens whose KV is in the cache
        self.status = RequestStatus.WAITING
        self.block_ids: list[int] = []  # GPU KV blocks; only the BlockManager changes this
        self.block_hashes = block_hashes  # one per full prompt block, chained (prefix caching)
        self.num_cached_blocks = 0  # leading block_ids already offered to the prefix cache
        self.num_host_blocks = 0  # KV blocks swapped out to host memory
        self.num_preemptions = 0
        self.first_scheduled_s: float | None = None
        # the steps that sampled its output tokens, as runs of consecutive step indices:
        # [first, count, first, count, ...] (``Scheduler.token_times_s`` gives the instants)
        self.token_steps: list[int] = []
        self.finished_s: float | None = None
        self.error_kind: str | None = None
        self.error_message = ""

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_max_kv_tokens(self) -> int:
        """The most tokens this request will ever hold KV for (the last sample is not fed back)."""
        return self.num_prompt_tokens + self.max_output_tokens - 1

    @property
    def is_finished(self) -> bool:
        return self.status in (RequestStatus.FINISHED, RequestStatus.REJECTED)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.value}, "
                f"computed={self.num_computed_tokens}/{self.num_tokens}, "
                f"out={self.num_output_tokens}/{self.max_output_tokens}, "
                f"blocks={len(self.block_ids)})")
