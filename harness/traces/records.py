"""The records of trace loading: the public ``TraceRequest``/``Trace`` contract, ``TraceError``,
and the plain rows that carry a source's requests through the options on their way there."""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

# ---------------------------------------------------------------- records (the contract)


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
    digest: str  # sha256 of the requests themselves (``requests_digest``)
    notes: tuple[str, ...] = ()  # e.g. "dropped 3 requests longer than max_model_len 4096"
    counts: dict[str, int] = field(default_factory=dict)  # dropped/clipped/skipped counts
    # how its arrivals were timed, as a load: {"kind": "rate", "value": 4.0} (rescaled to, or
    # synthesized at, a rate) or {"kind": "time_scale", "value": 2.0}; None: the trace's own
    timing: dict[str, float | str] | None = None
    # the options that were set (``TraceOptions.as_record``), to load the same requests again
    options: dict[str, object] = field(default_factory=dict)
    file_sha256: str | None = None  # sha256 of the file read (the lengths file of a synthetic)
    # a mix (``harness.scenario.expand.merge_traces``): each trace in it, in mix order; its
    # own ``source``, ``options`` and ``file_sha256`` load it again. () for a single trace
    parts: tuple[MixPart, ...] = ()

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def duration_s(self) -> float:
        """Arrival of the last request (0 for an empty trace)."""
        return self.requests[-1].arrival_s if self.requests else 0.0

    def check_invariants(self) -> None:
        """Sorted by arrival, unique ids, at least one prompt and one output token each."""
        seen: set[str] = set()
        previous = 0.0
        for r in self.requests:
            assert r.request_id not in seen, f"duplicate request id {r.request_id!r}"
            seen.add(r.request_id)
            assert r.arrival_s >= previous, f"request {r.request_id} arrives out of order"
            previous = r.arrival_s
            assert r.num_prompt_tokens >= 1 and r.num_output_tokens >= 1, r


@dataclass(frozen=True, slots=True)
class MixPart:
    """One trace of a mix: the trace as ``load_trace`` gave it, then the priority every request
    of it was given (a scenario's ``priority``), before the traces were merged."""

    trace: Trace
    priority: int | None = None


class TraceError(ValueError):
    """Bad trace input or options. The message names the file, the 1-based line and the field.

    ``path``, ``line`` and ``field`` are also attributes, ``None`` where they do not apply;
    ``reason`` is the message without them.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        prefix = ""
        if path is not None:
            prefix = f"{path}:{line}: " if line is not None else f"{path}: "
        if field is not None:
            prefix += f"field {field!r}: "
        super().__init__(prefix + message)
        self.reason = message  # the message without its place: what a list of rows quotes
        self.path = path
        self.line = line
        self.field = field


def is_int(value: object) -> bool:
    """A real integer: ``True`` is not a count."""
    return isinstance(value, int) and not isinstance(value, bool)


MOONCAKE_BLOCK_TOKENS = 512  # tokens per Mooncake ``hash_ids`` entry (FAST'25 release README)


# ---------------------------------------------------------------- digest

DIGEST_SCHEME = 2  # 1: source bytes and options (before 2026-12-01); 2: the requests
_DIGEST_VERSION = b"batchlab-trace-v2"


def requests_digest(requests: Sequence[TraceRequest]) -> str:
    """``Trace.digest``: a sha256 of the requests themselves (ids, arrivals, lengths,
    priorities, prefix ids), so that the same requests share it however they were loaded:
    from which file, with which spelling of the options, or with options that change nothing
    (``--time-scale 1``, a ``--limit`` above the trace's length)."""
    n = len(requests)
    h = hashlib.sha256(_DIGEST_VERSION)
    h.update(np.fromiter((r.arrival_s for r in requests), np.float64, n).tobytes())
    h.update(np.fromiter((r.num_prompt_tokens for r in requests), np.int64, n).tobytes())
    h.update(np.fromiter((r.num_output_tokens for r in requests), np.int64, n).tobytes())
    h.update(np.fromiter((-1 if r.priority is None else r.priority for r in requests),
                         np.int64, n).tobytes())
    h.update("\0".join(r.request_id for r in requests).encode())
    lengths = np.fromiter((len(r.prefix_hash_ids) for r in requests), np.int64, n)
    h.update(lengths.tobytes())
    total = int(lengths.sum())
    if total:
        def ids() -> Iterator[int]:
            return itertools.chain.from_iterable(r.prefix_hash_ids for r in requests)

        try:
            h.update(np.fromiter(ids(), np.int64, total).tobytes())
        except OverflowError:
            # Unsigned 64-bit hashes (trace ids are hashes: half of them are >= 2**63) do not
            # fit int64. Their hexadecimal text keeps every id apart, and the marker keeps
            # these digests apart from the int64 ones, which stay what they were.
            h.update(b"\0hex-ids\0" + ",".join(format(i, "x") for i in ids()).encode())
    return h.hexdigest()


# ---------------------------------------------------------------- rows on their way


class Row(NamedTuple):
    """One source row on its way to a TraceRequest."""

    request_id: str
    line: int  # 1-based line in the source, for error messages; 0 for synthetic rows
    arrival_s: float  # seconds from the earliest row; 0.0 for untimed sources
    num_prompt_tokens: int
    num_output_tokens: int
    priority: int | None
    prefix_hash_ids: tuple[int, ...]


@dataclass(slots=True)
class Parsed:
    """A source's rows as parsed, and what parsing counted."""

    rows: list[Row]
    timed: bool
    num_source_rows: int
    skipped: list[TraceError]
    num_failed: int = 0  # BurstGPT rows of failed requests (0 response tokens)
    models: Counter[str] = field(default_factory=Counter)  # BurstGPT "Model" column
    num_reordered: int = 0  # rows that arrived before the row above them


@dataclass(slots=True)
class Report:
    """What loading changed, as it goes: ``Trace.counts`` and ``Trace.notes``."""

    counts: dict[str, int]
    notes: list[str]
    timing: dict[str, float | str] | None = None  # Trace.timing
