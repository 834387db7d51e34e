"""Stopping a live replay early: ask a check how the run goes until it says stop.

Every ``EARLY_STOP_INTERVAL_S`` the check (``harness.target.EarlyStop``, e.g. the capacity
search's over-saturation monitor) gets a ``LoadState``: the run's clock, requests sent and
done, how late the latest one went out, and the engine's waiting queue from the latest
telemetry scrape when there is one. A reason it returns ends the load generator; the replay
then records what is in flight as ``not_finished`` and the reason as ``stopped_early``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from typing import Any, Protocol

from harness.target import EarlyStop, LoadState

EARLY_STOP_INTERVAL_S = 0.1


class _RunView(Protocol):
    """What the watch reads of a replay in progress (``harness.live.replay._Run``)."""

    stop_reason: str | None

    @property
    def num_sent(self) -> int: ...

    @property
    def timelines(self) -> Sequence[Any]: ...

    @property
    def last_send_lag_s(self) -> float | None: ...

    def s(self, t_ns: int) -> float: ...


async def watch_early_stop(run: _RunView, early_stop: EarlyStop, telemetry: object,
                           load: asyncio.Task[None]) -> None:
    """Ask ``early_stop`` until it gives a reason; then set it on ``run`` and cancel ``load``."""
    while True:
        await asyncio.sleep(EARLY_STOP_INTERVAL_S)
        rows = getattr(telemetry, "rows", None)  # a scraper keeps its readings
        waiting = rows[-1].get("num_waiting") if rows else None
        reason = early_stop(LoadState(
            t_s=run.s(time.perf_counter_ns()), num_sent=run.num_sent,
            num_done=len(run.timelines), send_lag_s=run.last_send_lag_s,
            num_waiting=int(waiting) if isinstance(waiting, int | float) and math.isfinite(waiting)
            else None))
        if reason:
            run.stop_reason = reason
            load.cancel()
            return
