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

The summary is that of one run over all requests, plus ``workers``: per worker its requests,
send-lag p99, whether it was client-limited (the run is client-limited if any worker was) and
the CPU seconds its replay took (near the run's duration: that worker was CPU-bound).
A closed loop splits its users the same way (each worker's users take its part in order); an
open loop's ``max_concurrency`` cap is split too. A request sent twice or recorded by two workers
is an error; requests never sent (Ctrl-C) are counted in the manifest, as in one process.
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
from typing import Any

from harness.live.config import ReplayConfig
from harness.live.recorder import RECORDS_FILE, read_records
from harness.live.rundir import consolidate
from harness.manifest import read_manifest, run_fields, trace_manifest, update_manifest
from harness.metrics import distribution
from harness.results import SUMMARY_FILE, write_json_atomic
from harness.runfolder import RunIdentity, claim_run_dir
from harness.timeline import RequestTimeline
from harness.traces import Trace

WORKERS_DIR = "workers"
DEFAULT_START_MARGIN_S = 1.0  # between the last worker's "ready" and t0
READY_TIMEOUT_S = 120.0


class WorkerError(RuntimeError):
    """A worker process failed to start or to replay its part (the message says which)."""


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


def _worker_main(index: int, trace: Trace, config: ReplayConfig, out_dir: str,
                 to_parent: Any, t0_conn: Any, parent_pid: int) -> None:
    """One worker process: say ready, wait for t0, replay its part, report."""
    from harness.live.replay import replay

    _exit_with_parent(parent_pid)

    def progress(done: int, _total: int) -> None:
        to_parent.put(("progress", index, done))

    try:
        to_parent.put(("ready", index, None))
        t0_ns = t0_conn.recv()
        if t0_ns is None:
            return  # the parent gave up before t0
        cpu_s = time.process_time()
        summary = asyncio.run(replay(trace, config, Path(out_dir), progress=progress,
                                     t0_ns=t0_ns, overwrite=True))
        to_parent.put(("done", index, {"num_requests": summary.get("num_requests"),
                                       "cpu_s": time.process_time() - cpu_s}))
    except KeyboardInterrupt:
        to_parent.put(("interrupted", index, None))
    except BaseException as exc:
        to_parent.put(("error", index, f"{type(exc).__name__}: {exc}"))


def _exit_with_parent(parent_pid: int, interval_s: float = 1.0) -> None:
    """Stop this worker when its parent is gone (killed outright, so no signal reached the
    workers): nothing would merge what it replays, and its last message to the parent would
    wait on a pipe no one reads, forever. What it recorded stays in its own folder."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        os._exit(1)  # no normal exit: that would wait to flush the queue to the dead parent

    threading.Thread(target=watch, name="batchlab-parent-watch", daemon=True).start()


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
) -> dict[str, Any]:
    """Replay ``trace`` from ``num_workers`` processes into one run folder; the summary.

    ``on_t0`` gets the shared clock origin (``perf_counter_ns``, ``start_margin_s`` ahead)
    once every worker has it."""
    config.validate()
    if num_workers < 1:
        raise ValueError(f"workers: must be at least 1, got {num_workers}")
    configs = worker_configs(config, num_workers)
    out_dir = Path(out_dir)
    run_id = claim_run_dir(out_dir, RunIdentity("live", trace.digest, target=config.target_url),
                           overwrite=overwrite)
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
    ctx = mp.get_context("spawn")  # a clean interpreter per worker: no inherited event loop
    to_parent = ctx.Queue()
    pipes = [ctx.Pipe(duplex=False) for _ in range(num_workers)]
    procs = [ctx.Process(target=_worker_main, name=f"batchlab-replay-w{w}", daemon=True,
                         args=(w, parts[w], configs[w], str(dirs[w]), to_parent, pipes[w][0],
                               os.getpid()))
             for w in range(num_workers)]
    status, errors, t0_ns = "interrupted", [], None
    done: dict[int, int] = {}
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
        errors = _wait_done(to_parent, procs, done, len(trace.requests), progress, reports)
        status = "failed" if errors else "finished"
    finally:
        if t0_ns is None:  # it never started: tell the workers waiting for t0 to go
            for _, send in pipes:
                with contextlib.suppress(OSError):
                    send.send(None)
        if status == "interrupted" and t0_ns is not None:
            _stop_workers(procs)
        for proc in procs:
            if proc.pid is None:
                continue  # never started
            proc.join(timeout=60)
            if proc.is_alive():
                proc.terminate()
        summary = _merge(out_dir, trace, config, dirs, run_id, reports, status)
        update_manifest(out_dir, {
            "status": status, "t0_perf_counter_ns": t0_ns, "errors": errors,
            "num_sent": sum(int(read_manifest(d).get("num_sent") or 0) for d in dirs),
            "num_recorded": summary["num_requests"],
            "num_not_sent": len(trace.requests) - summary["num_requests"],
            "num_planned": len(trace.requests),
            "client_limited": summary.get("client_limited"),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        })
    if errors:
        raise WorkerError("replay workers failed: " + "; ".join(errors))
    return summary


def _stop_workers(procs: Sequence[Any], grace_s: float = 2.0) -> None:
    """Ctrl-C for the workers that did not get it: a signal sent to this process alone (kill,
    a supervisor, ``timeout --foreground``) reaches no worker. Workers that did get it (a
    terminal's Ctrl-C reaches the whole process group) have ``grace_s`` to finish first, so
    that none is interrupted a second time while it records its requests in flight."""
    deadline = time.monotonic() + grace_s
    for proc in procs:
        if proc.pid is not None:
            proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.pid is not None and proc.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGINT)


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


def _wait_done(to_parent: Any, procs: Sequence[Any], done: dict[int, int], total: int,
               progress: Callable[[int, int], None] | None,
               reports: dict[int, dict[str, Any]]) -> list[str]:
    finished: set[int] = set()
    errors: list[str] = []
    while len(finished) < len(procs):
        try:
            kind, index, payload = to_parent.get(timeout=0.5)
        except queue_mod.Empty:
            dead = [i for i, p in enumerate(procs) if not p.is_alive() and i not in finished]
            for i in dead:  # died without a word (killed): what it recorded is still merged
                finished.add(i)
                errors.append(f"worker {i} exited with code {procs[i].exitcode}")
            continue
        if kind == "progress":
            done[index] = payload
            if progress is not None:
                progress(sum(done.values()), total)
        elif kind in ("done", "error", "interrupted"):
            finished.add(index)
            if kind == "done":
                reports[index] = payload
            if kind == "error":
                errors.append(f"worker {index}: {payload}")
            elif kind == "interrupted":
                raise KeyboardInterrupt
    return errors


def merge_timelines(parts: Sequence[Sequence[RequestTimeline]]) -> list[RequestTimeline]:
    """The workers' timelines as one run's, in arrival order; a request recorded twice is an
    error (each worker had its own requests)."""
    merged = [tl for part in parts for tl in part]
    twice = [rid for rid, n in Counter(tl.request_id for tl in merged).items() if n > 1]
    if twice:
        raise ValueError(f"requests recorded by more than one worker: {', '.join(twice[:5])}")
    return sorted(merged, key=lambda tl: (tl.arrival_s, tl.request_id))


def _merge(out_dir: Path, trace: Trace, config: ReplayConfig, dirs: Sequence[Path],
           run_id: str, reports: dict[int, dict[str, Any]], status: str) -> dict[str, Any]:
    parts = [read_records(d / RECORDS_FILE) if (d / RECORDS_FILE).exists() else []
             for d in dirs]
    timelines = merge_timelines(parts)
    summary = consolidate(out_dir, timelines, slo=config.slo,
                          client_lag_threshold_s=config.client_lag_threshold_s, run_id=run_id)
    per_worker = []
    for w, part in enumerate(parts):
        lags = [tl.send_lag_s for tl in part if tl.sent_s is not None]
        p99 = distribution(lags)["p99"] if lags else None
        per_worker.append({
            "worker": w, "folder": str(dirs[w].relative_to(out_dir)),
            "num_requests": len(part), "send_lag_s_p99": p99,
            "client_limited": bool(p99 is not None and p99 > config.client_lag_threshold_s),
            "cpu_s": (reports.get(w) or {}).get("cpu_s"),  # the worker's CPU in its replay
        })
    summary["workers"] = per_worker
    if any(w["client_limited"] for w in per_worker):
        summary["client_limited"] = True
    # how the run ended and how much of the trace it sent (as replay's summary says)
    summary.update(status=status, num_planned=len(trace.requests),
                   num_not_sent=len(trace.requests) - summary["num_requests"])
    write_json_atomic(summary, out_dir / SUMMARY_FILE)
    return summary
