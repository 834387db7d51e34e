"""A run folder belongs to one run: claimed before anything is written, stamped with a run id.

    claim_run_dir(out, RunIdentity("live", digest, engine="vllm"), overwrite=False) -> run_id

- The folder must be a folder batchlab can write (not a file, not read-only): otherwise a
  one-line ``RunDirError`` names the path.
- One process writes it at a time: the claim takes an exclusive lock (``LOCK_FILE``, with
  ``fcntl.flock``) that this process holds until ``release_run_dir`` or until it exits. A
  folder another process holds is refused, naming that process; the holder may claim it again
  (a rerun with ``--overwrite`` in the same process).
- A folder holding anything batchlab did not write (``foreign_names``) is refused, with or
  without a manifest, even with ``overwrite``: nothing but batchlab's own files is ever
  deleted. A scenario sweep's or capacity search's folder (or one setting's search in it) is
  refused as what it is (``results_folder``), even with ``overwrite``: it holds many runs.
- A folder holding another run (a different kind, trace digest, engine or target; read from its
  ``manifest.json``) is refused unless ``overwrite``; then it is emptied first. The same run
  again (same identity) replaces the old one: its files are removed first, so nothing of the
  old run (engine, knobs, telemetry, records.jsonl) survives into the new one.
- A scenario cell's or capacity probe's markers (``cell.json``, ``status.json``,
  ``error.txt``, ``probe.json``) belong to the sweep that prepared the folder and are kept.
- A sweep or search that runs a cell or probe again removes its whole folder first
  (``remove_run_dir``) under the same two rules: only a folder whose every file is
  batchlab's, and that no other process holds.
- A sweep's or search's own folder (``<out>/<scenario>``, a capacity ``--out``: cell and
  setting folders, ``scenario.json``, ``capacity.json``, ``report.md``, figures) is held
  with the same lock while it runs (``hold_dir``, ``holding_dir``), without a manifest and
  without looking at its files: a second sweep or search into it is refused at once.
- Each folder a sweep or search will write (its own, each cell, setting or probe folder) is
  none of batchlab's or one of its own kind (``results_folder``, ``refuse_results_folder``):
  another run's folder, a scenario's or a capacity search's is refused, named as what it is,
  before anything is written or deleted. Nothing is written inside a run's folder: a sweep,
  a search, ``report -o`` and ``compare --json`` look above the path (``folder_above``).
- ``batchlab report`` and ``batchlab summarize`` hold a folder they rewrite files in the same
  way, and refuse a folder another process holds (``writer_of``): its files are from two
  moments then.

The claim writes a first ``manifest.json`` with the run's ``run_id`` (uuid4 hex) and identity;
``summary.json``, the parquet files (schema metadata ``batchlab.run_id``) and ``records.jsonl``
(its header line) carry the same id.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import re
import shutil
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from harness.manifest import MANIFEST_FILE, read_manifest
from harness.redact import redact_url
from harness.results import (
    CHUNKS_FILE,
    PROBE_FILE,
    RECORDS_FILE,
    REPORT_FILE,
    REPORT_PLOTS,
    REQUESTS_FILE,
    SEARCH_FILE,
    STEPS_FILE,
    SUMMARY_FILE,
    read_json_object,
    write_json_atomic,
)

# Sweep markers a folder holds before its run starts (harness.scenario.status) and a capacity
# probe's outcome (harness.capacity.probe): the sweep's, kept by a claim.
MARKERS = frozenset({"cell.json", "status.json", "error.txt", PROBE_FILE})
# Every other name a run writes in its folder. Exact names: a user's own ``data.parquet`` or
# ``notes.log`` is not batchlab's, and is never deleted.
RUN_FILES = frozenset({
    MANIFEST_FILE, SUMMARY_FILE, REQUESTS_FILE, CHUNKS_FILE, STEPS_FILE, RECORDS_FILE,
    "telemetry.parquet",  # a live run's scrapes (harness.live.telemetry)
    REPORT_FILE, *REPORT_PLOTS,  # and its plots (harness.report.render)
    "trtllm-serve.yaml",  # a launched engine's generated config (LaunchPlan.config_files)
})
# A launched engine's logs: adapters.process.ServerProcess named "<engine>-server".
_ENGINE_LOG = re.compile(r"[A-Za-z0-9_.-]+-server\.std(?:out|err)\.log")
# A file in the making: "<name>.tmp" (atomic writes), "<log>.scrub.tmp" (harness.redact).
_TEMPORARY = (".scrub.tmp", ".tmp")
WORKERS_DIR = "workers"  # replay --workers: workers/w<i>/, each worker's own run folder
_WORKER = re.compile(r"w[0-9]+")
# The lock (module doc). A temporary: it exists while a process holds it, and a sweep's file
# digests leave temporaries out (harness.scenario.status.file_digests).
LOCK_FILE = ".batchlab.lock.tmp"
_WRITE_TEST = ".batchlab-write-test-"  # ensure_writable_dir's probe, gone as soon as written


class RunDirError(ValueError):
    """The output folder cannot be used for this run; the message names it."""


class FolderHeldError(RunDirError):
    """Another process holds the folder's lock; ``holder`` names it ("another batchlab process
    (pid N)"), for a caller that words the refusal its own way."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


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

    def __post_init__(self) -> None:
        # stored and shown without its credentials, so compared without them too: the
        # manifest keeps http://***@host (harness.redact), and a run again is the same run
        if self.target:
            object.__setattr__(self, "target", redact_url(self.target))

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


def _run_file_name(name: str) -> bool:
    """A name a run writes as a plain file (markers, lock and write probe aside)."""
    for suffix in _TEMPORARY:
        if name.endswith(suffix) and _run_file_name(name.removesuffix(suffix)):
            return True
    return name in RUN_FILES or _ENGINE_LOG.fullmatch(name) is not None


def _transient(name: str) -> bool:
    """The lock or a write probe: another process's for the moment, never an earlier run's."""
    return name == LOCK_FILE or name.startswith(_WRITE_TEST)


def foreign_names(folder: Path) -> list[str]:
    """What in ``folder`` batchlab did not write, as ``name``, ``name/`` (a folder) or
    ``workers/w0/name``; empty when everything there is batchlab's. Links are never batchlab's:
    it writes none."""
    return _foreign(folder, "", workers=True)


def _foreign(folder: Path, prefix: str, *, workers: bool) -> list[str]:
    out: list[str] = []
    for path in sorted(folder.iterdir()):
        shown = prefix + path.name
        if path.is_symlink():
            out.append(shown)
        elif path.is_dir():
            if workers and path.name == WORKERS_DIR:
                out += _foreign_workers(path, shown + "/")
            else:
                out.append(shown + "/")
        elif not (path.is_file() and (_marker_name(path.name) or _transient(path.name)
                                      or _run_file_name(path.name))):
            out.append(shown)
    return out


def _marker_name(name: str) -> bool:
    """A sweep's marker, or one in the making (``write_json_atomic``'s ``<name>.tmp``, left
    by a process killed while it wrote it)."""
    return name in MARKERS or name.removesuffix(".tmp") in MARKERS


def _foreign_workers(folder: Path, prefix: str) -> list[str]:
    out: list[str] = []
    for path in sorted(folder.iterdir()):
        if _WORKER.fullmatch(path.name) and path.is_dir() and not path.is_symlink():
            out += _foreign(path, f"{prefix}{path.name}/", workers=False)
        else:
            out.append(prefix + path.name + ("/" if path.is_dir() else ""))
    return out


def _unwritable(folder: Path) -> str | None:
    """Why ``folder`` cannot be created or written, or None (it exists now)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f"{_WRITE_TEST}{os.getpid()}"
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


# ---------------------------------------------------------------- what a folder is for
#
# The files that say what batchlab made a folder for. harness.scenario and harness.capacity
# name them too; imported from there, they would load those packages with this module.
_CELL_FILE = "cell.json"  # a scenario cell or capacity probe (harness.scenario.status)
_SCENARIO_FILE = "scenario.json"  # a sweep's record; a capacity search writes one too
_CAPACITY_FILE = "capacity.json"  # a capacity search's answers (harness.capacity.run)
_RUN_OF_KIND = {"simulated": "a simulate run", "live": "a replay run"}

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ResultsFolder:
    """What batchlab made a folder for, as the file that says so (``marker``) tells."""

    kind: str  # "cell" | "run" | "capacity" | "search" | "scenario"
    marker: str  # the file: cell.json, manifest.json, summary.json, capacity.json, ...
    what: str  # as a refusal words it: "the run folder of a simulate run"

    def describe(self) -> str:
        return f"{self.what} ({self.marker})"


def run_marker(folder: Path) -> str | None:
    """The file that makes ``folder`` a run's (its ``manifest.json`` or ``summary.json``)."""
    return next((name for name in (MANIFEST_FILE, SUMMARY_FILE) if (folder / name).is_file()),
                None)


def results_folder(folder: Path) -> ResultsFolder | None:
    """What batchlab made ``folder`` for: a cell of a sweep or search (its ``cell.json``, the
    cell's run too), a run's folder (``manifest.json``, ``summary.json``), a capacity search's
    (``capacity.json``, or a ``scenario.json`` naming one), one setting's search in it
    (``search.json``) or a scenario sweep's (``scenario.json``); None for any other folder,
    or none there."""
    if not folder.is_dir():
        return None
    if (folder / _CELL_FILE).is_file():
        return ResultsFolder("cell", _CELL_FILE, "a cell of a scenario sweep or capacity search")
    marker = run_marker(folder)
    if marker is not None:
        kind = read_manifest(folder).get("kind")
        return ResultsFolder("run", marker, "the folder of a run" if not isinstance(kind, str)
                             else f"the run folder of {_RUN_OF_KIND.get(kind, f'a {kind} run')}")
    sweep = read_json_object(folder / _SCENARIO_FILE)
    if (folder / _CAPACITY_FILE).is_file() or "capacity" in sweep:
        marker = _CAPACITY_FILE if (folder / _CAPACITY_FILE).is_file() else _SCENARIO_FILE
        return ResultsFolder("capacity", marker, "the folder of a capacity search")
    if (folder / SEARCH_FILE).is_file():
        return ResultsFolder("search", SEARCH_FILE,
                             "the folder of one setting of a capacity search")
    if (folder / _SCENARIO_FILE).is_file():
        name = sweep.get("name")
        return ResultsFolder("scenario", _SCENARIO_FILE, f"the folder of scenario {name}"
                             if isinstance(name, str) else "the folder of a scenario sweep")
    return None


def folder_above(path: Path, of: Callable[[Path], _T | None]) -> tuple[Path, _T] | None:
    """The nearest folder that ``path`` (a file or folder to write) lands in or under, for
    which ``of`` (``run_marker``, ``results_folder``) says something, resolved, with what it
    said; None when none does. ``report -o`` and ``compare --json`` keep out of a run's
    folder by it, a sweep or search out of any batchlab folder."""
    parent = path.resolve().parent
    for folder in (parent, *parent.parents):
        said = of(folder)
        if said is not None:
            return folder, said
    return None


def _run_or_cell(folder: Path) -> ResultsFolder | None:
    found = results_folder(folder)
    return found if found is not None and found.kind in ("run", "cell") else None


def refuse_results_folder(folder: Path | str, what: str = "--out", *,
                          allow: Collection[str] = (),
                          instead: str = "choose another --out") -> None:
    """RunDirError naming ``folder`` and what batchlab made it for (``results_folder``) unless
    that is a kind in ``allow``, or when it lies inside a run's or a cell's folder: a sweep or
    search writing there would replace that run's report and figures, and leave folders in
    it that a later run into it refuses. Looks only: a sweep or search checks the folders it
    will write with it before it writes or deletes anything."""
    out = Path(folder)
    found = results_folder(out)
    if found is not None and found.kind not in allow:
        raise RunDirError(f"{what} {out}: is {found.describe()}: {instead}")
    above = folder_above(out, _run_or_cell)
    if above is not None:
        inside, found = above
        raise RunDirError(f"{what} {out}: is inside {shown(inside)}, {found.describe()}: "
                          f"{instead}")


def shown(folder: Path) -> str:
    """A resolved folder as the user likely wrote it: relative to the working folder when
    inside it."""
    try:
        return str(folder.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(folder)


def claim_run_dir(out_dir: Path | str, identity: RunIdentity, *, overwrite: bool = False,
                  what: str = "--out") -> str:
    """Make ``out_dir`` this run's folder (module doc); returns the new run id.

    The folder's lock is held from here on (``release_run_dir``); a claim that is refused lets
    go of a lock it took."""
    out = Path(out_dir)
    ensure_writable_dir(out, what)
    _refuse_sweep_folder(out, what)
    took = _lock(out, what)
    try:
        _refuse_foreign(out, what, "choose an empty or new folder")
        earlier = [p for p in out.iterdir() if not _marker_name(p.name)
                   and not _transient(p.name)]
        if earlier:
            manifest = read_manifest(out) if (out / MANIFEST_FILE).exists() else {}
            previous = RunIdentity.from_manifest(manifest) if manifest else None
            if previous is None and not overwrite:
                raise RunDirError(f"{what} {out}: holds files of an earlier run without a "
                                  "manifest; pass --overwrite to replace them, or choose "
                                  "another folder")
            if previous is not None and previous != identity and not overwrite:
                raise RunDirError(
                    f"{what} {out}: holds another run ({previous.describe()}; this is "
                    f"{identity.describe()}); pass --overwrite to replace it, or choose "
                    "another folder")
            _clear(out)
        run_id = new_run_id()
        write_json_atomic({"run_id": run_id, "identity": identity.as_dict(),
                           "kind": identity.kind, "status": "starting"}, out / MANIFEST_FILE)
    except BaseException:
        if took:
            release_run_dir(out)
        raise
    return run_id


def _refuse_sweep_folder(out: Path, what: str) -> None:
    """RunDirError naming what ``out`` is when batchlab made it for many runs (a scenario
    sweep's, a capacity search's, one setting's search in it: ``results_folder``), not for
    one: its cells and probes are that sweep's, and ``--overwrite`` replaces a run, not them."""
    found = results_folder(out)
    if found is not None and found.kind not in ("run", "cell"):
        raise RunDirError(f"{what} {out}: is {found.describe()}, not one run's: choose "
                          "another folder")


def _refuse_foreign(out: Path, what: str, instead: str) -> None:
    """RunDirError naming what in ``out`` batchlab did not write, if anything."""
    foreign = foreign_names(out)
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise RunDirError(f"{what} {out}: holds files batchlab did not write ({shown}); "
                          f"move them, or {instead}")


def _existing_folder(out: Path, what: str) -> bool:
    """Whether ``out`` is there (a folder); RunDirError when it is a link or a file, which no
    sweep made."""
    if out.is_symlink():
        raise RunDirError(f"{what} {out}: is a link, not a folder batchlab made; remove it or "
                          "choose another --out")
    if not out.exists():
        return False
    if not out.is_dir():
        raise RunDirError(f"{what} {out}: is a file, not a folder; remove it or choose another "
                          "--out")
    return True


def check_removable(folder: Path | str, what: str = "folder") -> None:
    """RunDirError, naming ``folder`` and what is in the way, unless ``remove_run_dir`` may
    remove it now: a sweep checks every folder it will redo before it writes anything."""
    out = Path(folder)
    if not _existing_folder(out, what):
        return
    took = _lock(out, what, "choose another --out")
    try:
        _refuse_foreign(out, what, "choose another --out")
    finally:
        if took:
            release_run_dir(out)


def check_each(folders: Iterable[Path], check: Callable[[Path], None], *,
               shown: int = 5) -> None:
    """``check`` every folder (``check_removable``, a sweep's cell check) before refusing: one
    RunDirError naming every folder in the way (the first ``shown``, then how many more), so
    that one refusal is not followed by another after the first is cleared."""
    said = []
    for folder in folders:
        try:
            check(folder)
        except RunDirError as exc:
            said.append(str(exc))
    if len(said) == 1:
        raise RunDirError(said[0])
    if said:
        more = f"; and {len(said) - shown} more" if len(said) > shown else ""
        raise RunDirError(f"{len(said)} folders are in the way: " + "; ".join(said[:shown])
                          + more)


def remove_run_dir(folder: Path | str, what: str = "folder") -> None:
    """Delete ``folder`` (a cell's or probe's run folder a sweep or search made, run again)
    with everything in it, only when every file there is batchlab's (``foreign_names``) and
    no other process holds it (its lock, taken here for the removal); otherwise RunDirError
    naming the folder and the names or the holder's pid, and nothing is deleted. A folder
    that is not there is left so."""
    out = Path(folder)
    if not _existing_folder(out, what):
        return
    took = _lock(out, what, "choose another --out")
    removed = False
    try:
        _refuse_foreign(out, what, "choose another --out")
        shutil.rmtree(out)  # the lock file with it, still held: see the note above ``_Held``
        removed = True
    finally:
        if took or removed:  # a hold of this process's own went with the folder
            release_run_dir(out)


def _clear(out: Path) -> None:
    """Remove the earlier run's files: batchlab's own (checked again, one by one), but the
    sweep's markers, the lock and write probes."""
    for path in out.iterdir():
        if _marker_name(path.name) or _transient(path.name) or path.is_symlink():
            continue
        if path.is_dir():
            if path.name == WORKERS_DIR and not _foreign_workers(path, ""):
                shutil.rmtree(path)
        elif _run_file_name(path.name):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


# ---------------------------------------------------------------- the lock
#
# flock locks an open file, not a name. The holder removes the lock file while it still holds
# the lock, so a process that opened the file meanwhile and then gets the lock finds that its
# file is no longer the one at the path (``_same_file``) and tries again with the new one.


@dataclass(frozen=True, slots=True)
class _Held:
    file: IO[str]  # open and flock-ed while this process holds the folder
    path: Path  # the lock file, resolved


_HELD: dict[Path, _Held] = {}  # resolved folder -> its lock, for this process


def _same_file(file: IO[str], path: Path) -> bool:
    """Whether ``path`` is still the file ``file`` has open."""
    try:
        on_disk = os.stat(path)
    except OSError:
        return False
    held = os.fstat(file.fileno())
    return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)


def _lock(out: Path, what: str, instead: str | None = None) -> bool:
    """Hold ``out``'s lock for this process: True when this call took it, False when this
    process held it already (or the file system has no locks). FolderHeldError naming the
    holder when another process holds it (``instead``: what to do other than wait; another
    ``what``)."""
    folder = out.resolve()
    path = folder / LOCK_FILE
    held = _HELD.get(folder)
    if held is not None:
        if _same_file(held.file, path):
            return False
        del _HELD[folder]  # the folder was emptied or made anew since (a sweep's cell)
        held.file.close()
    while True:
        try:
            file = path.open("a+", encoding="ascii")  # never truncates a holder's pid
        except OSError as exc:
            raise RunDirError(f"{what} {out}: cannot write there ({exc.strerror or exc})"
                              ) from None
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            by = _holder(file)
            file.close()
            raise FolderHeldError(f"{what} {out}: is being written by {by}; wait for it or "
                                  f"{instead or f'choose another {what}'}", by) from None
        except OSError:  # no locks on this file system (some network mounts): go unlocked
            file.close()
            with contextlib.suppress(OSError):
                path.unlink()
            return False
        if _same_file(file, path):
            break
        file.close()  # its holder removed it while letting go: lock the new one
    file.seek(0)
    file.truncate()
    file.write(f"{os.getpid()}\n")
    file.flush()
    _HELD[folder] = _Held(file, path)
    return True


def _holder(file: IO[str]) -> str:
    """The process holding the lock ``file`` is open on, as a refusal names it: "another
    batchlab process (pid N)", from the pid its holder wrote there."""
    file.seek(0)
    pid = file.read().strip()
    return f"another batchlab process (pid {pid})" if pid.isdigit() else \
        "another batchlab process"


def writer_of(folder: Path | str) -> str | None:
    """Who is writing ``folder`` now: "another batchlab process (pid N)" when another process
    holds its lock (a run, sweep or search into it), None when none does. Only looks: makes
    no lock file, takes nothing; a reader of the folder asks before it reads."""
    path = Path(folder).resolve() / LOCK_FILE
    held = _HELD.get(path.parent)
    if held is not None and _same_file(held.file, path):
        return None  # this process's own
    try:
        file = path.open("r", encoding="ascii")
    except OSError:  # no lock file: nobody holds it
        return None
    with file:
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder(file)
        except OSError:  # no locks on this file system
            return None
        fcntl.flock(file.fileno(), fcntl.LOCK_UN)
    return None


def hold_dir(folder: Path | str, what: str = "--out", instead: str | None = None) -> bool:
    """Hold ``folder``'s lock for this process, as a claim does, but without a manifest and
    without looking at what is there: a sweep's or a capacity search's own folder, which
    holds its cell or setting folders, ``scenario.json``, ``capacity.json``, ``report.md`` and
    figures. Creates the folder. True when this call took the lock (``release_run_dir`` lets
    go), False when this process held it already; FolderHeldError naming the other process
    that holds it ("is being written by another batchlab process (pid N)"; ``instead``: what to
    do other than wait, as in ``claim_run_dir``)."""
    out = Path(folder)
    ensure_writable_dir(out, what)
    return _lock(out, what, instead)


@contextlib.contextmanager
def holding_dir(folder: Path | str, what: str = "--out", instead: str | None = None
                ) -> Iterator[None]:
    """``hold_dir`` for the duration of a ``with`` block; a hold this process had already is
    kept after it."""
    took = hold_dir(folder, what, instead)
    try:
        yield
    finally:
        if took:
            release_run_dir(folder)


def release_run_dir(out_dir: Path | str) -> None:
    """Let go of ``out_dir``'s lock if this process holds it (its run has ended); the lock
    file goes with it. Exiting does the same for every folder still held."""
    held = _HELD.pop(Path(out_dir).resolve(), None)
    if held is not None:
        _let_go(held)


def _let_go(held: _Held) -> None:
    if _same_file(held.file, held.path):  # not when the folder went (or was made anew)
        with contextlib.suppress(OSError):
            held.path.unlink()  # still locked: see the note above ``_Held``
    held.file.close()


def _release_all() -> None:
    while _HELD:
        _let_go(_HELD.popitem()[1])


def _forget_after_fork() -> None:
    """A forked child shares its parent's locks but is another process: it holds nothing,
    and must not remove the parent's lock files."""
    _HELD.clear()


atexit.register(_release_all)
os.register_at_fork(after_in_child=_forget_after_fork)
