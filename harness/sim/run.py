"""A simulated run: a trace through the reference engine on its virtual clock, into a run folder.

The folder has the same files as a live run (``harness.results``), plus ``steps.parquet``, so
metrics and reports never need to know which kind of run produced it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from adapters.reference import ReferenceConfig
from adapters.reference.prediction import prediction_record
from harness.manifest import (
    batchlab_version,
    run_fields,
    trace_manifest,
    update_manifest,
    write_manifest,
)
from harness.metrics import Slo, chunk_times, request_metric_columns, summarize
from harness.prediction import summary_prediction
from harness.results import (
    CHUNKS_FILE,
    REQUESTS_FILE,
    STEPS_FILE,
    SUMMARY_FILE,
    chunks_table,
    requests_table,
    write_json_atomic,
    write_tables,
)
from harness.runfolder import RunIdentity, claim_run_dir, release_run_dir
from harness.sim.driver import SimulationResult, simulate
from harness.sim.report_process import ReportProcess, signals_deferred
from harness.sim.roofline import decode_context_len, roofline_turn
from harness.target import ClosedLoop, EarlyStop
from harness.traces import Trace


def reference_engine_manifest(config: ReferenceConfig, num_kv_blocks_total: int) -> dict[str, Any]:
    return {
        "name": "reference",
        "mode": "simulated",
        "version": batchlab_version(),
        "config": config.as_dict(),
        "num_kv_blocks_total": num_kv_blocks_total,
        "prediction": prediction_record(config),
    }


def run_simulation(
    trace: Trace,
    config: ReferenceConfig,
    out_dir: Path,
    *,
    slo: Slo | None = None,
    progress: Callable[[int, int], None] | None = None,
    command: Sequence[str] | None = None,
    knobs: dict[str, Any] | None = None,
    write_report: bool = True,
    closed_loop: ClosedLoop | None = None,
    early_stop: EarlyStop | None = None,
    overwrite: bool = False,
    reporter: ReportProcess | None = None,
) -> dict[str, Any]:
    """Simulate ``trace`` on the reference engine and write the run folder; returns the summary.

    ``closed_loop``: N users instead of the trace's arrival times. ``early_stop``: see
    ``simulate``; the summary and manifest then say why the run stopped (``stopped_early``).
    ``out_dir`` is claimed first (``harness.runfolder``): a folder of another run is refused
    unless ``overwrite``. Interrupted (Ctrl-C, SIGTERM), the manifest says so.

    ``write_report``: ``report.md`` and its plots, by a child process started now, so that
    loading the plotting code overlaps the simulation; it draws each plot as soon as the file
    it is drawn from is on disk, and writes ``report.md`` once every result is
    (``harness.sim.report_process``). ``reporter``: that child, started earlier by the caller
    (``ReportProcess.start``, before loading this module) so that it loads beside the caller's
    own imports; this call owns it from then on, and closes it. Ignored without
    ``write_report``.
    """
    identity = RunIdentity("simulated", trace.digest, engine="reference")
    if not write_report and reporter is not None:
        reporter.close()
        reporter = None
    try:
        run_id = claim_run_dir(out_dir, identity, overwrite=overwrite)
    except BaseException:
        if reporter is not None:
            reporter.close()
        raise
    try:
        # a Ctrl-C (or SIGTERM) that landed between the child's fork and the assignment would
        # leave the child running unseen, and the folder "starting": it waits until the child
        # is kept, then the manifest says the run was interrupted
        with _said_in_manifest(out_dir, command, failed="the report renderer could not start",
                               interrupted="interrupted before the simulation started",
                               told="the simulation had not started: nothing was measured"
                               ), signals_deferred():
            if write_report and reporter is None:
                reporter = ReportProcess.start()
        summary = _run(trace, config, out_dir, run_id, identity, slo=slo, progress=progress,
                       command=command, knobs=knobs, closed_loop=closed_loop,
                       early_stop=early_stop, reporter=reporter)
        if write_report:
            _write_run_report(out_dir, reporter)
    finally:
        if reporter is not None:
            reporter.close()
        release_run_dir(out_dir)  # the run has ended: another process may write the folder
    return summary


def _run(trace: Trace, config: ReferenceConfig, out_dir: Path, run_id: str,
         identity: RunIdentity, *, slo: Slo | None,
         progress: Callable[[int, int], None] | None, command: Sequence[str] | None,
         knobs: dict[str, Any] | None, closed_loop: ClosedLoop | None,
         early_stop: EarlyStop | None, reporter: ReportProcess | None) -> dict[str, Any]:
    """The simulation and every result file, each announced to ``reporter`` as it is on
    disk; the summary. The simulation's records are freed on return, while the reporter
    writes report.md."""
    with _said_in_manifest(out_dir, command, failed="the simulation failed",
                           interrupted="interrupted before the simulation finished",
                           told="the simulation had not finished: nothing was measured"):
        # what ran is on record before it runs: a run cut short anywhere after this still
        # says its engine, profile, model, GPU, knobs and trace (and so that it is predicted)
        manifest = _run_manifest(trace, config, run_id, identity, slo=slo, command=command,
                                 knobs=knobs, closed_loop=closed_loop)
        update_manifest(out_dir, {**manifest, "status": "running"})
        wall_start = time.perf_counter()
        result = simulate(trace.requests, config, progress=progress, closed_loop=closed_loop,
                          early_stop=early_stop)
    wall_s = time.perf_counter() - wall_start
    with _said_in_manifest(out_dir, command, failed="writing the results failed",
                           interrupted="interrupted while its results were written: some "
                                       "files may be missing",
                           told="interrupted while the results were written: some files "
                                "may be missing"):
        summary = _write_results(result, wall_s, trace, config, out_dir, run_id, manifest,
                                 slo=slo, reporter=reporter)
    return summary


@contextlib.contextmanager
def _said_in_manifest(out_dir: Path, command: Sequence[str] | None, *, failed: str,
                      interrupted: str, told: str) -> Iterator[None]:
    """An error or Ctrl-C in the block: the manifest says ``failed`` (with the error) or
    ``interrupted`` before it goes on; Ctrl-C goes on with ``told`` for the command line."""
    try:
        yield
    except KeyboardInterrupt:
        _mark(out_dir, command, "interrupted", interrupted)
        raise KeyboardInterrupt(f"{told} (the manifest in {out_dir} says so)") from None
    except Exception as exc:
        _mark(out_dir, command, "failed", f"{failed}: {type(exc).__name__}: {exc}")
        raise


def _mark(out_dir: Path, command: Sequence[str] | None, status: str, error: str) -> None:
    """The manifest says how the run ended when it did not finish."""
    update_manifest(out_dir, {**run_fields("simulated", command), "status": status,
                              "error": error})


def _run_manifest(trace: Trace, config: ReferenceConfig, run_id: str, identity: RunIdentity,
                  *, slo: Slo | None, command: Sequence[str] | None,
                  knobs: dict[str, Any] | None, closed_loop: ClosedLoop | None
                  ) -> dict[str, Any]:
    """The manifest of a simulated run but how it ended: what is known before it runs."""
    cfg = config.as_dict()
    return {
        **run_fields("simulated", command),
        "run_id": run_id,
        "identity": identity.as_dict(),
        "engine": reference_engine_manifest(config, config.resolved_num_gpu_blocks()),
        "model": cfg.get("model"),
        "gpu": cfg.get("gpu"),
        "knobs": knobs,
        "trace": trace_manifest(trace),
        "slo": slo.as_dict() if slo else None,
        "client_limited": None,
        "load": _load_manifest(closed_loop, trace),
        "roofline": roofline_turn(config, decode_context_len(trace.requests)),
    }


def _write_results(result: SimulationResult, wall_s: float, trace: Trace,
                   config: ReferenceConfig, out_dir: Path, run_id: str,
                   manifest: dict[str, Any], *, slo: Slo | None,
                   reporter: ReportProcess | None) -> dict[str, Any]:
    """Every result file of a finished simulation, summary.json after the tables and the
    manifest (``_run_manifest``, with how the run ended) last; the summary."""

    # parquet writing releases the GIL: each file is written while the next table and the
    # summary are computed, and all are on disk before summary.json. The chunk instants
    # (millions on a whole trace) and the per-request metrics are gathered once, for the
    # tables and the summary.
    def write(name: str, table: pa.Table) -> None:
        write_tables(out_dir, {name: table}, run_id=run_id)
        if reporter is not None:
            reporter.file_written(out_dir, name)

    with ThreadPoolExecutor(max_workers=1) as pool:
        chunks = chunk_times(result.timelines)
        metrics = request_metric_columns(result.timelines, chunks)
        jobs = [pool.submit(write, STEPS_FILE, result.steps),
                pool.submit(write, REQUESTS_FILE,
                            requests_table(result.timelines, metrics=metrics,
                                           chunks=chunks))]
        jobs.append(pool.submit(write, CHUNKS_FILE, chunks_table(result.timelines, chunks)))
        summary = summarize(result.timelines, slo=slo, chunks=chunks, metrics=metrics)
        for job in jobs:
            job.result()
    summary["num_steps"] = result.steps.num_rows
    summary["simulation_wall_s"] = wall_s
    summary["run_id"] = run_id
    if result.prefix_cache is not None:
        summary["prefix_cache"] = result.prefix_cache
    if result.num_swap_fallbacks is not None:
        summary["num_swap_fallbacks"] = result.num_swap_fallbacks
    if result.stopped_reason:
        summary["stopped_early"] = result.stopped_reason
    summary["status"] = "stopped" if result.stopped_reason else "finished"
    summary["num_planned"] = len(trace.requests)
    summary["num_not_sent"] = result.num_not_sent
    engine = reference_engine_manifest(config, result.num_kv_blocks_total)
    summary["prediction"] = summary_prediction(engine)
    write_json_atomic(summary, out_dir / SUMMARY_FILE)

    manifest = {**manifest, "engine": engine,
                "status": "stopped" if result.stopped_reason else "finished"}
    if result.stopped_reason:
        manifest["stopped_early"] = result.stopped_reason
    write_manifest(out_dir, manifest)
    if reporter is not None:
        reporter.folder_written(out_dir)
    return summary


def _load_manifest(closed_loop: ClosedLoop | None, trace: Trace) -> dict[str, Any]:
    """How requests arrived, with the load in a scenario cell's terms (``kind``, ``value``)
    when the run had one: users, or the trace's arrivals rescaled to a rate or time scale."""
    if closed_loop is not None:
        return {"mode": "closed", "concurrency": closed_loop.concurrency,
                "think_time_s": closed_loop.think_time_s,
                "kind": "concurrency", "value": closed_loop.concurrency}
    timing = trace.timing or {}
    arrivals = {"rate": f"the trace's requests at a mean rate of {timing.get('value')} req/s",
                "time_scale": f"the trace's arrival times × {timing.get('value')}"}
    if timing.get("value") == "inf":  # an infinite rate, as a trace record spells it
        arrivals["rate"] = "every request at 0 s"
    elif timing.get("arrival"):
        arrivals["rate"] = f"synthetic {timing['arrival']} arrivals at {timing['value']} req/s"
    return {"mode": "open",
            "arrivals": arrivals.get(str(timing.get("kind")), "the trace's arrival times"),
            **{k: v for k, v in timing.items() if k in ("kind", "value")}}


def _write_run_report(run_dir: Path, reporter: ReportProcess | None) -> None:
    if reporter is not None:
        reporter.wait(run_dir)  # asked for by _run once the folder was complete
        return
    try:  # no child process could be started: here
        from harness.report import render_run_report
    except ImportError:  # the rich report module is optional for a bare simulation
        return
    render_run_report(run_dir)


def read_steps(run_dir: Path) -> Any:
    path = run_dir / STEPS_FILE
    return pq.read_table(path) if path.exists() else None
