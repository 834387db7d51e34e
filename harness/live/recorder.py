"""``records.jsonl``: a line when each request is sent and one when it ends, so nothing is lost.

A live run writes each ``RequestTimeline`` here the moment the request ends (success or error),
flushed at once and fsynced at least every ``fsync_interval_s``. After a crash or Ctrl-C the
rows already written survive, and ``read_records`` turns them back into timelines (a line cut in
half by a crash is skipped). The chunk instants travel in the same row.

Before that, as each request goes out, a *sent record*: the request's row as it stands then
(``not_finished``, no chunks), marked ``"batchlab_sent": 1``. Its final row, written later,
replaces it (the last row per request wins); one that never comes (the replay killed outright:
SIGKILL, the OOM killer) leaves the sent record, so every request sent is a row, as
``not_finished`` (``load_records``). A reader that knows nothing of sent records takes them
for the ``not_finished`` rows they are.

The first line is a header naming the run that wrote the file (``{"batchlab_records": 2,
"run_id": ...}``), so a folder's ``records.jsonl`` is never mistaken for another run's; from
version 2 on, the file holds a sent record for every request sent (``sends_recorded``).
A write that fails (a full disk) raises ``OSError`` once; the writer then stops writing,
and the rows before it stay on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, BinaryIO

from harness.results import RECORDS_FILE as RECORDS_FILE  # the file this module writes
from harness.timeline import RequestTimeline
from harness.traces import TraceRequest

HEADER_KEY = "batchlab_records"
# The header's version: 2 when the file holds a sent record for every request sent.
RECORDS_VERSION = 2
SENT_KEY = "batchlab_sent"  # marks a sent record (module doc)
# What a sent record that no final row replaced says happened to its request.
SENT_UNRECORDED_MESSAGE = ("sent, then the run was killed before this request finished: no end "
                           "of it was recorded")

_FIELDS = tuple(f.name for f in fields(RequestTimeline) if f.name != "extra")


def timeline_to_record(tl: RequestTimeline) -> dict[str, Any]:
    """A JSON-ready dict: every ``RequestTimeline`` field, ``extra`` keys alongside."""
    row: dict[str, Any] = {name: getattr(tl, name) for name in _FIELDS}
    row["chunk_times_s"] = list(tl.chunk_times_s)
    row["chunk_num_tokens"] = list(tl.chunk_num_tokens)
    for key, value in tl.extra.items():
        row.setdefault(key, value)
    return row


class SentRecord:
    """A request's sent record, its text made before the request's instant (``head``,
    ``tail``): at the send only the instants are formatted in (``line``)."""

    __slots__ = ("head", "tail")

    def __init__(self, req: TraceRequest) -> None:
        self.head = f'{{"request_id": {json.dumps(req.request_id)}, '
        priority = "null" if req.priority is None else str(int(req.priority))
        self.tail = (f'"num_prompt_tokens": {int(req.num_prompt_tokens)}, '
                     f'"num_target_output_tokens": {int(req.num_output_tokens)}, '
                     f'"priority": {priority}, "error_kind": "not_finished", '
                     f'"error_message": {json.dumps(SENT_UNRECORDED_MESSAGE)}, '
                     f'"token_count_source": "chunks", "{SENT_KEY}": 1}}\n')

    def line(self, arrival_s: float, scheduled_s: float | None, sent_s: float) -> str:
        scheduled = "null" if scheduled_s is None else repr(float(scheduled_s))
        return (f'{self.head}"arrival_s": {float(arrival_s)!r}, "scheduled_s": {scheduled}, '
                f'"sent_s": {float(sent_s)!r}, {self.tail}')


# What a row's fields must be for the row to be read, so that a malformed one is refused by
# its line and not met deep in the metrics: rows are kept by request id, a string; instants and
# counts are numbers (None only where the field allows it); the rest strings or None.
_REQUIRED = ("request_id", "arrival_s", "num_prompt_tokens", "num_target_output_tokens")
_NUMBERS = ("arrival_s", "num_prompt_tokens", "num_target_output_tokens", "num_preemptions",
            "num_retries")
_NUMBERS_OR_NONE = ("priority", "sent_s", "scheduled_s", "finished_s", "num_output_tokens")
_STRINGS = ("request_id",)
_STRINGS_OR_NONE = ("error_kind", "error_message", "finish_reason", "token_count_source")


def record_to_timeline(row: Any) -> RequestTimeline:
    """The timeline of one row; ValueError saying what is wrong with a row that is not a
    request record (not an object, a field missing or of another type)."""
    _check_row(row)
    known = {k: row[k] for k in _FIELDS if k in row}
    known["chunk_times_s"] = tuple(float(t) for t in row.get("chunk_times_s", ()))
    known["chunk_num_tokens"] = tuple(int(n) for n in row.get("chunk_num_tokens", ()))
    extra = {k: v for k, v in row.items() if k not in _FIELDS}
    return RequestTimeline(**known, extra=extra)


def _check_row(row: Any) -> None:
    if not isinstance(row, dict):
        raise ValueError(f"a JSON {_json_type(row)}, not an object")
    missing = [name for name in _REQUIRED if name not in row]
    if missing:
        raise ValueError(f"no {', '.join(missing)}")
    for names, kind, none in ((_NUMBERS, "a number", False), (_NUMBERS_OR_NONE, "a number", True),
                              (_STRINGS, "a string", False), (_STRINGS_OR_NONE, "a string", True)):
        for name in names:
            value = row.get(name)
            if name not in row or (none and value is None):
                continue
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (number if kind == "a number" else isinstance(value, str)):
                raise ValueError(f"{name} is {json.dumps(value)[:40]}, not {kind}")


def _json_type(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words."""
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "true/false"
    if value is None:
        return "null"
    return "number"


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
            self._put(json.dumps({HEADER_KEY: RECORDS_VERSION, "run_id": run_id}) + "\n")

    def write_sent(self, line: str) -> None:
        """Append a sent record (``SentRecord.line``); on the send path: one ``write``, no
        JSON encoding. Raises as ``write`` does."""
        if self._file is None or self.error is not None:
            raise ValueError(f"{self.path}: writer is closed")
        self._put(line)

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


@dataclass(frozen=True, slots=True)
class Records:
    """What a ``records.jsonl`` holds: ``rows``, each request's last row, in file order;
    ``unrecorded``, a ``not_finished`` row for each request sent that has no row after its
    sent record (the run killed outright); ``sends_recorded``, whether the file holds a sent
    record for every request sent (version 2 on: every request sent is then in ``rows`` or
    ``unrecorded``)."""

    rows: list[RequestTimeline]
    unrecorded: list[RequestTimeline]
    sends_recorded: bool

    @property
    def timelines(self) -> list[RequestTimeline]:
        """Every request sent, as a row (``rows``, then ``unrecorded``)."""
        return [*self.rows, *self.unrecorded]


def read_records(path: Path) -> list[RequestTimeline]:
    """Timelines from a ``records.jsonl``, last row per request id winning, in file order;
    sent records aside (``load_records`` has them too).

    A line that is not valid JSON can only be the last one, cut by a crash; it is skipped.
    Anything else malformed is an error naming the line.
    """
    return load_records(path).rows


def load_records(path: Path, *, unrecorded_message: str = SENT_UNRECORDED_MESSAGE) -> Records:
    """``read_records``'s rows, and a ``not_finished`` row (saying ``unrecorded_message``) for
    each request whose sent record no row followed (``Records``)."""
    by_id: dict[str, RequestTimeline] = {}
    sent: dict[str, RequestTimeline] = {}
    version = 0
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
            if lineno == 1 and isinstance(row[HEADER_KEY], int):
                version = row[HEADER_KEY]
            continue
        is_sent = isinstance(row, dict) and row.pop(SENT_KEY, None) is not None
        try:
            tl = record_to_timeline(row)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{lineno}: not a request record ({exc})") from None
        if is_sent:
            sent.setdefault(tl.request_id, tl)
        else:
            by_id[tl.request_id] = tl
    unrecorded = [tl if tl.error_message == unrecorded_message
                  else replace(tl, error_message=unrecorded_message)
                  for rid, tl in sent.items() if rid not in by_id]
    return Records(list(by_id.values()), unrecorded, version >= RECORDS_VERSION)


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
