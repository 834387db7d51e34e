"""``manifest.json``: what a run was — engine, knobs and their mapping, trace, host, command.

One shape for simulated and live runs, so reports read both the same way:

    {"kind": "simulated" | "live",
     "run_id": "<uuid4 hex>", "identity": {...},   # harness.runfolder: whose folder this is
     "engine": {"name", "mode", "version", ...},   # mode: simulated | launch | attach
     "knobs": {...}, "mapping": [...], "trace": {...}, "model", "gpu",
     "host", "host_info", "batchlab_version", "command", "created_at", "status"}

Every write goes through ``harness.redact.redact_tree``: environment values off the allow-list
and values of secret-named flags in ``command``/``argv`` are stored as ``***``.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import harness
from harness.redact import redact_tree
from harness.results import SUMMARY_FILE, write_json_atomic
from harness.traces import DIGEST_SCHEME, MixPart, Trace, describe

MANIFEST_FILE = "manifest.json"


def batchlab_version() -> str:
    """The version of this source tree (``harness.__version__``, the package's own: no
    installed-package lookup, tens of milliseconds of every command's start)."""
    return harness.__version__


def trace_manifest(trace: Trace) -> dict[str, Any]:
    """The trace as a manifest keeps it: with ``path``, ``format``, ``options`` and
    ``file_sha256``, what ``load_trace`` needs to give the same requests again. A mix has no
    one file: its ``path`` and ``file_sha256`` are None, its ``options`` empty, and ``parts``
    names each of its traces that way, in mix order (``_part_record``)."""
    record: dict[str, Any] = {
        "source": trace.source,
        "path": None if trace.parts else _absolute(trace.source),
        "file_sha256": trace.file_sha256,
        "format": trace.format,
        "options": _options_record(trace.options),
        "digest": trace.digest,
        "digest_scheme": DIGEST_SCHEME,  # how the digest was made (harness.traces.records)
        "num_requests": len(trace.requests),
        "notes": list(trace.notes),
        "counts": dict(trace.counts),
        "timing": trace.timing,
        "stats": describe(trace),
    }
    if trace.parts:
        record["parts"] = [_part_record(part) for part in trace.parts]
    return record


def _part_record(part: MixPart) -> dict[str, Any]:
    """One trace of a mix: loaded from ``path`` with ``options`` (it gives ``digest``), then
    every request given ``priority`` (None: left as loaded)."""
    trace = part.trace
    return {
        "source": trace.source,
        "path": _absolute(trace.source),
        "file_sha256": trace.file_sha256,
        "format": trace.format,
        "options": _options_record(trace.options),
        "digest": trace.digest,
        "num_requests": len(trace.requests),
        "timing": trace.timing,
        "priority": part.priority,
    }


def _options_record(options: Mapping[str, Any]) -> dict[str, Any]:
    """A trace's options with ``lengths_from`` as the file's absolute path, as ``path`` is the
    source's: as typed, it is relative to a working directory no record keeps (the note of
    the sampled lengths keeps it as typed)."""
    record = dict(options)
    if record.get("lengths_from") is not None:
        record["lengths_from"] = str(Path(record["lengths_from"]).resolve())
    return record


def _absolute(source: str) -> str | None:
    """A trace file's absolute path (None for a synthetic trace): the source as typed is
    relative to a working directory no record keeps."""
    if source.startswith("synthetic"):
        return None
    return str(Path(source).resolve())


def run_fields(kind: str, command: Sequence[str] | None) -> dict[str, Any]:
    """The fields every manifest has, whatever ran."""
    return {
        "kind": kind,
        "host": platform.node(),
        "host_info": {
            "platform": platform.platform(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
        },
        "batchlab_version": batchlab_version(),
        "command": list(command) if command is not None else None,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def jsonable(value: Any) -> Any:
    """Tuples and paths as JSON lists and strings, recursively (knobs, mappings, grids)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def read_manifest(run_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((run_dir / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def update_manifest(run_dir: Path, fields: Mapping[str, Any]) -> None:
    """Merge ``fields`` into the run's manifest (several writers add their own keys)."""
    write_manifest(run_dir, {**read_manifest(run_dir), **fields})


def write_manifest(run_dir: Path, manifest: Mapping[str, Any]) -> None:
    """Write the whole manifest, secrets redacted."""
    write_json_atomic(redact_tree(manifest), run_dir / MANIFEST_FILE)


def record_failed(out_dir: Path, summary: Mapping[str, Any], why: str) -> dict[str, Any]:
    """The run in ``out_dir`` failed (``why``): its summary and manifest say so, as for a
    launched engine that exited mid-run (``harness.live.run``), so that no report, comparison
    or CI job reads it as a measurement of load; the summary, as written."""
    failed = {**summary, "status": "failed"}
    with contextlib.suppress(OSError):  # a full disk must not hide what happened
        write_json_atomic(failed, out_dir / SUMMARY_FILE)
        update_manifest(out_dir, {"status": "failed", "error": why})
    return failed
