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
"""

from __future__ import annotations

import enum


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
        "block_ids",
        "error_kind",
        "error_message",
        "finished_s",
        "first_scheduled_s",
        "index",
        "max_output_tokens",
        "num_computed_tokens",
        "num_host_blocks",
        "num_output_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "priority",
        "request_id",
        "sort_key",
        "status",
        "token_times_s",
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
        self.num_host_blocks = 0  # KV blocks swapped out to host memory
        self.num_preemptions = 0
        self.first_scheduled_s: float | None = None
        self.token_times_s: list[float] = []  # instant each output token was produced
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
