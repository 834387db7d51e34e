"""Traces: real or synthetic request arrivals, loaded into one record type.

(Loaders are being written; the record types below are the contract.)
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace. Arrival is seconds from the trace's start."""

    request_id: str
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    priority: int | None = None  # lower is served first (vLLM's convention)
    prefix_hash_ids: tuple[int, ...] = ()  # prefix-block hashes (Mooncake: 512 tokens a block)


@dataclass(frozen=True, slots=True)
class Trace:
    """A loaded trace: its requests in arrival order, where they came from, what was changed."""

    requests: tuple[TraceRequest, ...]
    source: str  # path or "synthetic:poisson" ...
    format: str
    digest: str  # sha256 of the source bytes plus the options applied
    notes: tuple[str, ...] = ()  # e.g. "dropped 3 requests longer than max_model_len 4096"
    counts: dict[str, int] = field(default_factory=dict)  # dropped/clipped/skipped counts
