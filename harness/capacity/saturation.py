"""Stopping a probe early once the engine is clearly over-saturated.

When requests arrive faster than the engine serves them, its backlog grows without bound and
every later request waits longer: such a probe fails its SLO, and running it to the end only
wastes minutes (a live probe) or steps (a simulated one). GuideLLM stops a benchmark on the
same evidence, a significant upward slope of concurrent requests and TTFT over a window
(``OverSaturationConstraint``, vllm-project/guidellm
src/guidellm/scheduler/constraints/saturation.py, commit 89b145d, read 2025-06). This check is
simpler and needs no statistics: it samples the backlog every ``interval_s`` of the run's clock
and stops when it rose at each of ``num_rising`` checks in a row and is at least
``min_backlog``::

    backlog  3  9  17  26  40  55        5 rises in a row, 55 >= 32: over-saturated
    backlog  3  9  17  12  20  26        a fall: the engine keeps up now and then; go on

The backlog is the engine's waiting queue when it is known (the simulator's scheduler, or the
live engine's telemetry), else the requests in flight (sent, not finished). For a live run the
client's send lag is checked the same way: a client that falls further and further behind its
schedule (past ``max_send_lag_s``) cannot measure the load it was asked for.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field

from harness.target import LoadState

DEFAULT_NUM_RISING = 5
DEFAULT_MIN_BACKLOG = 32
DEFAULT_MAX_SEND_LAG_S = 1.0


def interval_for(span_s: float, num_rising: int = DEFAULT_NUM_RISING) -> float:
    """A check interval for a run whose arrivals span ``span_s``: the rising checks cover
    about a sixth of it, between 0.05 s and 5 s apart."""
    if not math.isfinite(span_s) or span_s <= 0:
        return 0.05
    return min(5.0, max(0.05, span_s / (6 * num_rising)))


@dataclass
class SaturationMonitor:
    """An early-stop check (``harness.target.EarlyStop``): a reason once over-saturated."""

    interval_s: float = 1.0
    num_rising: int = DEFAULT_NUM_RISING
    min_backlog: int = DEFAULT_MIN_BACKLOG
    max_send_lag_s: float = DEFAULT_MAX_SEND_LAG_S
    _next_s: float = -math.inf
    _backlog: deque[tuple[float, float]] = field(default_factory=deque)
    _lag: deque[tuple[float, float]] = field(default_factory=deque)

    def __call__(self, state: LoadState) -> str | None:
        if state.t_s < self._next_s:
            return None
        self._next_s = state.t_s + self.interval_s
        keep = self.num_rising + 1
        what = "waiting queue" if state.num_waiting is not None else "requests in flight"
        backlog = state.num_waiting if state.num_waiting is not None else state.num_in_flight
        _push(self._backlog, (state.t_s, backlog), keep)
        if backlog >= self.min_backlog and _rising(self._backlog, keep):
            (t0, b0), (t1, b1) = self._backlog[0], self._backlog[-1]
            return (f"over-saturated: the engine's {what} grew at each of {self.num_rising} "
                    f"checks in a row, from {b0:,.0f} to {b1:,.0f} in {t1 - t0:.3g} s")
        if state.send_lag_s is not None:
            _push(self._lag, (state.t_s, state.send_lag_s), keep)
            if state.send_lag_s >= self.max_send_lag_s and _rising(self._lag, keep):
                return (f"the client fell behind: its send lag grew at each of "
                        f"{self.num_rising} checks in a row, to {state.send_lag_s:.3g} s")
        return None


def _push(window: deque[tuple[float, float]], item: tuple[float, float], keep: int) -> None:
    window.append(item)
    while len(window) > keep:
        window.popleft()


def _rising(window: deque[tuple[float, float]], keep: int) -> bool:
    values = [v for _, v in window]
    return len(values) == keep and all(b > a for a, b in itertools.pairwise(values))
