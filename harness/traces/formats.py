"""Trace file formats: reading, detecting and parsing each into rows.

``azure`` (Azure LLM inference 2023 CSV), ``mooncake`` (JSONL, plain or .gz), ``lengths``
(length-only CSVs: ShareGPT / arXiv stats), ``vidur`` (Vidur's processed CSV) and ``burstgpt``
(BurstGPT CSV). The CSV formats differ only in which columns they read (``_CSV_SPECS``). Every
timed source is sorted by arrival (stably) and re-zeroed so that its earliest row arrives at 0 s.

A malformed row raises ``TraceError`` naming the file, the 1-based line and the field, unless
``skip_bad_rows`` is set; then it is kept in ``Parsed.skipped`` for the report. A count or a
time past the bounds of ``bounds`` is malformed like any other. A CSV quote left open is an
error even then (``_CsvReader``): the rows after it would be lost inside one field. A quoted
field closed on a later line (a prompt's text, in a column the format ignores) is read as csv
reads it, its row named by the line it starts on.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import gzip
import io
import itertools
import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.traces.bounds import (
    MAX_TIMESTAMP_S,
    MAX_TOKENS_PER_REQUEST,
    check_timestamp_s,
    check_tokens,
)
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
        # a plain count of ASCII digits, the common case: of the checks below only the
        # minimum and the bound can fail it (anything else, or a miss, takes the long way)
        if type(value) is str and len(value) <= 18 and value.isascii() and value.isdigit():
            number = int(value)
            if minimum <= number <= MAX_TOKENS_PER_REQUEST:
                return number
        return self._count(value, line, name, minimum, what)

    def _count(self, value: object, line: int, name: str, minimum: int, what: str) -> int:
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
        shown = _brief(value)
        if number is None or number < 0:
            raise self.error(line, name, f"expected a non-negative integer, got {shown!r}")
        if number < minimum:
            raise self.error(
                line, name,
                f"expected at least {minimum} (a request needs {minimum} {what} token), "
                f"got {shown!r}; --{what}-tokens N overrides the trace's lengths",
            )
        return check_tokens(number, name, path=self.path, line=line, got=shown)

    def seconds(self, value: object, line: int, name: str, scale: float = 1.0) -> float:
        number = math.nan
        shown = _brief(value)
        if isinstance(value, int) and not isinstance(value, bool) and value > _FLOAT_SAFE_INT:
            # float() would overflow: a number, and past every bound
            return check_timestamp_s(math.inf, name, path=self.path, line=line, got=shown)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = float(value)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        if not (math.isfinite(number) and number >= 0):
            raise self.error(line, name, f"expected a non-negative number, got {shown!r}")
        return check_timestamp_s(number * scale, name, path=self.path, line=line, got=shown)

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
            raise self.error(line, _PRIORITY_COL, f"expected an integer, got {_brief(value)!r}")
        if not -PRIORITY_LIMIT <= number <= PRIORITY_LIMIT:
            raise self.error(line, _PRIORITY_COL, f"expected an integer between "
                             f"-{PRIORITY_LIMIT} and {PRIORITY_LIMIT}, got {_brief(value)!r}")
        return number


_HASH_LIMIT = 2**64  # Mooncake's hash_ids: unsigned 64-bit values
_FLOAT_SAFE_INT = 2**1023  # float() of a larger int may overflow
_MAX_SHOWN_CHARS = 60  # of a value quoted in a message
_HEADER_CHARS = 300  # of a header line


class _Shown:
    """A value too long to quote whole, as a message quotes it (its ``repr``)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _brief(value: object) -> object:
    """``value``, or, where its ``repr`` is long (a field can hold a whole line), a stand-in
    whose ``repr`` is its start and its length: a message quotes what it read in one line."""
    try:
        text = repr(value)
    except ValueError:  # only an int past Python's limit of digits (4300) has no repr
        return _Shown(f"<an integer of more than {sys.get_int_max_str_digits()} digits>")
    return value if len(text) <= _MAX_SHOWN_CHARS else _Shown(_cut(text))


def _cut(text: str, limit: int = _MAX_SHOWN_CHARS) -> str:
    """``text``, or its start and its length where it is longer than ``limit``."""
    if len(text) <= limit:
        return text
    return f"{text[:limit - 20]}... ({len(text)} characters)"


_EPOCH = datetime(1970, 1, 1)


# An ISO datetime split around its seconds' fraction: "2023-11-16 18:15:46" | "6805900" | "" or a
# time zone ("+05:00", "Z"). The seconds are HH:MM:SS or HHMMSS after a non-sign (so that the
# fraction of an offset, "+05:30:15.5", is not taken for them); "," is ISO's other decimal sign.
_SECONDS_FRACTION = re.compile(
    r"(?P<head>[^+Z]*?(?<![-+\d:])\d{2}(:?)\d{2}\2\d{2})[.,](?P<digits>\d+)(?P<zone>.*)")


def _datetime_ns(text: str) -> tuple[int, bool]:
    """Nanoseconds since 1970 (UTC) of an ISO datetime (any form ``datetime.fromisoformat``
    reads), keeping up to 9 fractional digits (all 7 of Azure's; ``fromisoformat`` would
    truncate to microseconds), with or without a time zone, and whether it named a time zone.
    Raises ValueError."""
    text = text.strip()
    head, dot, digits = text.partition(".")
    zone = ""
    # Azure's own form first (fast: 19 characters before the dot leave no room for a time
    # zone); then every other
    if not (dot and len(head) == 19 and digits.isdigit()):
        split = _SECONDS_FRACTION.fullmatch(text)
        if split is None:
            head, digits = text, ""
        else:
            head, digits, zone = split["head"], split["digits"], split["zone"]
    if digits:
        base = datetime.fromisoformat(head + zone)
        digits = digits[:9]  # nanoseconds: further digits are below the clock's tick
        frac_ns = int(digits) * 10 ** (9 - len(digits))
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


_MAX_SPAN_NS = int(MAX_TIMESTAMP_S * 1e9)  # datetimes: the bound of numeric timestamps
_CSV_FIELD_SIZE_LIMIT = 2**31 - 1  # a C long everywhere (sys.maxsize is not, on Windows)


_COUNT_TEXT = re.compile(r"\s*\d+(\.0*)?\s*")  # a token count as a trace writes it


class _CsvReader:
    """``csv.reader`` whose errors are TraceErrors naming the file and the line a row starts on.

    A trace row is usually one line, but a quoted field may hold line breaks (RFC 4180): a
    column the format ignores may carry a prompt's text. A quote left open, though, makes
    ``csv`` read every following line into that field, up to the next quote or the end of the
    file: the row then "ends" many lines later, and skipping it (``--skip-bad-rows``) would
    silently drop all those rows. So a row that spans lines is read only where it is plainly a
    closed multi-line field (``_closed_across_lines``); otherwise it is refused, always, naming
    the line its quote opens on."""

    def __init__(self, path: str, lines: Iterable[str]) -> None:
        self._path = path
        self._source_done = False
        self._row_text: list[str] = []  # the lines read for the current row
        self._num_columns: int | None = None  # the header's; None: no row may span lines
        self._read_columns: frozenset[int] = frozenset()
        self._count_columns: frozenset[int] = frozenset()
        # csv refuses fields over 131,072 characters by default; a column the format does not
        # read may hold more (a prompt's text). A quote left open is caught by its line count
        # (below), not by this limit. The limit is csv's, for the whole process: only raised.
        if csv.field_size_limit() < _CSV_FIELD_SIZE_LIMIT:
            csv.field_size_limit(_CSV_FIELD_SIZE_LIMIT)
        self._reader = csv.reader(self._lines(lines))
        self.row_line = 0  # the 1-based line the last row read starts on

    def _lines(self, lines: Iterable[str]) -> Iterator[str]:
        for line in lines:
            self._row_text.append(line)
            yield line
        self._source_done = True  # csv asked past the last line: a quote ran to the end

    def allow_multiline(self, num_columns: int, read_columns: Iterable[int],
                        count_columns: Iterable[int]) -> None:
        """Let later rows of ``num_columns`` fields span lines, in columns other than
        ``read_columns`` (those the format parses: a count or a time never holds a line
        break); ``count_columns`` (token counts) tell a line that reads as a trace row."""
        self._num_columns = num_columns
        self._read_columns = frozenset(read_columns)
        self._count_columns = frozenset(count_columns)

    @property
    def line_num(self) -> int:
        return self._reader.line_num

    def __iter__(self) -> Iterator[list[str]]:
        return self

    def __next__(self) -> list[str]:
        start = self._reader.line_num + 1  # each row read takes one line at least
        was_done = self._source_done
        self._row_text.clear()
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
        if self._source_done and not was_done:
            raise self._open_quote(start)
        if self._reader.line_num > start and not self._closed_across_lines(row):
            raise self._open_quote(start)
        self.row_line = start
        return row

    def _closed_across_lines(self, row: list[str]) -> bool:
        """Whether ``row``, read from several lines, is a closed multi-line field rather than a
        quote left open that a later quote happened to close. A runaway quote takes whole trace
        rows into one field; a closed field holds text. So the row must have the header's
        number of fields, line breaks only in columns the format ignores, and no line inside
        it that reads as a trace row (the header's number of fields, integer counts)."""
        if len(row) != self._num_columns:
            return False
        if any("\n" in row[i] or "\r" in row[i] for i in self._read_columns):
            return False
        for line in self._row_text[1:]:  # each line after the row's first, read on its own
            try:
                cells = next(csv.reader([line]), [])
            except csv.Error:  # a lone carriage return: text, not a row
                continue
            if len(cells) == self._num_columns and all(
                    _COUNT_TEXT.fullmatch(cells[i]) for i in self._count_columns):
                return False
        return True

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
        if header[0].startswith("{"):
            has = (f"the file looks like JSON lines (line {header_line} is a JSON object), "
                   "not CSV: drop --format, or use --format mooncake")
        else:
            has = f"the header (line {header_line}) has {_cut(', '.join(header), _HEADER_CHARS)}"
        raise TraceError(
            f"missing column(s) {', '.join(repr(c) for c in missing)} for format "
            f"{spec.name!r}; {has}",
            path=path,
        )
    for name in [*wanted, _PRIORITY_COL]:
        places = [i + 1 for i, c in enumerate(header) if c == name]
        if len(places) > 1:  # which one holds the values is anyone's guess
            raise TraceError(
                f"column {name!r} appears {len(places)} times in the header (columns "
                f"{', '.join(map(str, places))}): rename or remove all but one",
                path=path, line=header_line,
            )
    i_time = header.index(spec.time_col) if spec.time_col is not None else -1
    i_prompt = header.index(spec.prompt_col)
    i_output = header.index(spec.output_col)
    i_priority = header.index(_PRIORITY_COL) if _PRIORITY_COL in header else -1
    i_model = header.index("Model") if spec.name == "burstgpt" and "Model" in header else -1
    num_columns = len(header)
    reader.allow_multiline(
        num_columns, [i for i in (i_time, i_prompt, i_output, i_priority, i_model) if i >= 0],
        count_columns=[i_prompt, i_output])
    parsed = Parsed(rows=[], timed=spec.time_col is not None, num_source_rows=0, skipped=[])
    index = 0
    first_ns: int | None = None
    first_zone: list[Any] = []  # whether the first timestamp named a time zone, and its line
    earliest: tuple[int, int] | None = None  # (ns, line) of the earliest timestamp read
    latest: tuple[int, int] | None = None  # and of the latest

    def items() -> Iterator[tuple[int, list[str]]]:
        for row in reader:
            # blank lines are not rows
            if row and (len(row) == num_columns or any(cell.strip() for cell in row)):
                yield reader.row_line, row

    def parse_one(line: int, row: list[str]) -> Row | None:
        nonlocal index, first_ns, earliest, latest
        request_id = str(index)
        index += 1
        if len(row) != num_columns:
            raise fields.error(line, None, f"expected {num_columns} fields, got {len(row)}")
        arrival_s = 0.0
        span: tuple[tuple[int, int], tuple[int, int]] | None = None
        if spec.time_kind == "datetime":
            try:
                ns, zoned = _datetime_ns(row[i_time])
            except ValueError:
                raise fields.error(
                    line, spec.time_col,
                    f"expected a datetime like 2023-11-16 18:15:46.6805900, got "
                    f"{_brief(row[i_time])!r}",
                ) from None
            if first_ns is None:
                first_ns, first_zone[:] = ns, [zoned, line]
            elif zoned != first_zone[0]:  # one clock or the other: the gap between is unknown
                raise fields.error(
                    line, spec.time_col,
                    f"{row[i_time]!r} {'names a' if zoned else 'names no'} time zone, but the "
                    f"first row's timestamp (line {first_zone[1]}) "
                    f"{'does not' if zoned else 'does'}: the trace mixes clocks")
            # the trace's span is bounded, as numeric timestamps are (rows may be unsorted)
            lo = earliest if earliest is not None and earliest[0] <= ns else (ns, line)
            hi = latest if latest is not None and latest[0] >= ns else (ns, line)
            if hi[0] - lo[0] > _MAX_SPAN_NS:
                other = lo if hi[1] == line else hi
                raise fields.error(
                    line, spec.time_col,
                    f"expected timestamps at most {MAX_TIMESTAMP_S:g} seconds apart, got "
                    f"{_brief(row[i_time])!r}, {abs(ns - other[0]) / 1e9:.3g} s "
                    f"{'after' if ns > other[0] else 'before'} line {other[1]}'s")
            span = (lo, hi)
            arrival_s = (ns - first_ns) / 1e9  # exact integer difference first; may be < 0
        elif spec.time_kind == "seconds":
            assert spec.time_col is not None
            arrival_s = fields.seconds(row[i_time], line, spec.time_col)
        # a failed request (0 response tokens) is dropped, but only once its row is well
        # formed: a bad field is a bad row whatever the response
        failed = spec.drop_failed and fields.count(row[i_output], line, spec.output_col) == 0
        prompt = fields.count(row[i_prompt], line, spec.prompt_col,
                              0 if failed else fields.min_prompt, "prompt")
        priority = fields.priority(row[i_priority], line) if i_priority >= 0 else None
        if failed:  # the request failed in the original service
            parsed.num_failed += 1
            return None
        output = fields.count(row[i_output], line, spec.output_col, fields.min_output, "output")
        if i_model >= 0:
            parsed.models[row[i_model].strip()] += 1
        if span is not None:  # a row skipped as malformed does not stretch the span
            earliest, latest = span
        return Row(request_id, line, arrival_s, prompt, output, priority, ())

    rows, num_source_rows, skipped = _parse_rows(items(), parse_one, skip_bad_rows=skip_bad_rows)
    parsed.rows, parsed.num_source_rows, parsed.skipped = rows, num_source_rows, skipped
    return parsed


class _RepeatedKey(Exception):
    """A JSON object naming ``key`` more than once, with ``values`` in the order given."""

    def __init__(self, key: str, values: list[Any]) -> None:
        super().__init__(key)
        self.key = key
        self.values = values


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook``: the object; raises _RepeatedKey where a key repeats (json alone
    keeps its last value, silently). Every object of the row is checked, nested ones too, as every
    other fault of the row's JSON is. Cheap: one dict built, as json builds it anyway."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:  # the first key named again
            if key in seen:
                raise _RepeatedKey(key, [v for k, v in pairs if k == key])
            seen.add(key)
    return obj


# strict=False: a control character (a form feed, a tab) inside a string is read as it is, as
# most JSON readers do, rather than refusing the row. One decoder for every line: json.loads
# with options would build one per line.
_JSON_ROW = json.JSONDecoder(strict=False, object_pairs_hook=_unique_keys)
_SHOWN_REPEATS = 3  # of a repeated key's values, those a message quotes


def _parse_mooncake(path: str, text: str, fields: _Fields, *, skip_bad_rows: bool) -> Parsed:
    index = 0

    def items() -> Iterator[tuple[int, str]]:
        # JSON lines end at "\n" only (and "\r\n"): str.splitlines() would also split at
        # U+2028, U+0085 or a form feed inside a string, which JSON allows unescaped
        for line_no, line in enumerate(text.split("\n"), start=1):
            if line.strip():
                yield line_no, line.removesuffix("\r")

    def parse_one(line: int, raw: str) -> Row:
        nonlocal index
        request_id = str(index)
        index += 1
        try:
            obj = _JSON_ROW.decode(raw)
        except _RepeatedKey as exc:
            values = ", ".join(repr(_brief(v)) for v in exc.values[:_SHOWN_REPEATS])
            more = ", ..." if len(exc.values) > _SHOWN_REPEATS else ""
            raise fields.error(
                line, exc.key,
                f"appears {len(exc.values)} times in one JSON object of the row (values "
                f"{values}{more}): remove all but one") from None
        except json.JSONDecodeError as exc:
            msg = exc.msg
            if raw.startswith("\ufeff"):  # as json.loads says it
                msg = "Unexpected UTF-8 BOM (decode using utf-8-sig)"
            raise fields.error(line, None, f"invalid JSON: {msg} (column {exc.colno})"
                               ) from None
        except ValueError as exc:  # json reads integers as Python does: up to 4300 digits
            if "digits" not in str(exc):
                raise fields.error(line, None, f"invalid JSON: {exc}") from None
            limit = sys.get_int_max_str_digits()
            key = re.search(rf'"([^"\\]*)"\s*:\s*-?\d{{{limit + 1}}}', raw)  # whose it is
            raise fields.error(line, key[1] if key else None,
                               f"invalid JSON: an integer longer than {limit} digits") from None
        except RecursionError:
            raise fields.error(line, None, "invalid JSON: arrays or objects nested too "
                               "deeply") from None
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
        hashes = obj.get("hash_ids", [])
        if not isinstance(hashes, list):
            raise fields.error(line, "hash_ids", "expected a list of non-negative integers, "
                               f"got {_brief(hashes)!r}")
        bad = next((k for k, h in enumerate(hashes) if not (is_int(h) and 0 <= h < _HASH_LIMIT)),
                   None)
        if bad is not None:  # ids are 64-bit hashes: signed or unsigned, all fit below 2**64
            raise fields.error(
                line, "hash_ids", "expected a list of non-negative integers below 2**64 "
                f"(64-bit hash ids), got {_brief(hashes[bad])!r} at index {bad}")
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
    gz = path.suffix == ".gz" or data[:2] == b"\x1f\x8b"
    if gz:
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
        # exc.start counts from after a byte-order mark
        offset = exc.start + (len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0)
        line = data.count(b"\n", 0, offset) + 1
        column = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
        raise TraceError(f"not UTF-8 text (byte 0x{data[offset]:02x}, column {column} of the "
                         f"line, byte {offset} of the file{' once decompressed' if gz else ''})",
                         path=str(path), line=line) from None


def _first_line(text: str) -> tuple[int, str]:
    """The first line that is not blank, and its 1-based number; (0, "") for none."""
    for number, line in enumerate(io.StringIO(text), start=1):
        if line.strip():
            return number, line.rstrip("\r\n")
    return 0, ""


def _csv_format_of(path: Path, first: str) -> str | None:
    """The CSV format sharing the most columns with the header line ``first``, or None."""
    header = {cell.strip() for cell in next(_CsvReader(str(path), [first]), [])}
    # The format sharing the most columns with the header; a partial match then fails with
    # the names of the columns it misses, which says more than "unknown format".
    overlap = {
        name: len(header & {c for c in (spec.time_col, spec.prompt_col, spec.output_col) if c})
        for name, spec in _CSV_SPECS.items()
    }
    best = max(overlap.values())
    if best == 0:
        return None
    # lengths and vidur share two columns: arrived_at makes vidur score higher
    return next(name for name, score in overlap.items() if score == best)


def _check_looks_like_json(path: Path, text: str) -> None:
    """``--format mooncake`` on a CSV trace: say so once, rather than "invalid JSON" on every
    line (with --skip-bad-rows, every line skipped)."""
    number, first = _first_line(text)
    if not first or first.lstrip().startswith(("{", "[")):
        return
    try:
        csv_format = _csv_format_of(path, first)
    except TraceError:  # not even a CSV line: its rows say what is wrong with them
        return
    if csv_format is not None:
        raise TraceError(
            f"invalid JSON: the file looks like CSV ({csv_format} header "
            f"{_cut(first, _HEADER_CHARS)!r}), not "
            f"JSON lines: drop --format, or use --format {csv_format}",
            path=str(path), line=number)


def _detect_format(path: Path, text: str) -> str:
    """Pick the format from the extension (``.gz`` stripped) and the first line."""
    name = path.name.lower().removesuffix(".gz")
    first = _first_line(text)[1]
    if not first:
        raise TraceError("empty file", path=str(path))
    if first.lstrip().startswith("{"):
        return "mooncake"
    if name.endswith((".jsonl", ".json", ".ndjson")):
        raise TraceError(f"named as JSON lines, but its first line {first.strip()[:80]!r} is "
                         "not a JSON object; a CSV trace under another name is read with "
                         "--format azure (or burstgpt, vidur, lengths)", path=str(path))
    csv_format = _csv_format_of(path, first)
    if csv_format is not None:
        return csv_format
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
    if fmt == "mooncake":
        _check_looks_like_json(path, text)
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
