"""Trace file formats: reading, detecting and parsing each into rows.

``azure`` (Azure LLM inference 2023 CSV), ``mooncake`` (JSONL, plain or .gz), ``lengths``
(length-only CSVs: ShareGPT / arXiv stats), ``vidur`` (Vidur's processed CSV) and ``burstgpt``
(BurstGPT CSV). The CSV formats differ only in which columns they read (``_CSV_SPECS``). Every
timed source is sorted by arrival (stably) and re-zeroed so that its earliest row arrives at 0 s.

A malformed row raises ``TraceError`` naming the file, the 1-based line and the field, unless
``skip_bad_rows`` is set; then it is kept in ``Parsed.skipped`` for the report. A count or a
time past the bounds of ``bounds`` is malformed like any other. A CSV quote left open is an
error even then (``_CsvReader``): the rows after it would be lost inside one field.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import itertools
import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.traces.bounds import check_timestamp_s, check_tokens
from harness.traces.records import MOONCAKE_BLOCK_TOKENS, Parsed, Row, TraceError, is_int


@dataclass(frozen=True, slots=True)
class _CsvSpec:
    """Which columns a CSV format reads. ``time_kind`` is "datetime", "seconds" or None."""

    name: str
    time_col: str | None
    time_kind: str | None
    prompt_col: str
    output_col: str
    drop_failed: bool = False  # BurstGPT: 0 response tokens marks a failed request


_CSV_SPECS = {
    "azure": _CsvSpec("azure", "TIMESTAMP", "datetime", "ContextTokens", "GeneratedTokens"),
    # lengths before vidur: on a tie (no arrived_at column) detection picks the first
    "lengths": _CsvSpec("lengths", None, None, "num_prefill_tokens", "num_decode_tokens"),
    "vidur": _CsvSpec("vidur", "arrived_at", "seconds", "num_prefill_tokens", "num_decode_tokens"),
    "burstgpt": _CsvSpec(
        "burstgpt", "Timestamp", "seconds", "Request tokens", "Response tokens", drop_failed=True
    ),
}
_PRIORITY_COL = "priority"
PRIORITY_LIMIT = 2**31 - 1  # a bound, so that a stray value fails here, naming its line


class _Fields:
    """Field parsers that raise TraceError naming file, line and field."""

    def __init__(self, path: str, *, min_prompt: int, min_output: int) -> None:
        self.path = path
        self.min_prompt = min_prompt
        self.min_output = min_output

    def error(self, line: int, name: str | None, message: str) -> TraceError:
        return TraceError(message, path=self.path, line=line, field=name)

    def count(self, value: object, line: int, name: str, minimum: int = 0, what: str = "") -> int:
        number: int | None = None
        if isinstance(value, str):
            try:  # the common case first; int() also accepts surrounding spaces
                number = int(value)
            except ValueError:
                # tolerate "12.0" (pandas writes integer columns that held NaN as floats)
                with contextlib.suppress(ValueError):
                    as_float = float(value)
                    number = int(as_float) if as_float.is_integer() else None
        elif is_int(value):
            number = value  # type: ignore[assignment]
        elif isinstance(value, float) and value.is_integer():
            number = int(value)
        if number is None or number < 0:
            raise self.error(line, name, f"expected a non-negative integer, got {value!r}")
        if number < minimum:
            raise self.error(
                line, name,
                f"expected at least {minimum} (a request needs {minimum} {what} token), "
                f"got {value!r}; --{what}-tokens N overrides the trace's lengths",
            )
        return check_tokens(number, name, path=self.path, line=line, got=value)

    def seconds(self, value: object, line: int, name: str, scale: float = 1.0) -> float:
        number = math.nan
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = float(value)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        if not (math.isfinite(number) and number >= 0):
            raise self.error(line, name, f"expected a non-negative number, got {value!r}")
        return check_timestamp_s(number * scale, name, path=self.path, line=line, got=value)

    def priority(self, value: object, line: int) -> int | None:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        number: int | None = None
        if isinstance(value, str):
            try:
                number = int(value.strip())
            except ValueError:
                number = None
        elif is_int(value):
            number = value  # type: ignore[assignment]
        if number is None:
            raise self.error(line, _PRIORITY_COL, f"expected an integer, got {value!r}")
        if not -PRIORITY_LIMIT <= number <= PRIORITY_LIMIT:
            raise self.error(line, _PRIORITY_COL, f"expected an integer between "
                             f"-{PRIORITY_LIMIT} and {PRIORITY_LIMIT}, got {value!r}")
        return number


_EPOCH = datetime(1970, 1, 1)


def _datetime_ns(text: str) -> tuple[int, bool]:
    """Nanoseconds since 1970 (UTC) of an ISO datetime, keeping all 7 of Azure's fractional
    digits (``datetime.fromisoformat`` would truncate to microseconds), and whether it named a
    time zone. Raises ValueError."""
    text = text.strip()
    head, dot, frac = text.partition(".")
    if dot and frac.isdigit() and len(frac) <= 9:
        base = datetime.fromisoformat(head)
        frac_ns = int(frac) * 10 ** (9 - len(frac))
    else:
        base = datetime.fromisoformat(text)
        frac_ns = 0
    zoned = base.tzinfo is not None
    if zoned:
        base = base.astimezone(UTC).replace(tzinfo=None)
    delta = base - _EPOCH
    return ((delta.days * 86_400 + delta.seconds) * 10**9 + delta.microseconds * 1000 + frac_ns,
            zoned)


def _parse_rows(
    items: Iterator[tuple[int, Any]],
    parse_one: Callable[[int, Any], Row | None],
    *,
    skip_bad_rows: bool,
) -> tuple[list[Row], int, list[TraceError]]:
    """Run ``parse_one`` over (line, raw) items; None from it means "dropped, counted elsewhere"."""
    rows: list[Row] = []
    skipped: list[TraceError] = []
    num_source_rows = 0
    for line, raw in items:
        num_source_rows += 1
        try:
            row = parse_one(line, raw)
        except TraceError as exc:
            if not skip_bad_rows:
                raise
            skipped.append(exc)
            continue
        if row is not None:
            rows.append(row)
    return rows, num_source_rows, skipped


class _CsvReader:
    """``csv.reader`` whose errors are TraceErrors naming the file and the line a row starts on.

    A trace row is one line. A quote left open makes ``csv`` read every following line into
    that field, up to the next quote or the end of the file: the row then "ends" many lines
    later, and skipping it (``--skip-bad-rows``) would silently drop all those rows. So a row
    that spans lines is refused, always, naming the line its quote opens on."""

    def __init__(self, path: str, lines: Iterable[str]) -> None:
        self._path = path
        self._source_done = False
        self._reader = csv.reader(self._lines(lines))
        self.row_line = 0  # the 1-based line the last row read starts on

    def _lines(self, lines: Iterable[str]) -> Iterator[str]:
        yield from lines
        self._source_done = True  # csv asked past the last line: a quote ran to the end

    @property
    def line_num(self) -> int:
        return self._reader.line_num

    def __iter__(self) -> Iterator[list[str]]:
        return self

    def __next__(self) -> list[str]:
        start = self._reader.line_num + 1  # each row read takes one line at least
        was_done = self._source_done
        try:
            row = next(self._reader)
        except csv.Error as exc:
            if self._reader.line_num > start:
                raise self._open_quote(start) from None
            raise TraceError(f"unreadable CSV ({exc}): a carriage return (\\r) inside a line, "
                             "or a quote left open, causes this", path=self._path,
                             line=start) from None
        # csv reads past a row's last line only while a quote is open; a closed row on the
        # last line ends there, and the final call (StopIteration) returns no row
        if self._reader.line_num > start or (self._source_done and not was_done):
            raise self._open_quote(start)
        self.row_line = start
        return row

    def _open_quote(self, start: int) -> TraceError:
        last = self._reader.line_num
        if last == start:
            what = "the file ends inside it"
        elif self._source_done:
            what = (f"lines {start + 1} to {last}, the end of the file, were all read into "
                    "one field of this row")
        else:
            what = f"lines {start + 1} to {last} were read into one field of this row"
        return TraceError(
            f"an opening quote on this line is not closed ({what}); refused even with "
            "--skip-bad-rows, because a quote left open swallows the lines after it and "
            "skipping the row would drop them too: close or remove the quote",
            path=self._path, line=start)


def _parse_csv(path: str, text: str, spec: _CsvSpec, fields: _Fields, *, skip_bad_rows: bool
               ) -> Parsed:
    reader = _CsvReader(path, io.StringIO(text))
    header: list[str] | None = None
    for candidate in reader:
        if candidate and any(cell.strip() for cell in candidate):
            header = [cell.strip() for cell in candidate]
            break
    if header is None:
        raise TraceError("empty file (no header row)", path=path)
    header_line = reader.row_line
    wanted = [c for c in (spec.time_col, spec.prompt_col, spec.output_col) if c is not None]
    missing = [c for c in wanted if c not in header]
    if missing:
        raise TraceError(
            f"missing column(s) {', '.join(repr(c) for c in missing)} for format "
            f"{spec.name!r}; the header (line {header_line}) has {', '.join(header)}",
            path=path,
        )
    i_time = header.index(spec.time_col) if spec.time_col is not None else -1
    i_prompt = header.index(spec.prompt_col)
    i_output = header.index(spec.output_col)
    i_priority = header.index(_PRIORITY_COL) if _PRIORITY_COL in header else -1
    i_model = header.index("Model") if spec.name == "burstgpt" and "Model" in header else -1
    num_columns = len(header)
    parsed = Parsed(rows=[], timed=spec.time_col is not None, num_source_rows=0, skipped=[])
    index = 0
    first_ns: int | None = None
    first_zone: list[Any] = []  # whether the first timestamp named a time zone, and its line

    def items() -> Iterator[tuple[int, list[str]]]:
        for row in reader:
            # blank lines are not rows
            if row and (len(row) == num_columns or any(cell.strip() for cell in row)):
                yield reader.row_line, row

    def parse_one(line: int, row: list[str]) -> Row | None:
        nonlocal index, first_ns
        request_id = str(index)
        index += 1
        if len(row) != num_columns:
            raise fields.error(line, None, f"expected {num_columns} fields, got {len(row)}")
        arrival_s = 0.0
        if spec.time_kind == "datetime":
            try:
                ns, zoned = _datetime_ns(row[i_time])
            except ValueError:
                raise fields.error(
                    line, spec.time_col,
                    f"expected a datetime like 2023-11-16 18:15:46.6805900, got {row[i_time]!r}",
                ) from None
            if first_ns is None:
                first_ns, first_zone[:] = ns, [zoned, line]
            elif zoned != first_zone[0]:  # one clock or the other: the gap between is unknown
                raise fields.error(
                    line, spec.time_col,
                    f"{row[i_time]!r} {'names a' if zoned else 'names no'} time zone, but the "
                    f"first row's timestamp (line {first_zone[1]}) "
                    f"{'does not' if zoned else 'does'}: the trace mixes clocks")
            arrival_s = (ns - first_ns) / 1e9  # exact integer difference first; may be < 0
        elif spec.time_kind == "seconds":
            assert spec.time_col is not None
            arrival_s = fields.seconds(row[i_time], line, spec.time_col)
        if spec.drop_failed:
            response = fields.count(row[i_output], line, spec.output_col)
            if response == 0:  # the request failed in the original service
                parsed.num_failed += 1
                return None
        prompt = fields.count(row[i_prompt], line, spec.prompt_col, fields.min_prompt, "prompt")
        output = fields.count(row[i_output], line, spec.output_col, fields.min_output, "output")
        priority = fields.priority(row[i_priority], line) if i_priority >= 0 else None
        if i_model >= 0:
            parsed.models[row[i_model].strip()] += 1
        return Row(request_id, line, arrival_s, prompt, output, priority, ())

    rows, num_source_rows, skipped = _parse_rows(items(), parse_one, skip_bad_rows=skip_bad_rows)
    parsed.rows, parsed.num_source_rows, parsed.skipped = rows, num_source_rows, skipped
    return parsed


def _parse_mooncake(path: str, text: str, fields: _Fields, *, skip_bad_rows: bool) -> Parsed:
    index = 0

    def items() -> Iterator[tuple[int, str]]:
        for line_no, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                yield line_no, line

    def parse_one(line: int, raw: str) -> Row:
        nonlocal index
        request_id = str(index)
        index += 1
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise fields.error(line, None, f"invalid JSON: {exc.msg} (column {exc.colno})"
                               ) from None
        if not isinstance(obj, dict):
            raise fields.error(line, None, f"expected a JSON object, got {type(obj).__name__}")
        missing = [k for k in ("timestamp", "input_length", "output_length") if k not in obj]
        if missing:
            raise fields.error(line, missing[0], "missing")
        arrival_s = fields.seconds(obj["timestamp"], line, "timestamp", scale=1e-3)  # ms
        prompt = fields.count(
            obj["input_length"], line, "input_length", fields.min_prompt, "prompt"
        )
        output = fields.count(
            obj["output_length"], line, "output_length", fields.min_output, "output"
        )
        hashes = obj.get("hash_ids", ())
        if not isinstance(hashes, list | tuple) or not all(is_int(h) and h >= 0
                                                           for h in hashes):
            raise fields.error(line, "hash_ids",
                               f"expected a list of non-negative integers, got {hashes!r}")
        blocks = -(-prompt // MOONCAKE_BLOCK_TOKENS)
        if hashes and len(hashes) != blocks:
            # Mooncake's invariant: one id per 512-token block of the prompt. A trace with
            # the same keys and other units (Qwen-Bailian: seconds, 16-token blocks) would
            # otherwise load with arrivals 1000x too fast and every id taken as 512 tokens.
            raise fields.error(
                line, "hash_ids",
                f"{len(hashes)} block ids, but input_length {prompt} is {blocks} blocks of "
                f"{MOONCAKE_BLOCK_TOKENS} tokens: this is read as a Mooncake trace (timestamps "
                f"in milliseconds, one id per {MOONCAKE_BLOCK_TOKENS}-token block), and a "
                "trace with other units would be read wrongly")
        priority = fields.priority(obj.get(_PRIORITY_COL), line)
        return Row(request_id, line, arrival_s, prompt, output, priority, tuple(hashes))

    rows, num_source_rows, skipped = _parse_rows(items(), parse_one, skip_bad_rows=skip_bad_rows)
    if num_source_rows == 0:
        raise TraceError("empty file (no JSON lines)", path=path)
    return Parsed(rows, True, num_source_rows, skipped)


# ---------------------------------------------------------------- reading and detection


def _read_text(path: Path, data: bytes) -> str:
    if path.suffix == ".gz" or data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise TraceError(f"not a readable gzip file ({exc})", path=str(path)) from None
    if data[:4] == b"PAR1":
        raise TraceError("a Parquet file: batchlab reads traces as CSV or JSONL text (Azure, "
                         "BurstGPT, Vidur, length-only, Mooncake); a run folder's "
                         "requests.parquet is a result, not a trace", path=str(path))
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TraceError(f"not UTF-8 text (byte {exc.start})", path=str(path)) from None


def _detect_format(path: Path, text: str) -> str:
    """Pick the format from the extension (``.gz`` stripped) and the first line."""
    name = path.name.lower().removesuffix(".gz")
    first = next((line for line in io.StringIO(text) if line.strip()), "").rstrip("\r\n")
    if not first:
        raise TraceError("empty file", path=str(path))
    if first.lstrip().startswith("{"):
        return "mooncake"
    if name.endswith((".jsonl", ".json", ".ndjson")):
        raise TraceError(f"named as JSON lines, but its first line {first.strip()[:80]!r} is "
                         "not a JSON object; a CSV trace under another name is read with "
                         "--format azure (or burstgpt, vidur, lengths)", path=str(path))
    header = {cell.strip() for cell in next(_CsvReader(str(path), [first]))}
    # The format sharing the most columns with the header; a partial match then fails with
    # the names of the columns it misses, which says more than "unknown format".
    overlap = {
        name: len(header & {c for c in (spec.time_col, spec.prompt_col, spec.output_col) if c})
        for name, spec in _CSV_SPECS.items()
    }
    best = max(overlap.values())
    if best > 0:
        # lengths and vidur share two columns: arrived_at makes vidur score higher
        return next(name for name, score in overlap.items() if score == best)
    raise TraceError(
        f"cannot tell the trace format from the header {first.strip()!r}; expected Azure "
        "(TIMESTAMP,ContextTokens,GeneratedTokens), BurstGPT (Timestamp,...,Request tokens,"
        "Response tokens,...), Vidur (arrived_at,num_prefill_tokens,num_decode_tokens), "
        "length-only (num_prefill_tokens,num_decode_tokens) or Mooncake JSONL; "
        "--format names it",
        path=str(path),
    )


def load_file(
    path: Path, fmt: str | None, *, min_prompt: int, min_output: int, skip_bad_rows: bool
) -> tuple[Parsed, str, bytes]:
    """Parse one file: (rows, resolved format, raw bytes).

    ``fmt`` None detects the format. Token counts below ``min_prompt``/``min_output`` are errors
    (0 is allowed where an override replaces the trace's lengths).
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceError("no such file", path=str(path)) from None
    except OSError as exc:
        raise TraceError(f"cannot read ({exc.strerror})", path=str(path)) from None
    text = _read_text(path, data)
    fmt = fmt or _detect_format(path, text)
    fields = _Fields(str(path), min_prompt=min_prompt, min_output=min_output)
    if fmt == "mooncake":
        parsed = _parse_mooncake(str(path), text, fields, skip_bad_rows=skip_bad_rows)
    elif fmt in _CSV_SPECS:
        parsed = _parse_csv(str(path), text, _CSV_SPECS[fmt], fields, skip_bad_rows=skip_bad_rows)
    else:
        raise TraceError(f"format {fmt!r} is not a file format", path=str(path))
    if parsed.num_source_rows == 0:
        raise TraceError("no requests (header only)", path=str(path))
    if parsed.timed:
        _sort_and_rezero(parsed)
    return parsed, fmt, data


def _sort_and_rezero(parsed: Parsed) -> None:
    rows = parsed.rows
    parsed.num_reordered = sum(
        1 for a, b in itertools.pairwise(rows) if b.arrival_s < a.arrival_s
    )
    if parsed.num_reordered:
        rows.sort(key=lambda r: r.arrival_s)  # stable: ties keep file order
    if rows and rows[0].arrival_s != 0.0:
        origin = rows[0].arrival_s
        parsed.rows = [r._replace(arrival_s=r.arrival_s - origin) for r in rows]
