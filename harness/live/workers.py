"""Live replay from several processes (``replay --workers N``), for load one core cannot send.

The trace is split round-robin by request (request i goes to worker i mod N), so every worker
keeps the trace's arrival schedule at 1/N of its rate. Each worker is a process with its own
event loop and HTTP connections, replaying its part into its own run folder; all share one
clock origin t0, an absolute ``perf_counter_ns`` instant (CLOCK_MONOTONIC on Linux, the same
clock in every process of the machine)::

    parent ── spawn N ──► worker i: import, load its part, say "ready"
    parent ◄── ready ×N
    parent ── t0 = now + margin ──► every worker: replay(part, t0_ns=t0) into OUT/workers/w<i>/
    parent ◄── done ×N ── merge: every timeline (one per request sent), in arrival order, into
                          OUT/ (requests.parquet, chunks.parquet, summary.json, manifest.json)

The summary is that of one run over all requests, plus ``workers``: per worker how it ended,
its requests (and of them, how many it sent but never recorded), send-lag p99, whether it was
client-limited (the run is client-limited if any worker was) and the CPU seconds its replay
took (near the run's duration: that worker was CPU-bound). A closed loop splits its users the
same way (each worker's users take its part in order); an open loop's ``max_concurrency`` cap
is split too. A request sent twice or recorded by two workers is an error.

Stopping. A worker stops as a plain replay does on Ctrl-C (its requests in flight recorded as
``not_finished``, its folder written) on SIGINT, SIGTERM or SIGHUP to the process group
(``timeout``, systemd), unless it was started with that signal ignored, as its parent then
ignores it too. When the parent alone is stopped, it tells its workers over their pipes, not
with a signal: a worker may have inherited SIGINT ignored (a run started with ``&`` from a
script), and would go on replaying. When the parent is killed outright (SIGKILL), each worker
sees its pipe close (or its parent pid change) and stops the same way, its manifest saying
why, then exits; ``batchlab summarize`` on the run folder merges the workers' records.

A worker that dies (SIGKILL, the OOM killer) fails the run; the others replay to their end and
everything is merged. Each worker writes a sent record as each request goes out
(``harness.live.recorder``) and notes it in memory shared with the parent too, so the requests
a dead worker sent but never recorded are still rows, as ``not_finished``: every request sent
is a row, and num_planned = num_recorded + num_not_sent. The manifest's ``error`` names the
worker that died, how (signal or exit status), and what became of its requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing as mp
import os
import queue as queue_mod
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from harness.live.config import ReplayConfig
from harness.live.recorder import RECORDS_FILE, Records, load_records
from harness.live.rundir import consolidate, update_manifest_quietly, with_engine_counters
from harness.live.wire import Attempt, Wire, wire_for
from harness.manifest import read_manifest, run_fields, trace_manifest, update_manifest
from harness.metrics import distribution, summarize
from harness.results import SUMMARY_FILE, write_json_atomic
from harness.runfolder import RunIdentity, claim_run_dir, release_run_dir
from harness.timeline import RequestTimeline
from harness.traces import Trace, TraceRequest

WORKERS_DIR = "workers"
DEFAULT_START_MARGIN_S = 1.0  # between the last worker's "ready" and t0
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0  # for a stopped worker to record what was in flight and exit
STOP = "stop"  # the parent's word to a worker, in place of t0 or after it
# Workers add sending capacity one core at a time; beyond this many per CPU they only
# time-share the cores, and each still costs a spawned interpreter (a second or more of imports,
# tens of MB), so a count above it is taken for a mistake (--workers 1000) and refused.
MAX_WORKERS_PER_CPU = 4


class WorkerError(RuntimeError):
    """A worker process failed to start, failed, or died (the message says which).

    ``summary``: what the run measured, merged from every worker's records (None when the
    workers never started)."""

    def __init__(self, message: str, summary: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.summary = summary


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerEnd:
    """How one worker ended, as the parent saw it."""

    # finished, interrupted, failed (it reported an error) or died (exited without a word)
    status: str
    detail: str = ""  # the error it reported, or how it exited


def max_num_workers() -> int:
    """The most workers a replay may start here: MAX_WORKERS_PER_CPU per CPU this process
    may run on."""
    try:
        num_cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        num_cpus = os.cpu_count() or 1
    return MAX_WORKERS_PER_CPU * num_cpus


def check_num_workers(num_workers: int, name: str = "workers") -> None:
    """ValueError, naming ``name`` (the field or flag), for a worker count below 1 or above
    ``max_num_workers()``."""
    if num_workers < 1:
        raise ValueError(f"{name}: must be at least 1, got {num_workers}")
    most = max_num_workers()
    if num_workers > most:
        raise ValueError(
            f"{name}: {num_workers} is more than {most} ({MAX_WORKERS_PER_CPU} per CPU of the "
            f"{most // MAX_WORKERS_PER_CPU} this process may use): workers beyond the cores "
            "only share them, adding no sending capacity")


def num_workers_to_start(num_workers: int, num_requests: int, name: str = "workers") -> int:
    """How many processes a replay asked for ``num_workers`` starts for ``num_requests``: at
    most one per request, since a worker without a request would start an interpreter, wait
    for t0 and write an empty folder. ValueError as ``check_num_workers``."""
    check_num_workers(num_workers, name)
    return max(1, min(num_workers, num_requests))


def split_trace(trace: Trace, num_workers: int) -> list[Trace]:
    """Round-robin by request: worker w gets requests w, w + N, w + 2N, ... (arrivals kept)."""
    return [dataclasses.replace(trace, requests=trace.requests[w::num_workers],
                                digest=f"{trace.digest}:w{w}/{num_workers}")
            for w in range(num_workers)]


def _share(total: int | None, w: int, n: int) -> int | None:
    """Worker w's share of ``total`` users or slots (the first ``total % n`` get one more)."""
    if total is None:
        return None
    return total // n + (1 if w < total % n else 0)


def worker_configs(config: ReplayConfig, num_workers: int) -> list[ReplayConfig]:
    """Each worker's replay configuration: closed-loop users and open-loop slots split."""
    for name in ("concurrency", "max_concurrency"):
        value = getattr(config, name)
        if value is not None and value < num_workers:
            raise ValueError(f"{name}: {value} cannot be split across {num_workers} workers "
                             "(give at least one per worker)")
    return [dataclasses.replace(config, concurrency=_share(config.concurrency, w, num_workers),
                                max_concurrency=_share(config.max_concurrency, w, num_workers))
            for w in range(num_workers)]


# ---------------------------------------------------------------- in the worker


def _worker_main(index: int, trace: Trace, config: ReplayConfig, out_dir: str,
                 to_parent: Any, from_parent: Any, parent_pid: int, sent_log: Any) -> None:
    """One worker process: say ready, wait for t0, replay its part, report."""
    watch = _ParentWatch(parent_pid)
    watch.start()
    # SIGTERM and SIGHUP are Ctrl-C here too, as in the parent (``harness.cli.main``); one
    # the worker inherited ignored (``nohup``) stays ignored, as the parent ignores it.
    stop_signals = [sig for sig in (signal.SIGTERM, signal.SIGHUP)
                    if signal.getsignal(sig) == signal.SIG_DFL]
    for sig in stop_signals:  # until the event loop takes them over
        signal.signal(sig, _raise_interrupt)

    def progress(done: int, _total: int) -> None:
        to_parent.put(("progress", index, done))

    try:
        to_parent.put(("ready", index, None))
        t0_ns = from_parent.recv()
        if not isinstance(t0_ns, int):
            return  # the parent gave up before t0
        cpu_s = time.process_time()
        try:
            summary = asyncio.run(_replay_part(trace, config, Path(out_dir), progress, t0_ns,
                                               from_parent, stop_signals, sent_log, watch))
        finally:
            for sig in stop_signals:  # the replay has ended: its report must get out
                signal.signal(sig, signal.SIG_IGN)
            if watch.gone.is_set():  # no one to report to: the folder says it all
                _note_parent_gone(Path(out_dir), parent_pid)
                os._exit(1)  # not a normal exit: it would wait to flush the queue to no one
        to_parent.put(("done", index, {"num_requests": summary.get("num_requests"),
                                       "cpu_s": time.process_time() - cpu_s}))
    except (KeyboardInterrupt, asyncio.CancelledError):
        to_parent.put(("interrupted", index, None))
    except BaseException as exc:
        to_parent.put(("error", index, f"{type(exc).__name__}: {exc}"))


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


async def _replay_part(trace: Trace, config: ReplayConfig, out_dir: Path,
                       progress: Callable[[int, int], None], t0_ns: int, from_parent: Any,
                       stop_signals: Sequence[signal.Signals], sent_log: Any,
                       watch: _ParentWatch) -> dict[str, Any]:
    """``replay`` of this worker's part, cancelled (as Ctrl-C cancels a plain replay) by a stop
    signal, by the parent's STOP, or by the parent's end (``_ParentWatch``)."""
    from harness.live.replay import replay

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    def stop() -> None:
        # Once: a second cancel would cut the recording of the requests in flight (a group
        # signal and the parent's STOP both come). asyncio's own Ctrl-C counts as the first.
        if not task.cancelling():
            task.cancel()

    def on_parent() -> None:
        try:
            message = from_parent.recv()
        except (EOFError, OSError):  # the parent is gone (killed outright): stop as on Ctrl-C
            loop.remove_reader(from_parent.fileno())
            watch.parent_gone()
            return
        if message == STOP:
            stop()

    for sig in stop_signals:
        loop.add_signal_handler(sig, stop)
    loop.add_reader(from_parent.fileno(), on_parent)
    watch.attach(loop, stop)
    inner = wire_for(config)  # the client replay would choose, counted as it sends
    index_of = {req.request_id: j for j, req in enumerate(trace.requests)}
    try:
        return await replay(trace, config, out_dir, progress=progress, t0_ns=t0_ns,
                            overwrite=True, wire=_LoggedWire(inner, sent_log, index_of))
    finally:
        watch.detach()
        loop.remove_reader(from_parent.fileno())


class _LoggedWire:
    """The replay's wire, noting the instant each request is handed to it in memory shared
    with the parent (``sent_log[j]`` for the part's request j; 0: not sent). The worker's
    records hold only finished requests: if it is killed, this is what still says which
    requests it had in flight."""

    def __init__(self, wire: Wire, sent_log: Any, index_of: dict[str, int]) -> None:
        self._wire = wire
        self._sent_log = sent_log
        self._index_of = index_of

    def prepare(self, req: TraceRequest, body: bytes) -> object:
        return self._wire.prepare(req, body)

    async def stream(self, att: Attempt, prepared: object) -> None:
        self._sent_log[self._index_of[att.req.request_id]] = (att.sent_ns
                                                              or time.perf_counter_ns())
        await self._wire.stream(att, prepared)

    async def warm_up(self) -> None:
        await self._wire.warm_up()

    async def aclose(self) -> None:
        await self._wire.aclose()


class _ParentWatch:
    """Whether this worker's parent is still there. Killed outright (SIGKILL: no signal reached
    the workers), nothing would merge what the worker replays, and its last message to the
    parent would wait on a pipe no one reads, forever. So a worker whose parent is gone stops
    its replay as on Ctrl-C (``attach``: its requests in flight recorded as ``not_finished``,
    its folder written), notes why in its manifest and exits; one with no replay running
    exits at once, and one whose replay has not ended within ``STOP_TIMEOUT_S``, then.

    Its pipe from the parent says so first (``parent_gone``, from the event loop); a thread
    that polls the parent pid says so too, where no replay reads the pipe."""

    def __init__(self, parent_pid: int, interval_s: float = 1.0) -> None:
        self.parent_pid = parent_pid
        self.gone = threading.Event()
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._replay: tuple[asyncio.AbstractEventLoop, Callable[[], None]] | None = None

    def start(self) -> None:
        threading.Thread(target=self._watch, name="batchlab-parent-watch", daemon=True).start()

    def attach(self, loop: asyncio.AbstractEventLoop, stop: Callable[[], None]) -> None:
        """The replay now running, and how to stop it (from the loop's thread)."""
        with self._lock:
            self._replay = (loop, stop)
        if self.gone.is_set():
            loop.call_soon_threadsafe(stop)

    def detach(self) -> None:
        with self._lock:
            self._replay = None

    def parent_gone(self) -> bool:
        """Stop the replay, if one runs (any thread); whether one did."""
        self.gone.set()
        with self._lock:
            running = self._replay
        if running is None:
            return False
        loop, stop = running
        try:
            loop.call_soon_threadsafe(stop)
        except RuntimeError:  # the loop has just closed: the replay is over
            return False
        return True

    def _watch(self) -> None:
        while os.getppid() == self.parent_pid:
            time.sleep(self._interval_s)
        if self.parent_gone():
            # the replay records what is in flight, and the worker exits (_worker_main); one
            # that cannot within the time given does not live on
            time.sleep(STOP_TIMEOUT_S)
        os._exit(1)  # no normal exit: that would wait to flush the queue to the dead parent


def _note_parent_gone(out_dir: Path, parent_pid: int) -> None:
    """A worker stopped because its parent was killed: its manifest says so (its status is
    the replay's own, "interrupted")."""
    if read_manifest(out_dir).get("status") != "interrupted":
        return  # it had ended already, or never started: nothing to explain
    update_manifest_quietly(out_dir, {
        "error": f"stopped because its parent process (replay --workers, pid {parent_pid}) "
                 "was killed outright: its requests in flight are rows as not_finished; "
                 f"`batchlab summarize {out_dir.parent.parent}` merges the workers' records"})


# ---------------------------------------------------------------- in the parent


class _Merged(NamedTuple):
    """The merged run: its summary; per worker, the rows added for requests it sent but never
    recorded; and why the merged files could not be written, if they could not."""

    summary: dict[str, Any]
    num_sent_unrecorded: list[int]
    write_error: str | None


def replay_workers(
    trace: Trace,
    config: ReplayConfig,
    out_dir: Path,
    *,
    num_workers: int,
    progress: Callable[[int, int], None] | None = None,
    command: Sequence[str] | None = None,
    overwrite: bool = False,
    start_margin_s: float = DEFAULT_START_MARGIN_S,
    on_t0: Callable[[int], None] | None = None,
    on_start: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Replay ``trace`` from ``num_workers`` processes (at most one per request:
    ``num_workers_to_start``) into one run folder; the summary.

    ``on_t0`` gets the shared clock origin (``perf_counter_ns``, ``start_margin_s`` ahead)
    once every worker has it. ``on_start``: as ``harness.live.replay.replay``'s. Raises
    ``WorkerError``, after the run folder is written, when a worker did not start, failed or
    died."""
    config.validate()
    num_workers = num_workers_to_start(num_workers, len(trace.requests))
    configs = worker_configs(config, num_workers)
    out_dir = Path(out_dir)
    run_id = claim_run_dir(out_dir, RunIdentity("live", trace.digest, target=config.target_url),
                           overwrite=overwrite)
    try:
        return _replay_workers(trace, config, out_dir, run_id, configs,
                               num_workers=num_workers, progress=progress, command=command,
                               start_margin_s=start_margin_s, on_t0=on_t0,
                               on_start=on_start)
    finally:
        release_run_dir(out_dir)  # the run has ended: another process may write the folder


def _replay_workers(trace: Trace, config: ReplayConfig, out_dir: Path, run_id: str,
                    configs: Sequence[ReplayConfig], *, num_workers: int,
                    progress: Callable[[int, int], None] | None,
                    command: Sequence[str] | None, start_margin_s: float,
                    on_t0: Callable[[int], None] | None,
                    on_start: Callable[[], None] | None = None) -> dict[str, Any]:
    """``replay_workers`` into a folder claimed already."""
    parts = split_trace(trace, num_workers)
    dirs = [out_dir / WORKERS_DIR / f"w{w}" for w in range(num_workers)]
    update_manifest(out_dir, {
        **run_fields("live", command), "trace": trace_manifest(trace),
        "target": config.target_url, "protocol": config.protocol, "mode": config.mode,
        "replay": config.as_manifest(), "slo": config.slo.as_dict() if config.slo else None,
        "client_lag_threshold_s": config.client_lag_threshold_s, "status": "running",
        "clock": "time.perf_counter_ns, instants in seconds from t0, shared by every worker",
        "workers": {"num_workers": num_workers, "split": "round-robin by request",
                    "folders": [str(d.relative_to(out_dir)) for d in dirs]},
    })
    if on_start is not None:
        on_start()
    ctx = mp.get_context("spawn")  # a clean interpreter per worker: no inherited event loop
    _start_resource_tracker()
    to_parent = ctx.Queue()
    pipes = [ctx.Pipe(duplex=False) for _ in range(num_workers)]
    sent_logs = [ctx.RawArray("q", len(part.requests)) for part in parts]
    procs = [ctx.Process(target=_worker_main, name=f"batchlab-replay-w{w}", daemon=True,
                         args=(w, parts[w], configs[w], str(dirs[w]), to_parent, pipes[w][0],
                               os.getpid(), sent_logs[w]))
             for w in range(num_workers)]
    status, errors, t0_ns = "interrupted", [], None
    done: dict[int, int] = {}
    ends: dict[int, WorkerEnd] = {}
    reports: dict[int, dict[str, Any]] = {}  # per worker: its CPU seconds in the replay
    try:
        for proc in procs:
            proc.start()
        _wait_ready(to_parent, procs)
        t0_ns = time.perf_counter_ns() + round(start_margin_s * 1e9)
        for _, send in pipes:
            send.send(t0_ns)
        if on_t0 is not None:
            on_t0(t0_ns)
        _wait_done(to_parent, procs, ends, reports, done, len(trace.requests), progress)
        status = "finished"
    except WorkerError as exc:  # one did not start: the others are told to go
        status = "failed"
        errors.append(str(exc))
    finally:
        if status != "finished":
            _stop_workers(pipes)
        _join_workers(procs, to_parent, ends, reports, done)
        if status == "finished" and any(e.status in ("failed", "died") for e in ends.values()):
            status = "failed"
        merged = _merge(out_dir, trace, config, parts, dirs, run_id, reports, ends, status,
                        sent_logs, t0_ns)
        errors += _worker_errors(parts, ends, merged)
        if merged.write_error is not None:
            errors.append(merged.write_error)
            status = "failed" if status == "finished" else status
        for w, end in ends.items():
            if end.status == "died":  # its own manifest says "running": it never got to end it
                update_manifest_quietly(dirs[w], {"status": "failed", "error": (
                    f"the worker {end.detail}: the {merged.num_sent_unrecorded[w]} requests "
                    f"it had in flight are rows as not_finished in {out_dir}")})
        summary = merged.summary
        update_manifest_quietly(out_dir, {
            "status": status, "t0_perf_counter_ns": t0_ns, "errors": errors,
            # what the report says of how the run ended (one line: every worker's error)
            **({"error": _run_error(errors, summary, len(trace.requests))} if errors else {}),
            "num_sent": summary["num_requests"],  # every request sent is a row, lost ones too
            "num_recorded": summary["num_requests"],
            "num_not_sent": summary["num_not_sent"],
            "num_planned": len(trace.requests),
            "client_limited": summary.get("client_limited"),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        })
    if errors:
        raise WorkerError("replay --workers failed: " + "; ".join(errors),
                          summary=merged.summary)
    return merged.summary


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (the process that cleans up the queue's
    semaphores, in this process group) with SIGHUP blocked. It ignores SIGINT and SIGTERM
    itself, but not SIGHUP: a SIGHUP to the group killed it, and the run ended in its
    tracebacks. The tracker inherits the mask and never lifts it; here it is lifted at once,
    so a SIGHUP meanwhile is delayed, not lost."""
    from multiprocessing import resource_tracker

    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _stop_workers(pipes: Sequence[tuple[Any, Any]]) -> None:
    """Tell every worker to stop, over its pipe: before t0 the word comes instead of t0, after
    it the worker stops as on Ctrl-C. Not a signal: a signal to this process alone (kill, a
    supervisor, ``timeout --foreground``) reaches no worker, and a worker may have inherited
    SIGINT ignored (``&`` in a script). A worker that was signalled with its group is already
    stopping; the word changes nothing there."""
    for _, send in pipes:
        with contextlib.suppress(OSError):
            send.send(STOP)


def _wait_ready(to_parent: Any, procs: Sequence[Any]) -> None:
    ready: set[int] = set()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while len(ready) < len(procs):
        try:
            kind, index, payload = to_parent.get(timeout=0.5)
        except queue_mod.Empty:
            if time.monotonic() > deadline or any(not p.is_alive() for p in procs):
                raise WorkerError("a replay worker did not start") from None
            continue
        if kind == "ready":
            ready.add(index)
        elif kind == "error":
            raise WorkerError(f"replay worker {index}: {payload}")


def _wait_done(to_parent: Any, procs: Sequence[Any], ends: dict[int, WorkerEnd],
               reports: dict[int, dict[str, Any]], done: dict[int, int], total: int,
               progress: Callable[[int, int], None] | None) -> None:
    """Until every worker has ended: progress as it comes; KeyboardInterrupt when one was
    interrupted (the others are then stopped too). One that dies leaves the others running."""
    exited_clean: set[int] = set()
    while len(ends) < len(procs):
        try:
            message = to_parent.get(timeout=0.5)
        except queue_mod.Empty:
            _note_dead(procs, ends, exited_clean)
            continue
        kind = _take(message, ends, reports, done)
        if kind == "progress" and progress is not None:
            progress(sum(done.values()), total)
        elif kind == "interrupted":
            raise KeyboardInterrupt


def _take(message: tuple[str, int, Any], ends: dict[int, WorkerEnd],
          reports: dict[int, dict[str, Any]], done: dict[int, int]) -> str:
    """Note one worker message; its kind."""
    kind, index, payload = message
    if kind == "progress":
        done[index] = payload
    elif kind == "done":
        reports[index] = payload
        ends[index] = WorkerEnd("finished")
    elif kind == "interrupted":
        ends[index] = WorkerEnd("interrupted")
    elif kind == "error":
        ends[index] = WorkerEnd("failed", str(payload))
    return kind


def _note_dead(procs: Sequence[Any], ends: dict[int, WorkerEnd], exited_clean: set[int]) -> None:
    """Workers gone without their last word: killed (SIGKILL, the OOM killer) or crashed. One
    that exited with status 0 gets one more poll: its word may still be in the queue."""
    for i, proc in enumerate(procs):
        if i in ends or proc.pid is None or proc.is_alive():
            continue
        if proc.exitcode == 0 and i not in exited_clean:
            exited_clean.add(i)
            continue
        ends[i] = _silent_end(proc.exitcode)


def _silent_end(code: int | None) -> WorkerEnd:
    """The end of a worker whose last word never came, from its exit status."""
    if code == 0:  # it returned (its word lost to a read a signal cut): not a failure
        return WorkerEnd("ended", "exited normally without a last word")
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return WorkerEnd("died", f"was killed by {signal.Signals(-code).name}")
    return WorkerEnd("died", f"exited with code {code}")


def _join_workers(procs: Sequence[Any], to_parent: Any, ends: dict[int, WorkerEnd],
                  reports: dict[int, dict[str, Any]], done: dict[int, int],
                  timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Wait for the workers to exit, reading what they still say (a worker cannot exit while
    its queue waits to be read); SIGKILL one still there after ``timeout_s`` (SIGTERM would
    only ask again for the stop it is carrying out).

    The queue is read no more after a read fails: a signal that interrupted a read here
    before (KeyboardInterrupt) may have left it in the middle of a message."""
    deadline = time.monotonic() + timeout_s
    started = [(i, p) for i, p in enumerate(procs) if p.pid is not None]
    readable = True
    while readable and any(p.is_alive() for _, p in started) and time.monotonic() < deadline:
        readable = _read_one(to_parent, 0.2, ends, reports, done)
    for _, proc in started:
        proc.join(max(0.0, deadline - time.monotonic()))
    for i, proc in started:
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=10)
            ends.setdefault(i, WorkerEnd("died", f"did not stop within {timeout_s:g} s and "
                                         "was killed"))
    while readable and _read_one(to_parent, 0.0, ends, reports, done, stop_when_empty=True):
        pass  # their last words
    for i, proc in started:
        if i not in ends:
            ends[i] = _silent_end(proc.exitcode)


def _read_one(to_parent: Any, timeout_s: float, ends: dict[int, WorkerEnd],
              reports: dict[int, dict[str, Any]], done: dict[int, int], *,
              stop_when_empty: bool = False) -> bool:
    """Take one message if one comes within ``timeout_s``; False when reading should stop
    (the read failed, or the queue is empty and ``stop_when_empty``)."""
    try:
        message = to_parent.get(timeout=timeout_s) if timeout_s else to_parent.get_nowait()
    except queue_mod.Empty:
        return not stop_when_empty
    except Exception:  # a message cut in half (see _join_workers): nothing more to read
        return False
    _take(message, ends, reports, done)
    return True


def _run_error(errors: Sequence[str], summary: dict[str, Any], num_planned: int) -> str:
    """The manifest's ``error`` of a run that failed: each error (which worker died and how,
    what became of its requests), and how much of the whole trace was never sent."""
    said = "; ".join(errors)
    not_sent = summary.get("num_not_sent")
    if isinstance(not_sent, int):
        said += f" (of the run's {num_planned} requests, {not_sent} were never sent)"
    return said


def _worker_errors(parts: Sequence[Trace], ends: dict[int, WorkerEnd],
                   merged: _Merged) -> list[str]:
    """What failed: each worker that reported an error or died, with what became of its part."""
    errors = []
    for w, end in sorted(ends.items()):
        if end.status == "failed":
            errors.append(f"worker {w}: {end.detail}")
        elif end.status == "died":
            num_part = len(parts[w].requests)
            num_rows = merged.summary["workers"][w]["num_requests"]
            errors.append(f"worker {w} {end.detail}: of its {num_part} requests, "
                          f"{merged.num_sent_unrecorded[w]} were in flight (rows as "
                          f"not_finished) and {num_part - num_rows} never sent")
    return errors


def merge_timelines(parts: Sequence[Sequence[RequestTimeline]]) -> list[RequestTimeline]:
    """The workers' timelines as one run's, in arrival order; a request recorded twice is an
    error (each worker had its own requests)."""
    merged = [tl for part in parts for tl in part]
    twice = [rid for rid, n in Counter(tl.request_id for tl in merged).items() if n > 1]
    if twice:
        raise ValueError(f"requests recorded by more than one worker: {', '.join(twice[:5])}")
    return sorted(merged, key=lambda tl: (tl.arrival_s, tl.request_id))


def unrecorded_sends(part: Trace, recorded: Sequence[RequestTimeline], sent_log: Sequence[int],
                     *, t0_ns: int | None, mode: str, why: str) -> list[RequestTimeline]:
    """Rows for the requests a worker sent (``sent_log``) but never recorded, because it died
    or failed first: ``not_finished``, with no send instant (the wire's died with the worker)
    and no chunks. A closed loop's request arrives when its user sends it."""
    seen = {tl.request_id for tl in recorded}
    rows = []
    for req, sent_ns in zip(part.requests, sent_log, strict=True):
        if not sent_ns or req.request_id in seen:
            continue
        arrival_s = (req.arrival_s if mode == "open" or t0_ns is None
                     else (sent_ns - t0_ns) / 1e9)
        rows.append(RequestTimeline(
            request_id=req.request_id, arrival_s=arrival_s,
            num_prompt_tokens=req.num_prompt_tokens,
            num_target_output_tokens=req.num_output_tokens, priority=req.priority,
            error_kind="not_finished", token_count_source="chunks",
            error_message=f"sent, then {why} before this request's row was written"))
    return rows


def _merge(out_dir: Path, trace: Trace, config: ReplayConfig, parts: Sequence[Trace],
           dirs: Sequence[Path], run_id: str, reports: dict[int, dict[str, Any]],
           ends: dict[int, WorkerEnd], status: str, sent_logs: Sequence[Any],
           t0_ns: int | None) -> _Merged:
    """Merge every worker's records (and the rows of what it sent but never recorded) into
    the run folder. A disk that refuses the merged files does not lose the summary: it is
    returned, computed in memory, with the reason."""
    recorded: list[list[RequestTimeline]] = []
    lost = []
    for w, d in enumerate(dirs):
        end = ends.get(w, WorkerEnd("ended"))
        why = (f"worker {w} {end.detail}" if end.status == "died"
               else f"worker {w} failed ({end.detail})" if end.status == "failed"
               else f"worker {w} ended ({end.status})")
        message = f"sent, then {why} before this request's row was written"
        # its rows, and one for each request its sent records say went out with no row after
        records = (load_records(d / RECORDS_FILE, unrecorded_message=message)
                   if (d / RECORDS_FILE).exists() else Records([], [], True))
        rows = records.timelines
        # and for any its sent records missed, the ones shared memory noted
        extra = unrecorded_sends(parts[w], rows, sent_logs[w], t0_ns=t0_ns, mode=config.mode,
                                 why=why)
        lost.append(len(records.unrecorded) + len(extra))
        recorded.append([*rows, *extra])
    timelines = merge_timelines(recorded)
    # how the run ended and how much of the trace it sent (as replay's summary says)
    fields = {"status": status, "num_planned": len(trace.requests),
              "num_not_sent": len(trace.requests) - len(timelines)}
    per_worker = []
    for w, part in enumerate(recorded):
        lags = [tl.send_lag_s for tl in part if tl.sent_s is not None]
        p99 = distribution(lags)["p99"] if lags else None
        per_worker.append({
            "worker": w, "folder": str(dirs[w].relative_to(out_dir)),
            "status": ends[w].status if w in ends else None,
            "num_requests": len(part),
            "num_sent_unrecorded": lost[w],  # rows added for it: it died or failed first
            "send_lag_s_p99": p99,
            "client_limited": bool(p99 is not None and p99 > config.client_lag_threshold_s),
            "cpu_s": (reports.get(w) or {}).get("cpu_s"),  # the worker's CPU in its replay
        })
    write_error: str | None = None
    try:
        summary = consolidate(out_dir, timelines, slo=config.slo,
                              client_lag_threshold_s=config.client_lag_threshold_s,
                              run_id=run_id, fields=fields)
    except OSError as exc:  # a full disk: the figures still get to the caller
        write_error = _merge_write_error(exc, out_dir)
        summary = with_engine_counters(  # as consolidate would: never the requests' zero
            summarize(timelines, slo=config.slo,
                      client_lag_threshold_s=config.client_lag_threshold_s), out_dir)
        summary.update(run_id=run_id, **fields)
    summary["workers"] = per_worker
    if any(w["client_limited"] for w in per_worker):
        summary["client_limited"] = True
    if write_error is None:
        try:
            write_json_atomic(summary, out_dir / SUMMARY_FILE)
        except OSError as exc:
            write_error = _merge_write_error(exc, out_dir)
    if write_error is not None:
        summary.update(status="failed", stopped_early=write_error)
    return _Merged(summary, lost, write_error)


def _merge_write_error(exc: OSError, out_dir: Path) -> str:
    where = exc.filename or out_dir
    return (f"{where}: {exc.strerror or exc}: the merged results could not be written (each "
            f"worker's records.jsonl in {out_dir / WORKERS_DIR} holds what it measured)")
