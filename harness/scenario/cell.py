"""Running one cell in this process: a ``CellJob`` in, a run folder and its summary out."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapters.knobs import ReferenceKnobs
from harness.manifest import record_failed
from harness.metrics import Slo
from harness.results import NothingServed, nothing_served
from harness.scenario.attached import (
    ServerRestarted,
    ServerStoppedAnswering,
    fail_if_gone,
    fail_if_restarted,
    is_attached,
)
from harness.scenario.schema import Cell
from harness.target import ClosedLoop, RunOptions, TargetSpec
from harness.targets import SimulatedTarget, make_target

ProgressFn = Callable[[int, int | None], None]
CellRunner = Callable[["CellJob", Path, ProgressFn], Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class CellJob:
    """Everything one cell needs to run anywhere (this process or a Ray worker)."""

    cell: Cell
    trace: Any  # harness.traces.Trace at this cell's load point
    model: str
    gpu: str
    slo: Slo | None
    command: tuple[str, ...]  # the argv that reproduces this cell


def run_cell(job: CellJob, out_dir: Path, progress: ProgressFn) -> Mapping[str, Any]:
    """Run one cell into ``out_dir`` on its target; return the summary."""
    cell = job.cell
    replay = dict(cell.engine.replay)
    closed_loop = None
    if cell.load.kind == "concurrency" and cell.load.value is not None:
        if cell.engine.mode == "simulated":  # N users on the virtual clock
            closed_loop = ClosedLoop(int(cell.load.value))
        else:
            replay.setdefault("mode", "closed")
            replay["concurrency"] = int(cell.load.value)
    # No per-cell report.md: the scenario's report covers every cell (and plotting each cell
    # would double the sweep's time on small runs).
    options = RunOptions(slo=job.slo, progress=progress, command=list(job.command),
                         replay=replay, write_report=False, closed_loop=closed_loop)
    spec = target_spec(cell, job.model, job.gpu)
    summary = make_target(spec).run(job.trace, out_dir, options)
    # its files are on disk; but a cell that served nothing measured nothing: it fails, with
    # the first error, and --resume runs it again
    why = nothing_served(summary, out_dir)
    if why is not None:  # its summary and manifest say so, as `batchlab simulate`'s do
        record_failed(out_dir, summary, why)
        raise NothingServed(why)
    if not is_attached(spec) or not spec.url:
        return summary
    gone = fail_if_gone(out_dir, summary, spec.url)
    if gone is not None:  # as a launched engine's exit: a failed cell, run again by --resume
        raise ServerStoppedAnswering(gone)
    # restarted under it with other settings: figures of two configurations, also run again
    restarted = fail_if_restarted(out_dir, summary, spec.url)
    if restarted is not None:
        raise ServerRestarted(restarted)
    return summary



def target_spec(cell: Cell, model: str, gpu: str | None) -> TargetSpec:
    """The cell's engine as a target: the simulated reference, or a live engine."""
    engine = cell.engine
    # the reference's own settings and profile: simulated, or served live (`serve reference`)
    reference = ReferenceKnobs.from_mapping({
        "admission": engine.admission, "num_gpu_blocks": engine.num_gpu_blocks,
        "block_size": engine.block_size,
    }) if engine.engine == "reference" else ReferenceKnobs()
    if engine.mode == "simulated":
        return TargetSpec("reference", "simulate", knobs=cell.knobs, reference=reference,
                          model=engine.model or model, gpu=gpu, profile=engine.profile)
    return TargetSpec(
        engine.engine, "launch" if engine.launch else "attach", knobs=cell.knobs,
        reference=reference, model=engine.model or model,
        served_model_name=engine.served_model_name, gpu=gpu, profile=engine.profile,
        url=engine.url, allow_approximate=engine.allow_approximate,
        engine_env=dict(engine.env), executable=engine.executable, runtime=engine.runtime,
        port=engine.port, ready_timeout_s=engine.ready_timeout_s,
    )


def reference_config(cell: Cell, model: str, gpu: str) -> Any:
    """The reference engine's config for a simulated cell (also built at load time, to check)."""
    return SimulatedTarget(target_spec(cell, model, gpu)).config()
