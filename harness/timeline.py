"""The one record every engine's run is reduced to: a ``RequestTimeline`` per request.

A simulated run (the reference engine on its virtual clock) and a live run (the replay client
against a real server) both produce these; ``harness.metrics`` summarises them without knowing
which produced them.

All instants are seconds (float) relative to the start of the run (``*_s``). A "chunk" is one
streamed delivery: one token in simulation, one SSE event (possibly several tokens) live.

    arrival_s      sent_s        chunk_times_s[0]          chunk_times_s[-1]   finished_s
       |-- lag -->|---- TTFT ---->|--- gaps ... --------------->|------------->|
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np

# Stable error kinds. A failed request is a row with one of these, never an exception.
ERROR_KINDS = (
    "http_error",  # non-2xx status other than overload
    "overloaded",  # 429 / 503
    "stream_error",  # an error event inside a 200 stream
    "stream_cut",  # connection closed before the stream finished
    "invalid_json",  # a chunk that is not valid JSON
    "protocol_error",  # a 2xx answer that breaks the wire protocol: not an event stream, an
    # event over the size cap, malformed HTTP framing
    "timeout",  # no completion within the client's timeout
    "connect_error",  # could not connect / connection refused
    "rejected",  # the engine refused the request (too long, bad config)
    "not_finished",  # the run ended (crash, Ctrl-C, window) before the request finished
)

# Where a request's output token count (and its chunk sizes) came from.
TOKEN_COUNT_SOURCES = (
    "engine",  # simulation: the engine's own tokens
    "timings",  # llama.cpp's running timings.predicted_n on every event: exact per chunk
    "usage",  # the server's running usage on every event (vLLM's continuous_usage_stats),
    # or TGI's one event per token with its final count: exact per chunk
    "usage_total",  # only a final count from the server; chunks count one token per text event
    "tokenizer",  # no count from the server: the streamed text through the local tokenizer
    "chunks",  # nothing better: one token per event that carried text
)


class OneTokenChunks(tuple[int, ...]):
    """``chunk_num_tokens`` of a request whose every chunk carried one token (all of
    simulation): ``(1,) * n``, equal to that tuple, and known to be all ones from its type,
    without reading its millions of elements on a whole trace (``harness.metrics``,
    ``harness.results``)."""

    __slots__ = ()

    def __new__(cls, num_chunks: int) -> OneTokenChunks:
        return super().__new__(cls, (1,) * num_chunks)

    def __getnewargs__(self) -> tuple[int]:
        return (len(self),)  # pickled and copied as its length, as it is made


class StepInstants(Sequence[float]):
    """``chunk_times_s`` of a simulated request: the end instants of the steps that sampled its
    tokens, read from one array of every step's end (``ends``, shared by all of a run's
    requests) at the step indices ``runs`` names, ``(first, count, first, count, ...)``: runs
    of consecutive steps, usually one (a preemption starts another).

    Equal to the tuple of those floats (``==``, ``hash``, iteration and indexing give Python
    floats; ``numpy.asarray`` gathers them), and pickled or copied as that tuple. ``gather``
    reads every request's instants of a run at once, in a few numpy calls, instead of
    millions of Python floats one by one (``harness.metrics.chunk_times``)."""

    __slots__ = ("_ends", "_len", "_runs")

    def __init__(self, ends: np.ndarray, runs: tuple[int, ...]) -> None:
        self._ends = ends
        self._runs = runs
        self._len = sum(runs[1::2])

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> float: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[float, ...]: ...

    def __getitem__(self, index: int | slice) -> float | tuple[float, ...]:
        if isinstance(index, slice):
            return tuple(self)[index]
        position = index + self._len if index < 0 else index
        if not 0 <= position < self._len:
            raise IndexError(f"chunk index {index} out of range for {self._len} chunks")
        runs = self._runs
        for j in range(0, len(runs), 2):
            if position < runs[j + 1]:
                return float(self._ends.item(runs[j] + position))
            position -= runs[j + 1]
        raise AssertionError("unreachable: the runs' counts add up to the length")

    def _steps(self) -> np.ndarray:
        """The step index of each instant."""
        return _run_steps(np.array(self._runs, dtype=np.int64))

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        values = self._ends[self._steps()]
        return values if dtype is None else values.astype(dtype, copy=False)

    def __iter__(self) -> Iterator[float]:
        return iter(self._ends[self._steps()].tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StepInstants) and other._ends is self._ends:
            return other._runs == self._runs
        if isinstance(other, StepInstants | tuple):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __reduce__(self) -> tuple[type[tuple[float, ...]], tuple[tuple[float, ...]]]:
        return tuple, (tuple(self),)

    def __repr__(self) -> str:
        return f"StepInstants({tuple(self)!r})"

    @staticmethod
    def gather(sequences: Sequence[Sequence[float]]) -> np.ndarray | None:
        """Every instant of ``sequences``, end to end, as ``numpy.fromiter`` over them would
        read them; None unless each is a ``StepInstants`` of one shared array (or empty)."""
        ends: np.ndarray | None = None
        runs: list[tuple[int, ...]] = []
        for seq in sequences:
            if type(seq) is StepInstants:
                if ends is None:
                    ends = seq._ends
                elif seq._ends is not ends:
                    return None
                runs.append(seq._runs)
            elif len(seq):
                return None
        if ends is None:
            return None
        return ends[_run_steps(np.fromiter(itertools.chain.from_iterable(runs),
                                           dtype=np.int64))]


def _run_steps(runs: np.ndarray) -> np.ndarray:
    """The step indices that flat runs ``(first, count, first, count, ...)`` name, in order."""
    first, count = runs[0::2], runs[1::2]
    before = np.cumsum(count) - count  # instants of the earlier runs
    steps = np.arange(int(count.sum()), dtype=np.int64)
    steps += np.repeat(first - before, count)
    return steps


@dataclass(frozen=True, slots=True)
class RequestTimeline:
    """What happened to one request, from scheduled arrival to finish (or failure)."""

    request_id: str
    arrival_s: float  # scheduled arrival (trace time, after rescaling)
    num_prompt_tokens: int
    num_target_output_tokens: int  # what the trace asked for
    priority: int | None = None
    sent_s: float | None = None  # actual send instant (live); None means == arrival_s
    # when the client meant to send it: the arrival, or later when a max-concurrency gate held
    # it back (live); None means == arrival_s. send_lag_s is measured from here.
    scheduled_s: float | None = None
    # instant each chunk arrived: a tuple, or in simulation a ``StepInstants`` equal to one
    chunk_times_s: Sequence[float] = ()
    chunk_num_tokens: tuple[int, ...] = ()  # tokens carried by each chunk (same length)
    finished_s: float | None = None  # instant the request completed; None if it did not
    num_output_tokens: int | None = None  # tokens produced; None -> sum(chunk_num_tokens)
    num_preemptions: int = 0
    error_kind: str | None = None
    error_message: str = ""
    finish_reason: str | None = None  # "length", "stop", ... as the engine reported it
    token_count_source: str = "engine"  # one of TOKEN_COUNT_SOURCES
    # times the request was sent again: its reused keep-alive connection closed before any
    # response byte (live); the first send instant stays sent_s
    num_retries: int = 0
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def start_s(self) -> float:
        """The instant latency is measured from: the actual send, else the arrival."""
        return self.arrival_s if self.sent_s is None else self.sent_s

    @property
    def send_lag_s(self) -> float:
        """How late the client sent it: ``sent_s - scheduled_s`` (the client's own lateness)."""
        if self.sent_s is None:
            return 0.0
        return self.sent_s - (self.arrival_s if self.scheduled_s is None else self.scheduled_s)

    @property
    def gate_wait_s(self) -> float:
        """How long a max-concurrency gate held it past its arrival (0 without a gate)."""
        return 0.0 if self.scheduled_s is None else self.scheduled_s - self.arrival_s

    @property
    def ok(self) -> bool:
        return self.error_kind is None and self.finished_s is not None

    @property
    def output_tokens(self) -> int:
        if self.num_output_tokens is not None:
            return self.num_output_tokens
        return sum(self.chunk_num_tokens)

    @property
    def first_token_s(self) -> float | None:
        return self.chunk_times_s[0] if self.chunk_times_s else None

    @property
    def reached_target_length(self) -> bool:
        return self.output_tokens >= self.num_target_output_tokens

    def ttft_s(self) -> float:
        if not self.chunk_times_s:
            return math.nan
        return self.chunk_times_s[0] - self.start_s

    def e2e_s(self) -> float:
        if self.finished_s is None:
            return math.nan
        return self.finished_s - self.start_s
