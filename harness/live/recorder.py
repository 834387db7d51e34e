"""``records.jsonl``: one line per finished request, appended as it finishes, so nothing is lost.

A live run writes each ``RequestTimeline`` here the moment the request ends (success or error),
flushed at once and fsynced at least every ``fsync_interval_s``. After a crash or Ctrl-C the
rows already written survive, and ``read_records`` turns them back into timelines (a line cut in
half by a crash is skipped). The chunk instants travel in the same row.

The first line is a header naming the run that wrote the file (``{"batchlab_records": 1,
"run_id": ...}``), so a folder's ``records.jsonl`` is never mistaken for another run's.
A write that fails (a full disk) raises ``OSError`` once; the writer then stops writing,
and the rows before it stay on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
from dataclasses import fields
from pathlib import Path
from typing import Any, BinaryIO

from harness.results import RECORDS_FILE as RECORDS_FILE  # the file this module writes
from harness.timeline import RequestTimeline

HEADER_KEY = "batchlab_records"

_FIELDS = tuple(f.name for f in fields(RequestTimeline) if f.name != "extra")


def timeline_to_record(tl: RequestTimeline) -> dict[str, Any]:
    """A JSON-ready dict: every ``RequestTimeline`` field, ``extra`` keys alongside."""
    row: dict[str, Any] = {name: getattr(tl, name) for name in _FIELDS}
    row["chunk_times_s"] = list(tl.chunk_times_s)
    row["chunk_num_tokens"] = list(tl.chunk_num_tokens)
    for key, value in tl.extra.items():
        row.setdefault(key, value)
    return row


def record_to_timeline(row: dict[str, Any]) -> RequestTimeline:
    known = {k: row[k] for k in _FIELDS if k in row}
    known["chunk_times_s"] = tuple(float(t) for t in row.get("chunk_times_s", ()))
    known["chunk_num_tokens"] = tuple(int(n) for n in row.get("chunk_num_tokens", ()))
    extra = {k: v for k, v in row.items() if k not in _FIELDS}
    return RequestTimeline(**known, extra=extra)


class RecordWriter:
    """Appends rows to ``records.jsonl``. Every row is flushed to the OS at once (a crash of the
    process loses nothing written); ``sync_loop`` fsyncs at most ``fsync_interval_s`` after a
    write (a crash of the machine loses at most that), in a thread so that the event loop that
    times requests never waits on the disk."""

    def __init__(self, path: Path, *, fsync_interval_s: float = 1.0,
                 run_id: str | None = None) -> None:
        self.path = path
        self._fsync_interval_s = fsync_interval_s
        # Unbuffered: each row goes to the OS whole, and a refused write leaves no buffer
        # behind to be retried (and fail again) on close.
        self._file: BinaryIO | None = path.open("ab", buffering=0)
        self._dirty = False
        self.num_written = 0
        self.error: OSError | None = None  # the first failed write; nothing is written after
        if run_id is not None:
            self._put(json.dumps({HEADER_KEY: 1, "run_id": run_id}) + "\n")

    def write(self, tl: RequestTimeline) -> None:
        """Append one row. Raises OSError once when the disk refuses it, ValueError after."""
        if self._file is None or self.error is not None:
            raise ValueError(f"{self.path}: writer is closed")
        self._put(json.dumps(timeline_to_record(tl), allow_nan=False,
                             default=_json_default) + "\n")
        self.num_written += 1

    def _put(self, line: str) -> None:
        assert self._file is not None
        view = memoryview(line.encode("utf-8"))
        try:
            while view:
                num_written = self._file.write(view)
                if not num_written:
                    raise OSError(errno.ENOSPC, "the disk took no bytes", str(self.path))
                view = view[num_written:]
        except OSError as exc:
            self.error = exc
            self._discard()
            raise
        self._dirty = True

    async def sync_loop(self, stop: asyncio.Event) -> None:
        """fsync what was written, every ``fsync_interval_s``, until ``stop`` is set."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._fsync_interval_s):
                    await stop.wait()
            if self._dirty and self._file is not None:
                self._dirty = False
                await asyncio.to_thread(os.fsync, self._file.fileno())

    def close(self) -> None:
        """fsync and close (after a failed write too: what the disk accepted stays)."""
        if self._file is None:
            return
        try:
            os.fsync(self._file.fileno())
        except OSError as exc:
            self.error = self.error or exc
        finally:
            self._discard()

    def _discard(self) -> None:
        """fsync what the disk accepted, and close."""
        file, self._file = self._file, None
        if file is None:
            return
        with contextlib.suppress(OSError):
            os.fsync(file.fileno())
        with contextlib.suppress(OSError):
            file.close()


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def read_records(path: Path) -> list[RequestTimeline]:
    """Timelines from a ``records.jsonl``, last row per request id winning, in file order.

    A line that is not valid JSON can only be the last one, cut by a crash; it is skipped.
    Anything else malformed is an error naming the line.
    """
    by_id: dict[str, RequestTimeline] = {}
    with path.open(encoding="utf-8") as f:
        lines = f.readlines()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            if lineno == len(lines):
                break  # half-written by a crash
            raise ValueError(f"{path}:{lineno}: not a JSON object") from None
        if isinstance(row, dict) and HEADER_KEY in row:
            continue
        try:
            tl = record_to_timeline(row)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{lineno}: not a request record: {exc}") from None
        by_id[tl.request_id] = tl
    return list(by_id.values())


def records_run_id(path: Path) -> str | None:
    """The run id in a ``records.jsonl`` header; None for a file without one."""
    try:
        with path.open(encoding="utf-8") as f:
            first = f.readline()
        row = json.loads(first)
    except (OSError, ValueError):
        return None
    if isinstance(row, dict) and HEADER_KEY in row and isinstance(row.get("run_id"), str):
        return str(row["run_id"])
    return None
