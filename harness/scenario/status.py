"""A cell folder's markers (cell.json, status.json, error.txt) and how a cell ended."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from harness.redact import redact_tree
from harness.results import write_json_atomic
from harness.runfolder import LOCK_FILE, RunDirError, check_removable, remove_run_dir
from harness.scenario.schema import Cell, Scenario

# ``status.json`` is a cell's completion marker, written last and atomically::
#
#     cell.json    what the cell is (engine, knobs, load) and its digest, written first
#     status.json  {"state": "running"}  ──►  "done" (written after every result file)
#                                       ├──►  "failed" with the reason (the sweep goes on)
#                                       └──►  "interrupted" by Ctrl-C or SIGTERM (the sweep stops)
#
# A cell left "running" by a process that is gone was killed outright (SIGKILL, a power cut).
#
# ``--resume`` skips a cell whose status is "done" with the same digest, and whose files are
# still what the cell wrote (``check_done_cell``: each file it wrote present, parseable and
# with the sha256 "done" recorded), and redoes the rest: a sweep killed mid-cell loses nothing
# that had finished, and a deleted or damaged file is measured again rather than reported
# missing.
CELL_FILE = "cell.json"
STATUS_FILE = "status.json"
ERROR_FILE = "error.txt"
# What every finished cell has, simulated or live (the run folder's own files).
REQUIRED_FILES = ("requests.parquet", "summary.json", "manifest.json")
_MARKERS = (STATUS_FILE, ERROR_FILE)  # not results: never digested


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


def check_cell_dir(cell_dir: Path) -> None:
    """RunDirError naming ``cell_dir`` unless ``prepare_cell_dir`` may empty it: it holds
    nothing but batchlab's files, no other process is writing it, and what is there is a cell
    of a sweep (its markers), not a run of its own (``batchlab simulate --out`` there)."""
    what = "cell folder"
    check_removable(cell_dir, what)
    if not cell_dir.is_dir() or (cell_dir / CELL_FILE).exists() or (
            cell_dir / STATUS_FILE).exists():
        return
    if any(p.name != LOCK_FILE for p in cell_dir.iterdir()):
        raise RunDirError(f"{what} {cell_dir}: holds a run that is no cell of a sweep (it has "
                          f"no {CELL_FILE}); move it, or choose another --out")


def prepare_cell_dir(cell_dir: Path, scenario: Scenario, cell: Cell, attempt: int) -> None:
    """Empty the cell's folder (``check_cell_dir``, then ``runfolder.remove_run_dir``: never
    a file batchlab did not write, nor a folder another process writes), then mark it
    running."""
    check_cell_dir(cell_dir)
    remove_run_dir(cell_dir, "cell folder")
    cell_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(redact_tree({**cell.as_dict(), "scenario": scenario.name,  # env: ***
                                   "digest": scenario.cell_digest(cell)}), cell_dir / CELL_FILE)
    write_json_atomic({"state": "running", "started_at": _now(), "attempt": attempt,
                       "digest": scenario.cell_digest(cell)}, cell_dir / STATUS_FILE)


def interrupted_reason(exc: BaseException) -> str:
    """Why a cell or probe stopped on Ctrl-C or SIGTERM: the interrupt's own message (what was
    on disk when it came) or a plain one."""
    said = str(exc).strip()
    return said or "stopped by Ctrl-C or SIGTERM before it finished"


def mark_pending(cell_dir: Path) -> None:
    """A cell the sweep starting now will run again: ``pending`` until it does, so that a
    sweep stopped before it reaches the cell leaves no earlier sweep's results read as its
    own (they stay on disk, and the attempt count goes on)."""
    status = read_status(cell_dir)
    if not status:
        return  # it never ran: nothing on disk to be mistaken
    kept = {k: status[k] for k in ("attempt", "digest") if k in status}
    write_json_atomic({**kept, "state": "pending",
                       "reason": "not run again yet by the sweep started at " + _now()
                                 + " (what is on disk is an earlier sweep's)"},
                      cell_dir / STATUS_FILE)


def finish_status(cell_dir: Path, state: str, reason: str, status: dict[str, Any]) -> None:
    """Mark the cell done (with the sha256 of every file it wrote) or failed (with the
    reason): the last file written."""
    record = {**status, "state": state, "finished_at": _now()}
    if reason:
        record["reason"] = reason
    if state == "done":
        record["files"] = file_digests(cell_dir)
    write_json_atomic(record, cell_dir / STATUS_FILE)


def record_rewritten(cell_dir: Path, names: tuple[str, ...]) -> bool:
    """A finished cell's files that batchlab itself rewrote (``batchlab summarize`` under
    another SLO): their new digests recorded, so that ``--resume`` keeps the cell rather than
    take the rewrite for damage. False when ``cell_dir`` is no finished scenario cell."""
    status = read_status(cell_dir)
    files = status.get("files")
    if status.get("state") != "done" or not isinstance(files, dict):
        return False
    for name in names:
        if name in files and (cell_dir / name).is_file():
            files[name] = _sha256(cell_dir / name)
    write_json_atomic({**status, "files": files}, cell_dir / STATUS_FILE)
    return True


def file_digests(cell_dir: Path) -> dict[str, str]:
    """``{relative path: sha256 hex}`` of the cell's files (its markers and temporaries left
    out)."""
    out: dict[str, str] = {}
    for path in sorted(cell_dir.rglob("*")):
        rel = path.relative_to(cell_dir).as_posix()
        if path.is_file() and rel not in _MARKERS and not path.name.endswith(".tmp"):
            out[rel] = _sha256(path)
    return out


def check_done_cell(cell_dir: Path, status: dict[str, Any]) -> str:
    """Why a cell marked done cannot be kept ('' when it can): a file it must have, or one it
    wrote, is missing, does not parse, or differs from the digest recorded when it finished.
    A status written before digests were recorded is checked for presence and parsing only."""
    recorded = status.get("files")
    digests: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    for rel in dict.fromkeys([*REQUIRED_FILES, *digests]):
        path = cell_dir / rel
        if not path.is_file():
            return f"{rel} is missing"
        problem = _parse_problem(path)
        if problem:
            return f"{rel} {problem}"
        if rel in digests and _sha256(path) != digests[rel]:
            return f"{rel} changed since the cell finished (its sha256 differs)"
    return ""


def _parse_problem(path: Path) -> str:
    """'' when the file reads as its kind (parquet metadata, JSON), else what is wrong."""
    try:
        if path.suffix == ".parquet":
            pq.read_metadata(path)
        elif path.suffix == ".json":
            json.loads(path.read_bytes())
    except (OSError, ValueError, pa.ArrowException) as exc:
        return f"does not parse ({type(exc).__name__})"
    return ""


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
