"""``records.jsonl``: one line per finished request, appended as it finishes, so nothing is lost.

A live run writes each ``RequestTimeline`` here the moment the request ends (success or error),
flushed at once and fsynced at least every ``fsync_interval_s``. After a crash or Ctrl-C the
rows already written survive, and ``read_records`` turns them back into timelines (a line cut in
half by a crash is skipped). The chunk instants travel in the same row.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from dataclasses import fields
from pathlib import Path
from typing import Any, TextIO

from harness.timeline import RequestTimeline

RECORDS_FILE = "records.jsonl"

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

    def __init__(self, path: Path, *, fsync_interval_s: float = 1.0) -> None:
        self.path = path
        self._fsync_interval_s = fsync_interval_s
        self._file: TextIO | None = path.open("a", encoding="utf-8")
        self._dirty = False
        self.num_written = 0

    def write(self, tl: RequestTimeline) -> None:
        if self._file is None:
            raise ValueError(f"{self.path}: writer is closed")
        self._file.write(json.dumps(timeline_to_record(tl), allow_nan=False,
                                    default=_json_default) + "\n")
        self._file.flush()
        self._dirty = True
        self.num_written += 1

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
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None


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
        try:
            tl = record_to_timeline(row)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{lineno}: not a request record: {exc}") from None
        by_id[tl.request_id] = tl
    return list(by_id.values())
