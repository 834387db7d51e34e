"""``simulate``: a whole trace through the reference engine on a virtual clock.

    trace requests -> Request (arrival + the front end's delay) -> EngineCore steps
    idle?  the clock jumps to the next arrival; busy: it advances by each step's duration
    Request -> RequestTimeline (one per input request, in input order)

``EngineCore`` (adapters/reference/engine.py) knows no clock and no trace; this module owns
both. The served engine (harness/serve/loop.py) drives the same core on the wall clock.
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from adapters.reference.config import ReferenceConfig
from adapters.reference.engine import EngineCore, VirtualClock
from adapters.reference.request import Request, RequestStatus
from harness.timeline import RequestTimeline
from harness.traces import TraceRequest


@dataclass(frozen=True)
class SimulationResult:
    """A simulated run: one timeline per input request (input order) and one row per step."""

    timelines: list[RequestTimeline]
    steps: pa.Table  # columns STEP_COLUMNS; t_s is the step's start
    num_kv_blocks_total: int
    config: ReferenceConfig

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
) -> SimulationResult:
    """Replay ``requests`` through the reference engine on a virtual clock. Deterministic.

    ``progress(num_done, num_total)`` is called now and then (about 200 times a run).
    ``decode_spans=False`` steps one at a time: the same results, slower (tests, baselines).
    ``check_invariants=True`` checks the scheduler's invariants after every step (tests).
    """
    with _gc_paused():
        return _simulate(requests, config, progress, decode_spans, check_invariants)


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
) -> SimulationResult:
    core = EngineCore(config)
    # The server's front end delays each request on its way in (a calibrated profile says how
    # long); the timeline keeps the trace's arrival, so TTFT and E2E include the delay.
    frontend_s = config.params.frontend_latency_s
    reqs = [_request(tr, i, frontend_s) for i, tr in enumerate(requests)]
    order = sorted(reqs, key=lambda r: (r.arrival_s, r.index))
    total = len(order)
    report_every = max(1, total // 200)
    next_report = 0
    clock = VirtualClock(order[0].arrival_s if order else 0.0)
    next_i = 0
    while True:
        now = clock.now_s
        while next_i < total and order[next_i].arrival_s <= now:
            core.add_request(order[next_i])
            next_i += 1
        if not core.has_unfinished():
            if next_i == total:
                break
            clock.advance_to(order[next_i].arrival_s)  # idle: jump to the next arrival
            continue
        until = order[next_i].arrival_s if next_i < total else math.inf
        end = core.run_decode_span(now, until) if decode_spans else None
        if end is None:
            end = core.step(now).end_s
        if check_invariants:
            core.check_invariants()
        clock.advance_to(end)
        if progress is not None and core.num_done >= next_report:
            progress(core.num_done, total)
            next_report = core.num_done + report_every
    if progress is not None:
        progress(core.num_done, total)
    return SimulationResult(
        timelines=[_timeline(r, tr) for r, tr in zip(reqs, requests, strict=True)],
        steps=core.steps.to_table(),
        num_kv_blocks_total=core.num_kv_blocks_total,
        config=config,
    )


def _request(tr: TraceRequest, index: int, frontend_s: float) -> Request:
    return Request(tr.request_id, tr.num_prompt_tokens, tr.num_output_tokens,
                   arrival_s=tr.arrival_s + frontend_s, priority=tr.priority or 0, index=index)


def _timeline(r: Request, tr: TraceRequest) -> RequestTimeline:
    times = tuple(r.token_times_s)
    done = r.status is RequestStatus.FINISHED
    return RequestTimeline(
        request_id=r.request_id,
        arrival_s=tr.arrival_s,
        num_prompt_tokens=r.num_prompt_tokens,
        num_target_output_tokens=r.max_output_tokens,
        priority=tr.priority,
        chunk_times_s=times,
        chunk_num_tokens=(1,) * len(times),
        finished_s=r.finished_s,
        num_output_tokens=r.num_output_tokens,
        num_preemptions=r.num_preemptions,
        error_kind=r.error_kind if r.error_kind else (None if done else "not_finished"),
        error_message=r.error_message,
        finish_reason="length" if done else None,
        token_count_source="engine",
        extra={"first_scheduled_s": r.first_scheduled_s},
    )
