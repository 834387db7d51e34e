"""A cell folder's markers (cell.json, status.json, error.txt) and how a cell ended."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from harness.results import write_json_atomic
from harness.scenario.schema import Cell, Scenario, ScenarioError

# ``status.json`` is a cell's completion marker, written last and atomically::
#
#     cell.json    what the cell is (engine, knobs, load) and its digest, written first
#     status.json  {"state": "running"}  ──►  "done" (written after every result file)
#                                       └──►  "failed" with the reason (the sweep goes on)
#
# ``--resume`` skips a cell whose status is "done" with the same digest and redoes the rest, so
# a sweep killed mid-cell loses nothing that had finished.
CELL_FILE = "cell.json"
STATUS_FILE = "status.json"
ERROR_FILE = "error.txt"


@dataclass(frozen=True, slots=True)
class CellOutcome:
    """How one cell of the sweep ended, and its run folder."""

    name: str
    state: Literal["done", "failed", "skipped", "not_run"]
    reason: str = ""
    run_dir: Path | None = None


def read_status(cell_dir: Path) -> dict[str, Any]:
    """The cell's status record, ``{}`` when it never started."""
    try:
        status = json.loads((cell_dir / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def prepare_cell_dir(cell_dir: Path, scenario: Scenario, cell: Cell, attempt: int) -> None:
    """Empty the cell's folder (refusing one batchlab did not write), then mark it running."""
    if cell_dir.exists() and any(cell_dir.iterdir()):
        if not ((cell_dir / CELL_FILE).exists() or (cell_dir / STATUS_FILE).exists()):
            raise ScenarioError(scenario.source, None, "",
                                f"{cell_dir} holds files batchlab did not write; "
                                "move them or choose another --out")
        shutil.rmtree(cell_dir)
    cell_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic({**cell.as_dict(), "scenario": scenario.name,
                       "digest": scenario.cell_digest(cell)}, cell_dir / CELL_FILE)
    write_json_atomic({"state": "running", "started_at": _now(), "attempt": attempt,
                       "digest": scenario.cell_digest(cell)}, cell_dir / STATUS_FILE)


def finish_status(cell_dir: Path, state: str, reason: str, status: dict[str, Any]) -> None:
    """Mark the cell done or failed (with the reason): the last file written."""
    record = {**status, "state": state, "finished_at": _now()}
    if reason:
        record["reason"] = reason
    write_json_atomic(record, cell_dir / STATUS_FILE)
