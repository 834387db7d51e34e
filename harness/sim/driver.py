"""``simulate``: a whole trace through the reference engine on a virtual clock.

    trace requests -> Request (arrival + the front end's delay) -> EngineCore steps
    idle?  the clock jumps to the next arrival; busy: it advances by each step's duration
    Request -> RequestTimeline (one per request that arrived, in input order)

Where arrivals come from is an ``_Arrivals`` source: the trace's own times (open loop), or N
users who each send the trace's next request when their last one ends (closed loop, with an
optional think time; the live replay's ``--mode closed``)::

    user 0  |== r0 ==|.think.|==== r2 ====|           one request per user in flight;
    user 1  |===== r1 =====|.think.|== r3 ==|         a finish at t sends the next at t + think

A finish ends a decode span (its last step finishes the shortest request), so a closed-loop
arrival at the finish instant is never stepped over.

``EngineCore`` (adapters/reference/engine.py) knows no clock and no trace; this module owns
both. The served engine (harness/serve/loop.py) drives the same core on the wall clock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import heapq
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from adapters.reference.config import ReferenceConfig
from adapters.reference.engine import EngineCore, VirtualClock
from adapters.reference.request import (
    Request,
    RequestStatus,
    block_hashes_from_prefix_ids,
)
from harness.target import ClosedLoop, EarlyStop, LoadState
from harness.timeline import OneTokenChunks, RequestTimeline, StepInstants
from harness.traces import MOONCAKE_BLOCK_TOKENS, TraceRequest

EARLY_STOP_INTERVAL_S = 0.05  # virtual seconds between early-stop checks


@dataclass(frozen=True)
class SimulationResult:
    """A simulated run: one timeline per request that arrived (input order; every request
    unless the run stopped early) and one row per step."""

    timelines: list[RequestTimeline]
    steps: pa.Table  # columns STEP_COLUMNS; t_s is the step's start
    num_kv_blocks_total: int
    config: ReferenceConfig
    stopped_reason: str | None = None  # why ``early_stop`` ended the run, if it did
    num_not_sent: int = 0  # requests that never arrived because the run stopped early
    prefix_cache: dict[str, Any] | None = None  # prefix_cache_stats(); None when caching is off
    # swap preemption: how many preemptions were recomputed because host swap space was full
    num_swap_fallbacks: int | None = None

    @property
    def num_steps(self) -> int:
        return self.steps.num_rows


def simulate(
    requests: Sequence[TraceRequest],
    config: ReferenceConfig,
    *,
    progress: Callable[[int, int], None] | None = None,
    decode_spans: bool = True,
    check_invariants: bool = False,
    closed_loop: ClosedLoop | None = None,
    early_stop: EarlyStop | None = None,
) -> SimulationResult:
    """Replay ``requests`` through the reference engine on a virtual clock. Deterministic.

    ``progress(num_done, num_total)`` is called now and then (about 200 times a run).
    ``decode_spans=False`` steps one at a time: the same results, slower (tests, baselines).
    ``check_invariants=True`` checks the scheduler's invariants after every step (tests).
    ``closed_loop`` replaces the trace's arrival times by N users (see the module docstring).
    ``early_stop`` is called every few virtual milliseconds; a reason it returns ends the run
    there: requests in the engine end ``not_finished``, those not yet arrived are left out.
    """
    if closed_loop is not None:
        closed_loop.validate()
    with _gc_paused():
        return _simulate(requests, config, progress, decode_spans, check_invariants,
                         closed_loop, early_stop)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the run.

    A run holds millions of floats in long lists (token instants, step columns) and creates no
    reference cycles; every full collection would walk all of it again (about a third of the
    run time on the whole Azure trace). Reference counting still frees everything as usual.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _simulate(
    requests: Sequence[TraceRequest],
    config: ReferenceConfig,
    progress: Callable[[int, int], None] | None,
    decode_spans: bool,
    check_invariants: bool,
    closed_loop: ClosedLoop | None,
    early_stop: EarlyStop | None,
) -> SimulationResult:
    core = EngineCore(config)
    # The server's front end delays each request on its way in (a calibrated profile says how
    # long); the timeline keeps the user's arrival, so TTFT and E2E include the delay.
    frontend_s = config.params.frontend_latency_s
    block_size = config.block_size if config.prefix_caching else 0  # 0: no block hashes
    if block_size and not any(tr.prefix_hash_ids for tr in requests):
        # lengths only: nothing can be cached, and the plain free-block stack is faster
        core.blocks.expect_no_prefix_ids()
    source: _Arrivals = (_TraceArrivals(requests, frontend_s, block_size) if closed_loop is None
                         else _Users(requests, frontend_s, closed_loop, block_size))
    total = len(requests)
    report_every = max(1, total // 200)
    next_report = 0
    first = source.next_arrival_s()
    clock = VirtualClock(first if math.isfinite(first) else 0.0)
    next_check = -math.inf
    stopped: str | None = None
    while True:
        now = clock.now_s
        source.release_due(now, core)
        if not core.has_unfinished():
            if source.exhausted():
                break
            clock.advance_to(source.next_arrival_s())  # idle: jump to the next arrival
            continue
        until = source.next_arrival_s()
        end = core.run_decode_span(now, until) if decode_spans else None
        if end is None:
            end = core.step(now).end_s
        if check_invariants:
            core.check_invariants()
        clock.advance_to(end)
        source.after_step(end, core)
        if early_stop is not None and end >= next_check:
            next_check = end + EARLY_STOP_INTERVAL_S
            stopped = early_stop(LoadState(
                t_s=end, num_sent=source.num_sent, num_done=core.num_done,
                num_waiting=len(core.scheduler.waiting)))
            if stopped:
                break
        if progress is not None and core.num_done >= next_report:
            progress(core.num_done, total)
            next_report = core.num_done + report_every
    if progress is not None:
        progress(core.num_done, total)
    sent = source.sent()
    # every token instant is the end of a step: one array of them, read by each timeline
    step_ends = np.array(core.scheduler.step_end_s, dtype=np.float64)
    return SimulationResult(
        timelines=[_timeline(r, tr, arrival_s, step_ends) for r, tr, arrival_s in sent],
        steps=core.steps.to_table(),
        num_kv_blocks_total=core.num_kv_blocks_total,
        config=config,
        stopped_reason=stopped or None,
        num_not_sent=total - len(sent),
        num_swap_fallbacks=(core.scheduler.num_swap_fallbacks
                            if config.preemption == "swap" else None),
        prefix_cache=(prefix_cache_stats(core, sum(1 for _, tr, _ in sent
                                                   if tr.prefix_hash_ids))
                      if config.prefix_caching else None),
    )


def prefix_cache_stats(core: EngineCore, num_with_prefix_ids: int) -> dict[str, Any]:
    """Prefix-cache lookups at admission, in tokens, as vLLM counts ``vllm:prefix_cache_queries``
    and ``_hits``; re-admissions after a preemption are counted apart, as vLLM does.
    ``num_with_prefix_ids``: requests whose trace row says which prefix blocks they share
    (Mooncake's hash_ids); without them a lookup cannot hit."""
    blocks = core.scheduler.blocks
    queries, hits = blocks.prefix_cache_queries_tokens, blocks.prefix_cache_hits_tokens
    pre_q = blocks.prefix_cache_preempted_queries_tokens
    pre_h = blocks.prefix_cache_preempted_hits_tokens
    return {
        "queries_tokens": queries,
        "hits_tokens": hits,
        "hit_rate": hits / queries if queries else None,
        "preempted_queries_tokens": pre_q,
        "preempted_hits_tokens": pre_h,
        "preempted_hit_rate": pre_h / pre_q if pre_q else None,
        "num_requests_with_prefix_ids": num_with_prefix_ids,
    }


# ---------------------------------------------------------------- where arrivals come from


class _Arrivals:
    """Requests entering the engine: ``release_due`` those due by ``now``; ``after_step`` lets
    a closed loop's users react to finishes. ``sent`` lists (request, trace row, the user's
    arrival) in input order."""

    num_sent = 0

    def release_due(self, now: float, core: EngineCore) -> None:
        raise NotImplementedError

    def next_arrival_s(self) -> float:
        """The next arrival (engine side, front-end delay included); inf when none is known."""
        raise NotImplementedError

    def exhausted(self) -> bool:
        """No request will ever arrive again."""
        raise NotImplementedError

    def after_step(self, end_s: float, core: EngineCore) -> None:
        return None

    def sent(self) -> list[tuple[Request, TraceRequest, float]]:
        raise NotImplementedError


class _TraceArrivals(_Arrivals):
    """Open loop: every request at its trace arrival time."""

    def __init__(self, requests: Sequence[TraceRequest], frontend_s: float,
                 block_size: int) -> None:
        self.requests = requests
        self.reqs = [_request(tr, i, frontend_s, block_size) for i, tr in enumerate(requests)]
        self.order = sorted(self.reqs, key=lambda r: (r.arrival_s, r.index))
        self.num_sent = 0  # also the position in ``order``

    def release_due(self, now: float, core: EngineCore) -> None:
        order, i, total = self.order, self.num_sent, len(self.order)
        while i < total and order[i].arrival_s <= now:
            core.add_request(order[i])
            i += 1
        self.num_sent = i

    def next_arrival_s(self) -> float:
        i = self.num_sent
        return self.order[i].arrival_s if i < len(self.order) else math.inf

    def exhausted(self) -> bool:
        return self.num_sent == len(self.order)

    def sent(self) -> list[tuple[Request, TraceRequest, float]]:
        pairs = zip(self.reqs, self.requests, strict=True)
        if self.num_sent == len(self.order):
            return [(r, tr, tr.arrival_s) for r, tr in pairs]
        released = {r.index for r in self.order[:self.num_sent]}
        return [(r, tr, tr.arrival_s) for r, tr in pairs if r.index in released]


class _Users(_Arrivals):
    """Closed loop: ``concurrency`` users take the trace's requests in order; each sends its
    next one ``think_time_s`` after its last one finished (or was rejected)."""

    def __init__(self, requests: Sequence[TraceRequest], frontend_s: float,
                 loop: ClosedLoop, block_size: int) -> None:
        self.requests = requests
        self.frontend_s = frontend_s
        self.block_size = block_size
        self.think_s = loop.think_time_s
        self.next_i = 0  # the next trace request a free user takes
        self.pending: list[tuple[float, int, Request]] = []  # (engine arrival, index, request)
        self.in_flight: dict[int, Request] = {}  # index -> request, arrived and not done
        self.arrivals: dict[int, float] = {}  # index -> the user's send instant
        self.built: dict[int, Request] = {}
        self.num_sent = 0
        self._num_done_seen = 0
        for _ in range(min(loop.concurrency, len(requests))):
            self._send_next(requests[0].arrival_s if requests else 0.0)

    def _send_next(self, at_s: float) -> None:
        if self.next_i == len(self.requests):
            return  # the trace ran out: this user is done
        i = self.next_i
        self.next_i += 1
        tr = self.requests[i]
        request = _request(dataclasses.replace(tr, arrival_s=at_s), i, self.frontend_s,
                           self.block_size)
        self.arrivals[i] = at_s
        self.built[i] = request
        heapq.heappush(self.pending, (request.arrival_s, i, request))

    def release_due(self, now: float, core: EngineCore) -> None:
        while self.pending and self.pending[0][0] <= now:
            _, i, request = heapq.heappop(self.pending)
            self.num_sent += 1
            if core.add_request(request):
                self.in_flight[i] = request
            else:  # rejected at once: the user is free again
                self._num_done_seen += 1
                self._send_next(now + self.think_s)

    def next_arrival_s(self) -> float:
        return self.pending[0][0] if self.pending else math.inf

    def exhausted(self) -> bool:
        return not self.pending and not self.in_flight and self.next_i == len(self.requests)

    def after_step(self, end_s: float, core: EngineCore) -> None:
        if core.num_done == self._num_done_seen:
            return  # nothing finished: the common case, no scan
        self._num_done_seen = core.num_done
        done = [i for i, r in self.in_flight.items() if r.is_finished]
        for i in sorted(done):  # freed at the same instant: the earlier request's user first
            request = self.in_flight.pop(i)
            finished_s = request.finished_s if request.finished_s is not None else end_s
            self._send_next(finished_s + self.think_s)

    def sent(self) -> list[tuple[Request, TraceRequest, float]]:
        queued = {i for _, i, _ in self.pending}
        return [(self.built[i], self.requests[i], self.arrivals[i])
                for i in sorted(self.built) if i not in queued]


def _request(tr: TraceRequest, index: int, frontend_s: float, block_size: int) -> Request:
    """``block_size`` 0: prefix caching is off, the request names no prompt blocks."""
    return Request(tr.request_id, tr.num_prompt_tokens, tr.num_output_tokens,
                   arrival_s=tr.arrival_s + frontend_s, priority=tr.priority or 0, index=index,
                   block_hashes=block_hashes_from_prefix_ids(
                       tr.prefix_hash_ids, tr.num_prompt_tokens,
                       tokens_per_id=MOONCAKE_BLOCK_TOKENS, block_size=block_size)
                   if block_size and tr.prefix_hash_ids else ())


def _timeline(r: Request, tr: TraceRequest, arrival_s: float, step_ends: np.ndarray
              ) -> RequestTimeline:
    times = StepInstants(step_ends, tuple(r.token_steps))
    done = r.status is RequestStatus.FINISHED
    error_kind = r.error_kind if r.error_kind else (None if done else "not_finished")
    return RequestTimeline(
        request_id=r.request_id,
        arrival_s=arrival_s,
        num_prompt_tokens=r.num_prompt_tokens,
        num_target_output_tokens=r.max_output_tokens,
        priority=tr.priority,
        chunk_times_s=times,
        chunk_num_tokens=OneTokenChunks(len(times)),
        finished_s=r.finished_s,
        num_output_tokens=r.num_output_tokens,
        num_preemptions=r.num_preemptions,
        error_kind=error_kind,
        error_message=r.error_message,
        finish_reason="length" if done else None,
        token_count_source="engine",
        extra={"first_scheduled_s": r.first_scheduled_s},
    )
