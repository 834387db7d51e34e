"""A simulated run: a trace through the reference engine on its virtual clock, into a run folder.

The folder has the same files as a live run (``harness.results``), plus ``steps.parquet``, so
metrics and reports never need to know which kind of run produced it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from adapters.reference import ReferenceConfig
from harness.manifest import MANIFEST_FILE, batchlab_version, run_fields, trace_manifest
from harness.metrics import Slo, summarize
from harness.results import (
    STEPS_FILE,
    SUMMARY_FILE,
    write_json_atomic,
    write_parquet_atomic,
    write_timelines,
)
from harness.sim.driver import simulate
from harness.traces import Trace


def reference_engine_manifest(config: ReferenceConfig, num_kv_blocks_total: int) -> dict[str, Any]:
    return {
        "name": "reference",
        "mode": "simulated",
        "version": batchlab_version(),
        "config": config.as_dict(),
        "num_kv_blocks_total": num_kv_blocks_total,
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
) -> dict[str, Any]:
    """Simulate ``trace`` on the reference engine and write the run folder; returns the summary."""
    out_dir.mkdir(parents=True, exist_ok=True)
    wall_start = time.perf_counter()
    result = simulate(trace.requests, config, progress=progress)
    wall_s = time.perf_counter() - wall_start

    write_timelines(out_dir, result.timelines, live=False)
    write_parquet_atomic(result.steps, out_dir / STEPS_FILE)
    summary = summarize(result.timelines, slo=slo)
    summary["num_steps"] = result.steps.num_rows
    summary["simulation_wall_s"] = wall_s
    write_json_atomic(summary, out_dir / SUMMARY_FILE)

    cfg = config.as_dict()
    manifest = {
        **run_fields("simulated", command),
        "engine": reference_engine_manifest(config, result.num_kv_blocks_total),
        "model": cfg.get("model"),
        "gpu": cfg.get("gpu"),
        "knobs": knobs,
        "trace": trace_manifest(trace),
        "slo": slo.as_dict() if slo else None,
        "client_limited": None,
        "status": "finished",
    }
    write_json_atomic(manifest, out_dir / MANIFEST_FILE)

    if write_report:
        _write_run_report(out_dir)
    return summary


def _write_run_report(run_dir: Path) -> None:
    try:
        from harness.report import render_run_report
    except ImportError:  # the rich report module is optional for a bare simulation
        return
    render_run_report(run_dir)


def read_steps(run_dir: Path) -> Any:
    path = run_dir / STEPS_FILE
    return pq.read_table(path) if path.exists() else None
