"""Figures drawn side by side, each in a process forked from this one.

A figure costs a few tenths of a second of one core, most of it matplotlib laying out ticks
and text, and a report draws several. Forked, each starts with the report code loaded (and
warm, where it has drawn before) and they share the machine's cores, while this process goes
on writing the report's text::

    figures = SideBySide()
    figures.start("latency_cdf.png", draw)   # forks; draw() -> whether there was anything
    ...                                       # the report's text, meanwhile
    figures.wait()                            # {"latency_cdf.png": True}; a figure whose
                                              # process failed, or was still drawing after
                                              # FIGURE_TIMEOUT_S, is missing: draw it again
                                              # here, where its error is raised as usual
    figures.stop()                            # on the way out: kill any still drawing

A figure is drawn here instead, at ``start``, where a process cannot be forked safely: no
``os.fork`` (Windows), or other Python threads running (a live run's readers), which a
forked process would not have and whose locks it could inherit held. A forked process
redirects its standard output to standard error (an answer pipe on stdout stays the forking
process's alone), draws without the cyclic garbage collector, which would only walk and copy
the heap it was forked with, and leaves by ``os._exit``: it never returns into the code it
was forked from, nor runs that code's exit handlers or flushes its buffers.

A forked process could hang where the renderer would not: a lock that a thread of a library
(not Python's) held at the fork stays held in the copy. ``wait`` gives each process
``FIGURE_TIMEOUT_S`` from its start, far more than a figure takes (tenths of a second on a
whole trace's run), then kills it, says so on standard error, and leaves the figure to be
drawn again in the renderer: a report is slower then, never stuck.
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import NoReturn

# how a figure's process ended: drawn, or nothing to draw; anything else (an error, a signal)
# leaves the figure out of wait(), for the caller to draw again where its error shows
DRAWN, NOTHING_TO_DRAW, FAILED = 0, 3, 1
FIGURE_TIMEOUT_S = 120.0  # a figure's process still drawing this long after its start is killed


def can_fork() -> bool:
    """Whether a figure can be drawn in a forked process now (module doc)."""
    return hasattr(os, "fork") and threading.active_count() == 1


class SideBySide:
    """Figures being drawn in forked processes, by name (module doc)."""

    def __init__(self, timeout_s: float | None = None) -> None:
        self._forked: dict[int, tuple[str, float]] = {}  # pid -> (figure name, its deadline)
        self._drawn: dict[str, bool] = {}
        self._timeout_s = FIGURE_TIMEOUT_S if timeout_s is None else timeout_s

    def start(self, name: str, draw: Callable[[], bool]) -> None:
        """Draw ``name`` with ``draw()`` in a forked process, or here (module doc)."""
        pid = -1
        if can_fork():
            with contextlib.suppress(OSError), warnings.catch_warnings():
                # Python 3.12+ warns of forking a process whose other threads are not
                # Python's (pyarrow's pools, fork-safe), after the fork: raised as an error
                # (-W error), the forked process would go on unseen
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        if pid == 0:
            _draw_and_exit(draw)
        if pid > 0:
            self._forked[pid] = (name, time.monotonic() + self._timeout_s)
        else:  # no process now: here, where its error is raised
            self._drawn[name] = draw()

    def wait(self) -> dict[str, bool]:
        """{name: whether there was anything to draw} of every figure drawn, once all have
        ended; a figure whose process failed, or was killed at its deadline (module doc), is
        not in it."""
        while self._forked:
            pid, (name, deadline) = next(iter(self._forked.items()))
            status = _wait_until(pid, deadline)
            del self._forked[pid]
            if status is None:
                print(f"figure {name}: its process was still drawing {self._timeout_s:g} s "
                      "after it started, and was stopped; drawn again in the renderer",
                      file=sys.stderr)
                continue
            code = os.waitstatus_to_exitcode(status)
            if code in (DRAWN, NOTHING_TO_DRAW):
                self._drawn[name] = code == DRAWN
        return dict(self._drawn)

    def stop(self) -> None:
        """Kill and reap the figures' processes still drawing (an error or Ctrl-C before
        ``wait``). Safe to call at any time, and twice."""
        for pid in list(self._forked):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):  # reaped already (ChildProcessError)
                os.waitpid(pid, 0)
            del self._forked[pid]


def _wait_until(pid: int, deadline: float) -> int | None:
    """The wait status of child ``pid`` once it has ended; None when it still ran at
    ``deadline`` (``time.monotonic``), once it has been killed and reaped. The wait sleeps on
    the process's descriptor where there is one (Linux), else looks again every 10 ms."""
    try:
        handle: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux, or an old kernel
        handle = None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            left = deadline - time.monotonic()
            if left <= 0:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return None
            if handle is not None:
                select.select([handle], [], [], left)  # readable once the process has ended
            else:
                time.sleep(min(left, 0.01))
    finally:
        if handle is not None:
            os.close(handle)


def _draw_and_exit(draw: Callable[[], bool]) -> NoReturn:
    """A forked figure process: draw and exit, never returning into the code it was forked
    from."""
    code = FAILED  # until drawn: the caller draws it again, where its error is raised
    gc.disable()  # the process ends with the figure (module doc)
    try:
        # standard error with no file of its own (closed, or a test's capture): output as is
        with contextlib.suppress(OSError, ValueError):
            os.dup2(sys.stderr.fileno(), 1)
        code = DRAWN if draw() else NOTHING_TO_DRAW
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(code)
