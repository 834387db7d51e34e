"""A run folder belongs to one run: claimed before anything is written, stamped with a run id.

    claim_run_dir(out, RunIdentity("live", digest, engine="vllm"), overwrite=False) -> run_id

- The folder must be a folder batchlab can write (not a file, not read-only): otherwise a
  one-line ``RunDirError`` names the path.
- A folder holding another run (a different kind, trace digest, engine or target; read from its
  ``manifest.json``) is refused unless ``overwrite``; then it is emptied first. The same run
  again (same identity) replaces the old one: its files are removed first, so nothing of the
  old run (engine, knobs, telemetry, records.jsonl) survives into the new one.
- A folder holding files batchlab did not write is refused, even with ``overwrite``.
- A scenario cell's markers (``cell.json``, ``status.json``, ``error.txt``) belong to the sweep
  that prepared the folder and are kept.

The claim writes a first ``manifest.json`` with the run's ``run_id`` (uuid4 hex) and identity;
``summary.json``, the parquet files (schema metadata ``batchlab.run_id``) and ``records.jsonl``
(its header line) carry the same id.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.manifest import MANIFEST_FILE, read_manifest
from harness.results import write_json_atomic

# Sweep markers a cell folder holds before its run starts (harness.scenario.status).
MARKERS = frozenset({"cell.json", "status.json", "error.txt"})
# What a run writes: exact names, and suffixes of its tables, logs, plots and temporaries.
RUN_FILES = frozenset({MANIFEST_FILE, "summary.json", "records.jsonl", "report.md"})
RUN_SUFFIXES = (".parquet", ".log", ".png", ".tmp")


class RunDirError(ValueError):
    """The output folder cannot be used for this run; the message names it."""


class RunWriteError(OSError):
    """The disk refused a file of a run in progress (full, gone read-only); the message says
    which file, where the run stopped, and what is on disk."""


@dataclass(frozen=True, slots=True)
class RunIdentity:
    """What makes two runs "the same run": only then may one replace the other unasked."""

    kind: str  # "simulated" | "live"
    trace_digest: str | None
    engine: str | None = None  # None: a plain replay against a URL
    target: str | None = None  # the URL of an attached server or a plain replay

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        what = f"a {self.kind} run"
        if self.engine:
            what += f" of {self.engine}"
        if self.target:
            what += f" at {self.target}"
        digest = (self.trace_digest or "?")[:12]
        return f"{what} on trace {digest}"

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> RunIdentity | None:
        """The identity a manifest records, or the one its fields imply (older manifests)."""
        stored = manifest.get("identity")
        if isinstance(stored, dict) and "kind" in stored:
            return cls(str(stored["kind"]), stored.get("trace_digest"), stored.get("engine"),
                       stored.get("target"))
        if "kind" not in manifest:
            return None
        trace = manifest.get("trace") or {}
        engine = manifest.get("engine") if isinstance(manifest.get("engine"), dict) else None
        name = engine.get("name") if engine else None
        if engine and engine.get("mode") == "attach":
            target = engine.get("base_url")
        elif engine:
            target = None
        else:
            target = manifest.get("target")
        return cls(str(manifest["kind"]), trace.get("digest") if isinstance(trace, dict)
                   else None, name, target)


def new_run_id() -> str:
    return uuid.uuid4().hex


def _run_file(path: Path) -> bool:
    return path.is_file() and (path.name in RUN_FILES or path.name.endswith(RUN_SUFFIXES))


def _unwritable(folder: Path) -> str | None:
    """Why ``folder`` cannot be created or written, or None (it exists now)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".batchlab-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return str(exc.strerror or exc)
    return None


def ensure_writable_dir(path: Path, what: str = "--out") -> None:
    """Create ``path`` if needed and prove it writable; RunDirError naming it otherwise."""
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{what} {path}: is a file, not a folder")
    reason = _unwritable(path)
    if reason is not None:
        raise RunDirError(f"{what} {path}: cannot write there ({reason})")


def ensure_creatable_dir(path: Path, what: str = "--out") -> None:
    """``ensure_writable_dir`` without creating anything: ``path`` is a writable folder, or
    could be made in its nearest existing folder (a command refused later leaves no folder)."""
    if path.exists():
        ensure_writable_dir(path, what)
        return
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise RunDirError(f"{what} {path}: cannot write there ({parent} is a file, not a "
                          "folder)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RunDirError(f"{what} {path}: cannot write there (no write permission in "
                          f"{parent})")


def ensure_writable_file(path: Path, what: str = "-o") -> None:
    """A file path batchlab may (re)write: its folder writable, the path not a folder."""
    if path.is_dir():
        raise RunDirError(f"{what} {path}: is a folder, not a file")
    reason = _unwritable(path.parent)
    if reason is not None:
        raise RunDirError(f"{what} {path}: cannot write there ({reason})")


def refuse_cell_folder(out_dir: Path | str, what: str = "--out") -> None:
    """A scenario cell's or capacity probe's folder (its ``cell.json``) belongs to that sweep:
    a run of its own there would leave the cell's definition describing other results. Raises
    RunDirError, naming the command that redoes the cell."""
    out = Path(out_dir)
    if (out / "cell.json").is_file():
        raise RunDirError(
            f"{what} {out}: is a cell of a scenario or capacity search (its cell.json); "
            "`batchlab run SCENARIO --only CELL` (or `batchlab capacity ... --resume`) redoes "
            "it: choose another folder")


def claim_run_dir(out_dir: Path | str, identity: RunIdentity, *, overwrite: bool = False,
                  what: str = "--out") -> str:
    """Make ``out_dir`` this run's folder (module doc); returns the new run id."""
    out = Path(out_dir)
    ensure_writable_dir(out, what)
    entries = [p for p in out.iterdir() if p.name not in MARKERS]
    manifest = read_manifest(out) if (out / MANIFEST_FILE).exists() else {}
    previous = RunIdentity.from_manifest(manifest) if manifest else None
    if entries:
        if previous is None:
            foreign = sorted(p.name + ("/" if p.is_dir() else "") for p in entries
                             if not _run_file(p))
            if foreign:
                shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
                raise RunDirError(f"{what} {out}: holds files batchlab did not write ({shown}); "
                                  "choose an empty or new folder")
            if not overwrite:
                raise RunDirError(f"{what} {out}: holds files of an earlier run without a "
                                  "manifest; pass --overwrite to replace them, or choose "
                                  "another folder")
        elif previous != identity and not overwrite:
            raise RunDirError(
                f"{what} {out}: holds another run ({previous.describe()}; this is "
                f"{identity.describe()}); pass --overwrite to replace it, or choose another "
                "folder")
        _clear(out, everything=overwrite and previous != identity)
    run_id = new_run_id()
    write_json_atomic({"run_id": run_id, "identity": identity.as_dict(),
                       "kind": identity.kind, "status": "starting"}, out / MANIFEST_FILE)
    return run_id


def _clear(out: Path, *, everything: bool) -> None:
    """Remove the earlier run's files (all but the sweep's markers with ``everything``)."""
    for path in out.iterdir():
        if path.name in MARKERS:
            continue
        if path.is_dir() and not path.is_symlink():
            if everything:
                shutil.rmtree(path)
        elif everything or _run_file(path) or path.is_symlink():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

