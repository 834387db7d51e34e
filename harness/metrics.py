"""Every metric batchlab reports, defined once. ``docs/metrics.md`` gives the same formulas.

Inputs are ``RequestTimeline`` records; nothing here knows whether they came from simulation or
from a live server. Let, for one request, ``start`` = actual send instant (= arrival in
simulation), ``c_1 .. c_k`` the chunk instants with ``m_1 .. m_k`` tokens, ``N`` the output
tokens (the server's count where it gave one, else the tokenizer's, else ``Σ m_j``) and ``end``
the finish instant:

    ttft_s            = c_1 - start
    e2e_s             = end - start
    tpot_s            = (e2e - ttft) / (N - 1)            vLLM's TPOT; only when N > 1
    tpot_guidellm_s   = (c_k - start) / N                 GuideLLM's TPOT (includes TTFT)
    itl_s             = pooled per-token gaps: each gap (c_j - c_{j-1}) split evenly over the
                        m_j tokens of chunk j, i.e. m_j copies of gap/m_j: sum(m_j, j >= 2)
                        values per request, none for the first chunk's m_1 - 1 extra tokens
                        (which tpot_s counts in N - 1)
    itl_chunk_s       = pooled chunk gaps c_j - c_{j-1}   vLLM bench's "ITL"
    itl_guidellm_s    = (c_k - c_1) / (N - 1)             GuideLLM's ITL, per request; only N > 1

Latency distributions are over successful requests (the client's send lag and gate wait: over
every request sent). Counts and goodput divide by requests sent.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from harness.timeline import OneTokenChunks, RequestTimeline, StepInstants

PERCENTILES = (50, 90, 95, 99)
LATENCY_METRICS = ("ttft_s", "tpot_s", "itl_s", "e2e_s")
EXTRA_LATENCY_METRICS = ("tpot_guidellm_s", "itl_chunk_s", "itl_guidellm_s", "send_lag_s")
DEFAULT_CLIENT_LAG_THRESHOLD_S = 0.010
# A capacity probe at a request rate "kept pace" when, over the second half of its arrival
# window, the requests it completed fell short of those that would have completed had none
# waited longer for its first token than the quickest (each its own decode time later) by no
# more than PACE_TOLERANCE of them, or than PACE_SIGMAS standard deviations of a Poisson
# count (sqrt(n)); and it could show a steady state when its arrivals lasted at least
# SHORTEST_STEADY_E2ES times its decode time p90 (its E2E p90 without first tokens;
# docs/metrics.md, "Capacity probes"; checked by ``pace``). A run report says when a run at a
# load of its own fell behind: its waits then grow with the trace's length.
# a run too short to show a steady state is still said to have fallen behind when the wait for
# a first token grew, from the first quarter of its arrivals to the last, by more than this
# share of its arrivals' span (Pace.swamped): a queue growing at that pace is no edge effect
QUEUE_GROWTH_SHARE = 0.1
PACE_TOLERANCE = 0.05
PACE_SIGMAS = 2.0
SHORTEST_STEADY_E2ES = 4
# Output counts the engine made itself (harness.timeline.TOKEN_COUNT_SOURCES): a request over
# its target by one of these got more tokens than it asked for, the server ignoring max_tokens.
# The client's own counts ("tokenizer": the streamed text re-tokenized; "chunks": one token per
# text event) can exceed the target without that, so they are counted apart.
SERVER_COUNT_SOURCES = frozenset({"engine", "timings", "usage", "usage_total"})



@dataclass(frozen=True, slots=True)
class Pace:
    """Whether an engine kept pace with its arrivals over a run (``pace``)."""

    # over the second half of the arrivals: the requests that would have completed had none
    # waited longer for its first token than the quickest (``pace``)
    due_per_s: float
    completed_per_s: float  # over the second half of the arrivals
    kept: bool
    why: str | None = None  # why not, in words
    fell_behind: bool = False  # not kept because a backlog grew (not: too short to tell)
    # its arrivals lasted SHORTEST_STEADY_E2ES times the p90 of its requests' decode time (first
    # token to finish, which waiting in a queue does not lengthen): long enough that the
    # windows' edges alone cannot make the counts differ (None: not known)
    settled: bool | None = None
    # how much longer the requests arriving in the last quarter of the arrivals waited for
    # their first token than those of the first quarter (medians; None: not known), and how
    # long the arrivals lasted
    queue_growth_s: float | None = None
    span_s: float | None = None
    # the requests due over the second half of the arrivals, the count the shortfall that
    # chance explains is worked out from (max(PACE_TOLERANCE, PACE_SIGMAS / sqrt(n)) of it)
    num_due: int | None = None

    @property
    def swamped(self) -> bool:
        """Fell behind over arrivals too short to tell a backlog from the edges, yet the queue
        grew plainly: the last quarter's requests waited longer for their first token than the
        first quarter's by more than QUEUE_GROWTH_SHARE of the arrivals' span. Edges do not do
        that; a backlog that grew for the whole run does."""
        return (self.fell_behind and self.settled is False and self.queue_growth_s is not None
                and self.span_s is not None
                and self.queue_growth_s > QUEUE_GROWTH_SHARE * self.span_s)

    @property
    def counted(self) -> bool:
        """Its rates show the shortfall: not arrivals too short to count a rate over their
        second half (``swamped`` with no fewer completed than due, 0 against 0 at the least),
        where the wait that grew is the evidence."""
        return not (self.swamped and not self.completed_per_s < self.due_per_s)

    @property
    def overloaded(self) -> bool:
        """Fell behind over arrivals long enough to tell a growing backlog from the edges of a
        short run, or too short yet ``swamped``: what a run report says of a run (a capacity
        probe fails on either)."""
        return self.fell_behind and (bool(self.settled) or self.swamped)

    def behind_warning(self) -> str:
        """What the command line says of an ``overloaded`` run, after ``simulate``, ``replay``
        and each scenario cell ('' when it kept pace): one wording for all of them."""
        if not self.overloaded:
            return ""
        # the verdict first, then the evidence; what "due" means is in docs/metrics.md
        head = ("the engine fell behind its arrivals, so TTFT and E2E are those of this "
                "trace's length, not of a steady state (`batchlab capacity` finds the load it "
                "keeps pace with): ")
        waited = f"{_seconds(self.queue_growth_s or 0.0)} longer for a first token than the first"
        if not self.counted:  # requests that decode for longer than half of the arrivals
            # are counted on neither side: the wait is the evidence
            return (f"{head}those arriving last waited {waited}, over arrivals lasting "
                    f"{_seconds(self.span_s or 0.0)} (too short to count a rate over their "
                    "second half)")
        grew = (f", those arriving last waiting {waited} (too short to show a steady state)"
                if self.swamped else "")
        return (f"{head}over the second half of them it completed {self.completed_per_s:.3g} "
                f"req/s while {self.due_per_s:.3g} req/s were due{grew} (docs/metrics.md, "
                "\"keeping pace\")")


def _seconds(value_s: float) -> str:
    return f"{value_s * 1000:.1f} ms" if value_s < 1 else f"{value_s:.2f} s"


def pace(arrival_s: np.ndarray, finished_s: np.ndarray, e2e_s: np.ndarray,
         ok: np.ndarray, first_token_s: np.ndarray | None = None) -> Pace | None:
    """The pace check of an open-loop run (docs/metrics.md, "Capacity probes: keeping pace"):
    one value per request of each array, ``ok`` true for those that completed. None when it
    cannot be made (fewer than two arrival instants, nothing completed).

    Only requests that completed are counted, arriving and completing: a rejected or failed
    request never waited in a queue that grows. With ``first_token_s``, each request is
    counted as arriving where it would have finished had it waited no longer for its first
    token than the quickest request did: its arrival, plus that quickest wait, plus its own
    decode time (first token to finish), which does not grow with a queue. The two counts
    then differ only by how much longer requests waited, whatever the spread of their
    lengths or a change in the arrival rate over the run. Without first tokens, every
    arrival is moved by the median E2E. ``first_token_s`` also tells whether the run was
    long enough to tell (``Pace.settled``)."""
    arrival = np.asarray(arrival_s, dtype=float)
    finished = np.asarray(finished_s, dtype=float)
    e2e = np.asarray(e2e_s, dtype=float)
    ok = np.asarray(ok, dtype=bool) & np.isfinite(e2e)
    if arrival.size < 2 or not arrival.max() > arrival.min() or not ok.any():
        return None
    start, end = float(arrival.min()), float(arrival.max())
    mid, half = (start + end) / 2, (end - start) / 2
    settled = None
    decode = np.empty(0)
    first = np.full(arrival.shape, np.nan)
    if first_token_s is not None:
        first = np.asarray(first_token_s, dtype=float)
        decode = (finished - first)[ok & np.isfinite(first)]
        settled = bool(end - start >= SHORTEST_STEADY_E2ES * np.percentile(decode, 90)
                       ) if decode.size else None
    if decode.size:
        # each request where it would have finished had it waited no longer for its first
        # token than the quickest did: its own decode time after that
        ok &= np.isfinite(first)
        quickest = max(float(np.min(first[ok] - arrival[ok])), 0.0)
        due = arrival + quickest + (finished - first)
        num_due = int(np.count_nonzero(ok & (due > mid) & (due <= end)))
    else:  # every arrival moved by the median E2E, within the arrivals
        lag = min(float(np.median(e2e[ok])), half / 2)
        num_due = int(np.count_nonzero(ok & (arrival > mid - lag) & (arrival <= end - lag)))
    num_completed = int(np.count_nonzero(ok & (finished > mid) & (finished <= end)))
    due_rate, completed = num_due / half, num_completed / half
    # The counts differ by chance (bursts of arrivals, long requests finishing across the
    # windows' edges) and by a slow drift a steady state allows: a shortfall beyond
    # PACE_SIGMAS standard deviations of a Poisson count and beyond PACE_TOLERANCE of the
    # arrivals is a backlog that grows, however long the trace.
    allowed = max(PACE_TOLERANCE * num_due, PACE_SIGMAS * math.sqrt(num_due))
    behind = num_completed < num_due - allowed
    # Too short to tell comes first: the windows' edges alone make the counts differ. How long
    # is long enough is measured by the decode time, which a growing queue does not lengthen
    # (an overloaded run is not excused by the waits it causes); without first tokens, by
    # the E2E.
    if settled is False or (settled is None and end - start < SHORTEST_STEADY_E2ES
                            * float(np.percentile(e2e[ok], 90))):
        what, p90 = ("decode time", float(np.percentile(decode, 90))) if settled is False else (
            "E2E", float(np.percentile(e2e[ok], 90)))
        growth = _queue_growth(arrival, first_token_s, ok, start, end)
        # requests that decode for longer than half the arrivals are due after them, and
        # counted on neither side: a wait that grew that much is a backlog all the same
        grew = growth is not None and growth > QUEUE_GROWTH_SHARE * (end - start)
        return Pace(due_rate, completed, False,
                    f"too short to show a steady state: its arrivals last {end - start:.3g} s, "
                    f"under {SHORTEST_STEADY_E2ES} times its {what} p90 ({p90:.3g} s)",
                    fell_behind=behind or grew, settled=False, queue_growth_s=growth,
                    span_s=end - start, num_due=num_due)
    if behind:
        return Pace(due_rate, completed, False,
                    f"fell behind: completed {completed:.3g} req/s of {due_rate:.3g} due "
                    "over the second half of its arrivals", fell_behind=True, settled=True,
                    num_due=num_due)
    # within chance by the counts, yet the wait plainly grew (Pace.swamped's rule): a backlog
    # the counts' slack hides, as the waiting queue shows
    growth = _queue_growth(arrival, first_token_s, ok, start, end)
    if growth is not None and growth > QUEUE_GROWTH_SHARE * (end - start):
        return Pace(due_rate, completed, False,
                    f"fell behind: those arriving last waited {_seconds(growth)} longer for a "
                    f"first token than the first, over arrivals lasting {end - start:.3g} s "
                    f"(completed {completed:.3g} req/s of {due_rate:.3g} due over the "
                    "second half of them)", fell_behind=True, settled=True,
                    queue_growth_s=growth, span_s=end - start, num_due=num_due)
    return Pace(due_rate, completed, True, settled=True, num_due=num_due)


def _queue_growth(arrival: np.ndarray, first_token_s: np.ndarray | None, ok: np.ndarray,
                  start: float, end: float) -> float | None:
    """Median wait for a first token of the requests arriving in the last quarter of the
    arrivals, less that of the first quarter (completed requests); None when not known."""
    if first_token_s is None:
        return None
    wait = np.asarray(first_token_s, dtype=float) - arrival
    quarter = (end - start) / 4
    known = ok & np.isfinite(wait)
    first = wait[known & (arrival <= start + quarter)]
    last = wait[known & (arrival >= end - quarter)]
    if not first.size or not last.size:
        return None
    return float(np.median(last) - np.median(first))


SLO_KEYS = ("ttft_s", "tpot_s", "e2e_s")


def sig(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` significant digits, thousands separated, no trailing zeros: a
    figure as the report and the command line write it (``harness.report.format``)."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    places = digits - 1 - math.floor(math.log10(abs(value)))
    rounded = round(value, places)
    if places <= 0:
        return f"{int(rounded):,}"
    text = f"{rounded:,.{places}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def attainment_text(fraction: float) -> str:
    """An SLO attainment as a percentage, cut (never rounded up) to what it shows: 98.95%
    reads 98.9%, not 99.0% beside a 99% target it missed; never 100% unless every request
    was good (99.97%), never 0% unless none was (under 0.1%, two significant digits: 1 of
    1,001 reads 0.099%)."""
    pct = fraction * 100
    if pct in (0, 100):
        return f"{pct:.0f}%"
    # under 0.1%, two significant digits (cut to one decimal, it would read 0.0%); from
    # 99.95%, two decimals (2,999 of 3,000 reads 99.96%)
    digits = (1 - math.floor(math.log10(pct)) if 0 < pct < 0.1
              else 2 if pct >= 99.95 else 1)
    scale = 10 ** digits
    # the epsilon: 0.99 * 100 is 98.99999999999999, which is 99.0%; it must not lift a value
    # a hair under 100% onto it
    cut = min(math.floor(pct * scale + 1e-9), 100 * scale - 1) / scale
    text = f"{cut:.{digits}f}"
    return f"{text.rstrip('0') if pct < 0.1 else text}%"


def slo_problem(value: object) -> str:
    """Why ``value`` cannot be an SLO ('' when it can): a finite number of seconds above 0.

    The one rule for ``--slo``, scenario files' ``slo:`` and ``Slo(...)``: NaN would make
    every request "good" (comparisons with NaN are false) and could not be written as JSON.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a number of seconds, got {value!r}"
    if not (math.isfinite(value) and value > 0):
        return f"must be a positive, finite number of seconds, got {value!r}"
    return ""


@dataclass(frozen=True, slots=True)
class Slo:
    """Service-level objectives; a request is "good" when it succeeded and meets every one set.

    Each one set is a positive, finite number of seconds (``slo_problem``); a ValueError
    naming the key otherwise."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        for key in SLO_KEYS:
            value = getattr(self, key)
            problem = "" if value is None else slo_problem(value)
            if problem:
                raise ValueError(f"{key}: {problem}")

    @classmethod
    def parse(cls, text: str) -> Slo:
        """Parse ``ttft_s=0.5,tpot_s=0.05,e2e_s=10``."""
        values: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or key not in SLO_KEYS:
                raise ValueError(
                    f"--slo: {part!r} is not KEY=SECONDS with KEY one of ttft_s, tpot_s, e2e_s"
                )
            try:
                number = float(value)
            except ValueError:
                raise ValueError(
                    f"--slo: {key} must be a number of seconds, got {value.strip()!r}"
                ) from None
            problem = slo_problem(number)
            if problem:
                raise ValueError(f"--slo: {key} {problem}")
            if key in values:
                raise ValueError(f"--slo: {key} given twice ({values[key]:g} and {number:g})")
            values[key] = number
        return cls(**values)

    def as_dict(self) -> dict[str, float]:
        return {k: v for k, v in (("ttft_s", self.ttft_s), ("tpot_s", self.tpot_s),
                                  ("e2e_s", self.e2e_s)) if v is not None}

    def met(self, ttft_s: float, tpot_s: float, e2e_s: float) -> bool:
        # A single-token request has no TPOT; it cannot violate a TPOT SLO.
        return (
            (self.ttft_s is None or ttft_s <= self.ttft_s)
            and (self.tpot_s is None or math.isnan(tpot_s) or tpot_s <= self.tpot_s)
            and (self.e2e_s is None or e2e_s <= self.e2e_s)
        )


# ---------------------------------------------------------------- per request


def tpot_s(tl: RequestTimeline) -> float:
    n = tl.output_tokens
    if not tl.ok or n <= 1:
        return math.nan
    return (tl.e2e_s() - tl.ttft_s()) / (n - 1)


def tpot_guidellm_s(tl: RequestTimeline) -> float:
    n = tl.output_tokens
    if not tl.ok or n < 1 or not tl.chunk_times_s:
        return math.nan
    return (tl.chunk_times_s[-1] - tl.start_s) / n


def itl_guidellm_s(tl: RequestTimeline) -> float:
    n = tl.output_tokens
    if not tl.ok or n <= 1 or not tl.chunk_times_s:
        return math.nan
    return (tl.chunk_times_s[-1] - tl.chunk_times_s[0]) / (n - 1)


def chunk_gaps_s(tl: RequestTimeline) -> np.ndarray:
    return np.diff(np.asarray(tl.chunk_times_s, dtype=np.float64))


def token_gaps_s(tl: RequestTimeline) -> np.ndarray:
    """Per-token gaps: each chunk gap spread evenly over the tokens that chunk carried."""
    gaps = chunk_gaps_s(tl)
    if gaps.size == 0:
        return gaps
    counts = np.asarray(tl.chunk_num_tokens[1:], dtype=np.int64)
    if counts.size != gaps.size or np.all(counts == 1):
        return gaps
    counts = np.maximum(counts, 1)
    return np.repeat(gaps / counts, counts)


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    """One request's derived latencies (NaN where undefined)."""

    ttft_s: float
    tpot_s: float
    e2e_s: float
    tpot_guidellm_s: float
    itl_guidellm_s: float


def request_metrics(tl: RequestTimeline) -> RequestMetrics:
    ok = tl.ok
    return RequestMetrics(
        ttft_s=tl.ttft_s() if ok else math.nan,
        tpot_s=tpot_s(tl),
        e2e_s=tl.e2e_s() if ok else math.nan,
        tpot_guidellm_s=tpot_guidellm_s(tl),
        itl_guidellm_s=itl_guidellm_s(tl),
    )


def request_metric_columns(timelines: Sequence[RequestTimeline],
                           chunks: ChunkTimes | None = None) -> dict[str, np.ndarray]:
    """``request_metrics`` of every request as columns (the ``RequestMetrics`` field names),
    computed with numpy: the same formulas, the same float operations, the same NaNs.
    ``chunks``: ``chunk_times(timelines)`` when the caller has it already."""
    n = len(timelines)
    ok = np.fromiter((tl.ok for tl in timelines), dtype=bool, count=n)
    start = np.fromiter((tl.start_s for tl in timelines), dtype=np.float64, count=n)
    if chunks is None:
        chunks = chunk_times(timelines)
    first, last = chunks.first_last()
    finished = np.fromiter((math.nan if tl.finished_s is None else tl.finished_s
                            for tl in timelines), dtype=np.float64, count=n)
    tokens = np.fromiter((tl.output_tokens for tl in timelines), dtype=np.int64, count=n)
    has_chunks = chunks.lengths > 0
    ttft = np.where(ok, first - start, math.nan)
    e2e = np.where(ok, finished - start, math.nan)
    with np.errstate(divide="ignore", invalid="ignore"):  # masked out below
        per_gap = (tokens - 1).astype(np.float64)
        per_token = tokens.astype(np.float64)
        tpot = np.where(ok & (tokens > 1), (e2e - ttft) / per_gap, math.nan)
        tpot_guidellm = np.where(ok & (tokens >= 1) & has_chunks, (last - start) / per_token,
                                 math.nan)
        itl_guidellm = np.where(ok & (tokens > 1) & has_chunks, (last - first) / per_gap,
                                math.nan)
    return {"ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e, "tpot_guidellm_s": tpot_guidellm,
            "itl_guidellm_s": itl_guidellm}


class ChunkTimes(NamedTuple):
    """Every request's chunk instants end to end, in request order: ``lengths[i]`` of them
    for request ``i``. Made once (``chunk_times``) for ``chunks.parquet`` and the summary:
    millions of instants on a whole trace."""

    lengths: np.ndarray  # int64, one per request
    times_s: np.ndarray  # float64, lengths.sum() of them

    def first_last(self) -> tuple[np.ndarray, np.ndarray]:
        """Each request's first and last chunk instant; NaN for a request without chunks."""
        has = self.lengths > 0
        ends = np.cumsum(self.lengths)
        first = np.full(self.lengths.size, math.nan)
        last = np.full(self.lengths.size, math.nan)
        first[has] = self.times_s[(ends - self.lengths)[has]]
        last[has] = self.times_s[ends[has] - 1]
        return first, last

    def of(self, keep: np.ndarray) -> ChunkTimes:
        """The chunk instants of the requests where ``keep`` (a bool per request) is true."""
        if keep.all():
            return self
        return ChunkTimes(self.lengths[keep], self.times_s[np.repeat(keep, self.lengths)])


def chunk_times(timelines: Sequence[RequestTimeline]) -> ChunkTimes:
    """Every request's chunk instants end to end. A simulated run's are gathered from its
    steps' end instants in numpy (``StepInstants.gather``); others are read one by one."""
    lengths = np.fromiter((len(tl.chunk_times_s) for tl in timelines), dtype=np.int64,
                          count=len(timelines))
    times = StepInstants.gather([tl.chunk_times_s for tl in timelines])
    if times is None:
        times = np.fromiter(itertools.chain.from_iterable(tl.chunk_times_s for tl in timelines),
                            dtype=np.float64, count=int(lengths.sum()))
    return ChunkTimes(lengths, times)


def pooled_gaps_s(timelines: Sequence[RequestTimeline], chunks: ChunkTimes | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``(chunk gaps, token gaps)`` of every request in order: what concatenating
    ``chunk_gaps_s`` and ``token_gaps_s`` over ``timelines`` gives, in a few numpy calls.
    The second is the first itself (same object) when no chunk carried more than one token.
    ``chunks``: ``chunk_times(timelines)`` when the caller has it already."""
    lengths, times = chunks if chunks is not None else chunk_times(timelines)
    first_rows = (np.cumsum(lengths) - lengths)[lengths > 0]
    gap_ends = np.ones(times.size, dtype=bool)
    gap_ends[first_rows] = False  # a request's first chunk ends no gap of that request
    gaps = np.diff(times)[gap_ends[1:]] if times.size else times
    weights: np.ndarray | None = None  # tokens per gap, where a chunk carried more than one
    offset = 0
    for tl, num in zip(timelines, lengths.tolist(), strict=True):
        counts = tl.chunk_num_tokens
        # counts[1:] all 1, known from the type (simulation) or counted without copying the
        # tuple: the common case, every timeline
        if (num > 1 and type(counts) is not OneTokenChunks and len(counts) == num
                and counts.count(1) - (counts[0] == 1) != num - 1):
            if weights is None:
                weights = np.ones(gaps.size, dtype=np.int64)
            weights[offset:offset + num - 1] = np.maximum(
                np.asarray(counts[1:], dtype=np.int64), 1)
        offset += max(num - 1, 0)
    if weights is None:
        return gaps, gaps
    return gaps, np.repeat(gaps / weights, weights)


# ---------------------------------------------------------------- distributions


def distribution(values: Iterable[float] | np.ndarray) -> dict[str, float | None]:
    """``{mean, p50, p90, p95, p99, max, count}`` over the finite values (None when none)."""
    raw = values if isinstance(values, np.ndarray) else list(values)
    arr = np.asarray(raw, dtype=np.float64)
    finite = np.isfinite(arr)
    if not finite.all():  # no copy of millions of pooled gaps that are all finite
        arr = arr[finite]
    if arr.size == 0:
        out: dict[str, float | None] = {"mean": None}
        out.update({f"p{p}": None for p in PERCENTILES})
        out.update({"max": None, "count": 0})
        return out
    pct = np.percentile(arr, PERCENTILES)
    out = {"mean": float(arr.mean())}
    out.update({f"p{p}": float(v) for p, v in zip(PERCENTILES, pct, strict=True)})
    out["max"] = float(arr.max())
    out["count"] = int(arr.size)
    return out


def run_duration_s(timelines: Sequence[RequestTimeline], chunks: ChunkTimes | None = None
                   ) -> float:
    """From the first scheduled arrival to the last instant anything happened: an arrival
    (a request rejected on it), a chunk or a finish. ``chunks``: ``chunk_times(timelines)``
    when the caller has it already."""
    if not timelines:
        return 0.0
    arrival = np.fromiter((tl.arrival_s for tl in timelines), dtype=np.float64,
                          count=len(timelines))
    finished = np.fromiter((tl.finished_s for tl in timelines if tl.finished_s is not None),
                           dtype=np.float64)
    _, last_chunk = (chunk_times(timelines) if chunks is None else chunks).first_last()
    first = float(arrival.min())
    instants = np.concatenate((arrival, finished, last_chunk))
    return float(instants[~np.isnan(instants)].max(initial=first)) - first


def summarize(
    timelines: Sequence[RequestTimeline],
    *,
    slo: Slo | None = None,
    duration_s: float | None = None,
    client_lag_threshold_s: float = DEFAULT_CLIENT_LAG_THRESHOLD_S,
    by_priority: bool = True,
    chunks: ChunkTimes | None = None,
    metrics: Mapping[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """The summary written to ``summary.json``; identical for simulated and live runs.
    ``chunks``: ``chunk_times(timelines)``, ``metrics``: ``request_metric_columns(timelines)``,
    when the caller has them already."""
    if chunks is None:
        chunks = chunk_times(timelines)
    duration = run_duration_s(timelines, chunks) if duration_s is None else duration_s
    per_req = request_metric_columns(timelines, chunks) if metrics is None else metrics
    is_ok = [tl.ok for tl in timelines]
    ok = list(itertools.compress(timelines, is_ok))
    ok_chunks = chunks.of(np.array(is_ok, dtype=bool))
    chunk_gaps, token_gaps = pooled_gaps_s(ok, ok_chunks)
    itl = distribution(token_gaps)
    failures: dict[str, int] = {}
    for tl, tl_ok in zip(timelines, is_ok, strict=True):
        if not tl_ok:
            kind = tl.error_kind or "not_finished"
            failures[kind] = failures.get(kind, 0) + 1

    def rate(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    num_out = sum(tl.output_tokens for tl in ok)
    num_in = sum(tl.num_prompt_tokens for tl in ok)
    num_reached = sum(1 for tl in ok if tl.reached_target_length)
    over = [tl for tl in ok if tl.output_tokens > tl.num_target_output_tokens]
    num_over = sum(1 for tl in over if tl.token_count_source in SERVER_COUNT_SOURCES)
    summary: dict[str, Any] = {
        "num_requests": len(timelines),
        "num_completed": len(ok),
        "num_failed": len(timelines) - len(ok),
        "failures": dict(sorted(failures.items())),
        "duration_s": duration,
        "num_preemptions": sum(tl.num_preemptions for tl in timelines),
        # sends repeated on a fresh connection after a reused one closed before answering
        "num_retries": sum(tl.num_retries for tl in timelines),
        "num_input_tokens": num_in,
        "num_output_tokens": num_out,
        "throughput": {
            "requests_per_s": rate(len(ok)),
            "input_tokens_per_s": rate(num_in),
            "output_tokens_per_s": rate(num_out),
            "total_tokens_per_s": rate(num_in + num_out),
        },
        "ttft_s": distribution(per_req["ttft_s"]),
        "tpot_s": distribution(per_req["tpot_s"]),
        "itl_s": itl,
        "e2e_s": distribution(per_req["e2e_s"]),
        "tpot_guidellm_s": distribution(per_req["tpot_guidellm_s"]),
        # one-token chunks (all of simulation): the same values, the same distribution
        "itl_chunk_s": dict(itl) if token_gaps is chunk_gaps else distribution(chunk_gaps),
        "itl_guidellm_s": distribution(per_req["itl_guidellm_s"]),
        "output_length_fidelity": {
            "num_reached_target": num_reached,
            "fraction_reached_target": num_reached / len(ok) if ok else None,
            # more tokens than asked (counted in num_reached_target too): by the server's count,
            # and by the client's, which can count more than were generated
            "num_over_target": num_over,
            "num_over_target_client_counted": len(over) - num_over,
        },
    }
    lags = [tl.send_lag_s for tl in timelines if tl.sent_s is not None]
    if lags:
        lag = distribution(lags)
        summary["send_lag_s"] = lag
        p99 = lag["p99"]
        summary["client_limited"] = bool(p99 is not None and p99 > client_lag_threshold_s)
        summary["client_lag_threshold_s"] = client_lag_threshold_s
    if any(tl.scheduled_s is not None for tl in timelines):
        # time a --max-concurrency gate held requests past their arrival (not client
        # lateness), over every request sent, as send_lag_s: one not held waited 0
        summary["gate_wait_s"] = distribution(
            [tl.gate_wait_s for tl in timelines if tl.sent_s is not None])
    if slo is not None and slo.as_dict():
        good = sum(
            1
            for tl, ttft, tpot, e2e in zip(timelines, per_req["ttft_s"].tolist(),
                                           per_req["tpot_s"].tolist(), per_req["e2e_s"].tolist(),
                                           strict=True)
            if tl.ok and slo.met(ttft, tpot, e2e)
        )
        summary["slo"] = slo.as_dict()
        summary["goodput"] = {
            "num_good": good,
            "requests_per_s": rate(good),
            # divided by requests sent, not requests that succeeded
            "slo_attainment": good / len(timelines) if timelines else None,
        }
    if by_priority:
        classes = sorted({tl.priority for tl in timelines if tl.priority is not None})
        if classes:
            # a request without a priority is served as priority 0 (vLLM's default, and the
            # reference's), so it is counted in class 0: every request is in one class
            if any(tl.priority is None for tl in timelines) and 0 not in classes:
                classes = sorted([0, *classes])
            summary["by_priority"] = {
                str(p): summarize(
                    [tl for tl in timelines if (tl.priority or 0) == p],
                    slo=slo,
                    duration_s=duration,
                    client_lag_threshold_s=client_lag_threshold_s,
                    by_priority=False,
                )
                for p in classes
            }
    return summary


def flatten(summary: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"ttft_s": {"p50": 1}}`` -> ``{"ttft_s.p50": 1}``; handy for tables."""
    out: dict[str, Any] = {}
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def num_cut_off(summary: Mapping[str, Any] | None) -> int:
    """How many of a run's failed requests were cut off in flight (its summary's
    ``not_finished`` failures, at most ``num_failed``): of a run stopped early, those its stop
    cut off, whose latencies no percentile holds; 0 when it says none."""
    failures = summary.get("failures") if isinstance(summary, Mapping) else None
    cut = failures.get("not_finished") if isinstance(failures, Mapping) else None
    if isinstance(cut, bool) or not isinstance(cut, int):
        return 0
    failed = summary.get("num_failed") if isinstance(summary, Mapping) else None
    return min(cut, int(failed)) if isinstance(failed, int | float) else cut
