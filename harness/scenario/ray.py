"""The Ray path: each cell a Ray task, its files gathered into the same folders as a local run."""

from __future__ import annotations

import contextlib
import os
import tempfile
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.behind import fell_behind_warning
from harness.scenario._text import exception_reason
from harness.scenario.cell import CellJob, run_cell
from harness.scenario.schema import Scenario, ScenarioError
from harness.scenario.status import (
    ERROR_FILE,
    CellOutcome,
    finish_status,
    prepare_cell_dir,
    read_status,
)

if TYPE_CHECKING:
    from harness.scenario.runner import SweepProgress


def _no_progress(done: int, total: int | None = None) -> None:
    """Progress of a cell on a Ray worker is not shown (the driver reports cells done)."""


def _ray_cell_task(job: CellJob) -> dict[str, Any]:
    """Run one cell on a Ray worker into a scratch folder; return its files to the driver."""
    with tempfile.TemporaryDirectory(prefix=f"batchlab-{job.cell.name}-") as tmp:
        out = Path(tmp)
        state, reason, tb = "done", "", ""
        try:
            run_cell(job, out, _no_progress)
        except Exception as exc:
            state, reason, tb = "failed", exception_reason(exc), traceback.format_exc()
        files = {p.relative_to(out).as_posix(): p.read_bytes()
                 for p in sorted(out.rglob("*")) if p.is_file()}
    return {"state": state, "reason": reason, "traceback": tb, "files": files}


@contextlib.contextmanager
def _ray_session(address: str | None) -> Iterator[Any]:
    try:
        import ray
    except ImportError:
        raise ScenarioError("--ray", None, "", "Ray is not installed: pip install 'batchlab[ray]'"
                            ) from None
    started = False
    if not ray.is_initialized():
        try:
            if address:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(include_dashboard=False, log_to_driver=False)
        except (ValueError, ConnectionError, RuntimeError, TimeoutError) as exc:
            # a malformed address, or no cluster there: bad input, said in one line
            where = f"the Ray cluster at {address!r}" if address else "a local Ray instance"
            raise ScenarioError("--ray", None, "", f"cannot start or join {where}: "
                                f"{type(exc).__name__}: {str(exc).strip()}") from None
        started = True
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def run_ray(scenario: Scenario, scenario_dir: Path, jobs: Sequence[CellJob],
            address: str | None, progress: SweepProgress) -> dict[str, CellOutcome]:
    """Run cells as Ray tasks (a live cell asks for its engine's GPUs) and gather each cell's
    files on the driver, so the run folders look exactly like a local sweep's."""
    outcomes: dict[str, CellOutcome] = {}
    if not jobs:
        return outcomes
    with _ray_session(address) as ray:
        task = ray.remote(_ray_cell_task)
        pending: dict[Any, CellJob] = {}
        for job in jobs:
            cell_dir = scenario_dir / job.cell.name
            attempt = int(read_status(cell_dir).get("attempt", 0)) + 1
            prepare_cell_dir(cell_dir, scenario, job.cell, attempt)
            ref = task.options(num_cpus=1, num_gpus=job.cell.gpus).remote(job)
            pending[ref] = job
        progress.message(f"submitted {len(jobs)} cells to Ray")
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            job = pending.pop(ready[0])
            cell_dir = scenario_dir / job.cell.name
            status = read_status(cell_dir)
            try:
                result = ray.get(ready[0])
            except Exception as exc:  # the task itself died (worker lost, ...)
                result = {"state": "failed", "reason": exception_reason(exc),
                          "traceback": traceback.format_exc(), "files": {}}
            for rel, data in result["files"].items():
                target = cell_dir / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(target.name + ".tmp")
                tmp.write_bytes(data)
                os.replace(tmp, target)
            if result["state"] == "failed":
                (cell_dir / ERROR_FILE).write_text(result["traceback"])
            finish_status(cell_dir, result["state"], result["reason"], status)
            progress.finish_cell(job.cell.name, result["state"], result["reason"])
            behind = fell_behind_warning(cell_dir) if result["state"] == "done" else ""
            if behind:
                progress.message(f"warning: {job.cell.name}: {behind}")
            outcomes[job.cell.name] = CellOutcome(job.cell.name, result["state"],
                                                  result["reason"], cell_dir)
    return outcomes
