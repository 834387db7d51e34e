"""Traces: real or synthetic request arrivals, loaded into one record type.

``load_trace(path, TraceOptions(...)) -> Trace``. Whatever the source, the same steps run in
the same order (``docs/traces.md`` has the user-facing version):

    parse rows ─► sort by arrival (stable) ─► window [start_s, end_s), re-zeroed at start_s
      ─► length overrides ─► max_model_len: drop | clip | error ─► limit
      ─► arrivals: keep trace times (x time_scale, or rescaled to rate), or synthesize them
      ─► priorities (trace column, else a seeded fraction) ─► Trace

Formats: ``azure`` (Azure LLM inference 2023 CSV), ``mooncake`` (JSONL, plain or .gz),
``lengths`` (length-only CSVs: ShareGPT / arXiv stats), ``vidur`` (Vidur's processed CSV),
``burstgpt`` (BurstGPT CSV) and ``synthetic`` (no file: fixed lengths, or lengths sampled from
any trace file). Every timed source is re-zeroed so that its earliest row arrives at 0 s.

A malformed row raises ``TraceError`` naming the file, the 1-based line and the field; nothing is
skipped unless ``skip_bad_rows`` is set, and then ``Trace.counts`` and ``Trace.notes`` say how
many. Everything random is drawn from ``numpy`` generators seeded with ``options.seed``, one
stream per purpose, so a trace plus its options always loads to the same requests.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import gzip
import hashlib
import io
import itertools
import json
import math
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

# ---------------------------------------------------------------- records (the contract)


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace. Arrival is seconds from the trace's start."""

    request_id: str
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    priority: int | None = None  # lower is served first (vLLM's convention)
    prefix_hash_ids: tuple[int, ...] = ()  # prefix-block hashes (Mooncake: 512 tokens a block)


@dataclass(frozen=True, slots=True)
class Trace:
    """A loaded trace: its requests in arrival order, where they came from, what was changed."""

    requests: tuple[TraceRequest, ...]
    source: str  # path or "synthetic:poisson" ...
    format: str
    digest: str  # sha256 of the source bytes plus the options applied
    notes: tuple[str, ...] = ()  # e.g. "dropped 3 requests longer than max_model_len 4096"
    counts: dict[str, int] = field(default_factory=dict)  # dropped/clipped/skipped counts

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def duration_s(self) -> float:
        """Arrival of the last request (0 for an empty trace)."""
        return self.requests[-1].arrival_s if self.requests else 0.0

    def check_invariants(self) -> None:
        """Sorted by arrival, unique ids, at least one prompt and one output token each."""
        seen: set[str] = set()
        previous = 0.0
        for r in self.requests:
            assert r.request_id not in seen, f"duplicate request id {r.request_id!r}"
            seen.add(r.request_id)
            assert r.arrival_s >= previous, f"request {r.request_id} arrives out of order"
            previous = r.arrival_s
            assert r.num_prompt_tokens >= 1 and r.num_output_tokens >= 1, r


# ---------------------------------------------------------------- options and errors

FORMATS = ("azure", "mooncake", "lengths", "vidur", "burstgpt", "synthetic")
ARRIVALS = ("poisson", "gamma", "constant")
ON_TOO_LONG = ("error", "drop", "clip")

MOONCAKE_BLOCK_TOKENS = 512  # tokens per Mooncake ``hash_ids`` entry (FAST'25 release README)

# Separate random streams, so that e.g. changing the arrival process keeps the priorities.
_STREAM_ARRIVALS = 0
_STREAM_LENGTHS = 1
_STREAM_PRIORITY = 2

_DIGEST_VERSION = b"batchlab-trace-v1"


class TraceError(ValueError):
    """Bad trace input or options. The message names the file, the 1-based line and the field.

    ``path``, ``line`` and ``field`` are also attributes, ``None`` where they do not apply.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        prefix = ""
        if path is not None:
            prefix = f"{path}:{line}: " if line is not None else f"{path}: "
        if field is not None:
            prefix += f"field {field!r}: "
        super().__init__(prefix + message)
        self.path = path
        self.line = line
        self.field = field


@dataclass(frozen=True, slots=True)
class TraceOptions:
    """Every knob of trace loading; validated on construction (errors name the CLI flag).

    ``None`` means "not set". See ``docs/traces.md`` for the order in which they apply.
    """

    format: str | None = None  # one of FORMATS; None detects from the extension and header
    limit: int | None = None  # keep the first N requests (after window and max_model_len)
    start_s: float | None = None  # window on trace time, [start_s, end_s); re-zeroed at start_s
    end_s: float | None = None
    time_scale: float | None = None  # multiply every trace arrival time by this
    rate: float | None = None  # requests/s: rescale trace times, or rate of synthetic arrivals
    arrival: str | None = None  # synthesize arrivals (ARRIVALS); None keeps trace timestamps
    burstiness: float | None = None  # gamma shape, as vLLM's: 1 = Poisson, inf = constant
    num_requests: int | None = None  # synthetic traces only
    lengths_from: str | None = None  # synthetic traces: sample (prompt, output) pairs from a file
    prompt_tokens: int | None = None  # override every request's prompt length
    output_tokens: int | None = None  # override every request's output length
    max_model_len: int | None = None  # prompt + output must fit; see on_too_long
    on_too_long: str = "error"  # one of ON_TOO_LONG
    priority_fraction: float | None = None  # this seeded fraction gets priority 0, the rest 1
    seed: int = 0
    skip_bad_rows: bool = False  # skip malformed rows (counted) instead of failing

    def __post_init__(self) -> None:
        def bad(name: str, expected: str, value: object) -> TraceError:
            return TraceError(f"--{name.replace('_', '-')}: expected {expected}, got {value!r}")

        if self.format is not None and self.format not in FORMATS:
            raise bad("format", f"one of {', '.join(FORMATS)}", self.format)
        if self.arrival is not None and self.arrival not in ARRIVALS:
            raise bad("arrival", f"one of {', '.join(ARRIVALS)}", self.arrival)
        if self.on_too_long not in ON_TOO_LONG:
            raise bad("on_too_long", f"one of {', '.join(ON_TOO_LONG)}", self.on_too_long)
        for name in ("limit", "num_requests", "prompt_tokens", "output_tokens"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise bad(name, "a positive integer", value)
        if self.max_model_len is not None and (
            not _is_int(self.max_model_len) or self.max_model_len < 2
        ):
            raise bad("max_model_len", "an integer of at least 2", self.max_model_len)
        if not _is_int(self.seed):
            raise bad("seed", "an integer", self.seed)
        for name in ("start_s", "end_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise bad(name, "a non-negative number of seconds", value)
        if self.start_s is not None and self.end_s is not None and self.end_s <= self.start_s:
            raise bad("end_s", f"a time after --start-s {self.start_s}", self.end_s)
        if self.time_scale is not None and not (
            math.isfinite(self.time_scale) and self.time_scale > 0
        ):
            raise bad("time_scale", "a positive number", self.time_scale)
        if self.rate is not None and not (self.rate > 0):  # inf allowed: everything at t=0
            raise bad("rate", "a positive number of requests per second (or inf)", self.rate)
        if self.time_scale is not None and self.rate is not None:
            raise TraceError("--time-scale and --rate both rescale time: give one of them")
        if self.burstiness is not None and not (self.burstiness > 0):
            raise bad("burstiness", "a positive number (1 = Poisson, inf = constant)",
                      self.burstiness)
        if self.burstiness is not None and self.arrival in ("poisson", "constant") and (
            self.burstiness != (1.0 if self.arrival == "poisson" else math.inf)
        ):
            raise TraceError(
                f"--burstiness {self.burstiness} contradicts --arrival {self.arrival}; "
                "use --arrival gamma"
            )
        if self.priority_fraction is not None and not (0.0 <= self.priority_fraction <= 1.0):
            raise bad("priority_fraction", "a fraction between 0 and 1", self.priority_fraction)

    @property
    def resolved_arrival(self) -> str | None:
        """The arrival process implied by ``arrival`` and ``burstiness`` (None: trace times)."""
        if self.arrival is not None:
            return self.arrival
        return None if self.burstiness is None else "gamma"

    def canonical(self) -> str:
        """A stable text form of the options (part of ``Trace.digest``)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, default=repr)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ---------------------------------------------------------------- bundled and shared data

DATA_DIR = Path(__file__).resolve().parent / "data"
REPO_ROOT = Path(__file__).resolve().parent.parent
TRACES_DIR_ENV = "BATCHLAB_TRACES_DIR"


def shared_traces_dir() -> Path | None:
    """The full public traces (``$BATCHLAB_TRACES_DIR``, else ``../shared/traces`` next to the
    repository), or None where that folder does not exist."""
    configured = os.environ.get(TRACES_DIR_ENV)
    path = Path(configured) if configured else REPO_ROOT.parent / "shared" / "traces"
    return path if path.is_dir() else None


# ---------------------------------------------------------------- parsed rows


class _Row(NamedTuple):
    """One source row on its way to a TraceRequest."""

    request_id: str
    line: int  # 1-based line in the source, for error messages
    arrival_s: float  # seconds from the earliest row; 0.0 for untimed sources
    num_prompt_tokens: int
    num_output_tokens: int
    priority: int | None
    prefix_hash_ids: tuple[int, ...]


@dataclass(slots=True)
class _Parsed:
    rows: list[_Row]
    timed: bool
    num_source_rows: int
    skipped: list[TraceError]
    num_failed: int = 0  # BurstGPT rows of failed requests (0 response tokens)
    models: Counter[str] = field(default_factory=Counter)  # BurstGPT "Model" column
    hash_block_tokens: int | None = None
    num_reordered: int = 0  # rows that arrived before the row above them


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
        elif _is_int(value):
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
        return number

    def seconds(self, value: object, line: int, name: str, scale: float = 1.0) -> float:
        number = math.nan
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = float(value)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        if not (math.isfinite(number) and number >= 0):
            raise self.error(line, name, f"expected a non-negative number, got {value!r}")
        return number * scale

    def priority(self, value: object, line: int) -> int | None:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        number: int | None = None
        if isinstance(value, str):
            try:
                number = int(value.strip())
            except ValueError:
                number = None
        elif _is_int(value):
            number = value  # type: ignore[assignment]
        if number is None:
            raise self.error(line, _PRIORITY_COL, f"expected an integer, got {value!r}")
        return number


_EPOCH = datetime(1970, 1, 1)


def _datetime_ns(text: str) -> int:
    """Nanoseconds since 1970 of an ISO datetime, keeping all 7 of Azure's fractional digits
    (``datetime.fromisoformat`` would truncate to microseconds). Raises ValueError."""
    text = text.strip()
    head, dot, frac = text.partition(".")
    if dot and frac.isdigit() and len(frac) <= 9:
        base = datetime.fromisoformat(head)
        frac_ns = int(frac) * 10 ** (9 - len(frac))
    else:
        base = datetime.fromisoformat(text)
        frac_ns = 0
    if base.tzinfo is not None:
        base = base.astimezone(UTC).replace(tzinfo=None)
    delta = base - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 10**9 + delta.microseconds * 1000 + frac_ns


def _parse_rows(
    items: Iterator[tuple[int, Any]],
    parse_one: Callable[[int, Any], _Row | None],
    *,
    skip_bad_rows: bool,
) -> tuple[list[_Row], int, list[TraceError]]:
    """Run ``parse_one`` over (line, raw) items; None from it means "dropped, counted elsewhere"."""
    rows: list[_Row] = []
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


def _parse_csv(path: str, text: str, spec: _CsvSpec, fields: _Fields, *, skip_bad_rows: bool
               ) -> _Parsed:
    reader = csv.reader(io.StringIO(text))
    header: list[str] | None = None
    for candidate in reader:
        if candidate and any(cell.strip() for cell in candidate):
            header = [cell.strip() for cell in candidate]
            break
    if header is None:
        raise TraceError("empty file (no header row)", path=path)
    header_line = reader.line_num
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
    parsed = _Parsed(rows=[], timed=spec.time_col is not None, num_source_rows=0, skipped=[])
    index = 0
    first_ns: int | None = None

    def items() -> Iterator[tuple[int, list[str]]]:
        for row in reader:
            # blank lines are not rows
            if row and (len(row) == num_columns or any(cell.strip() for cell in row)):
                yield reader.line_num, row

    def parse_one(line: int, row: list[str]) -> _Row | None:
        nonlocal index, first_ns
        request_id = str(index)
        index += 1
        if len(row) != num_columns:
            raise fields.error(line, None, f"expected {num_columns} fields, got {len(row)}")
        arrival_s = 0.0
        if spec.time_kind == "datetime":
            try:
                ns = _datetime_ns(row[i_time])
            except ValueError:
                raise fields.error(
                    line, spec.time_col,
                    f"expected a datetime like 2023-11-16 18:15:46.6805900, got {row[i_time]!r}",
                ) from None
            if first_ns is None:
                first_ns = ns
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
        return _Row(request_id, line, arrival_s, prompt, output, priority, ())

    rows, num_source_rows, skipped = _parse_rows(items(), parse_one, skip_bad_rows=skip_bad_rows)
    parsed.rows, parsed.num_source_rows, parsed.skipped = rows, num_source_rows, skipped
    return parsed


def _parse_mooncake(path: str, text: str, fields: _Fields, *, skip_bad_rows: bool) -> _Parsed:
    index = 0

    def items() -> Iterator[tuple[int, str]]:
        for line_no, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                yield line_no, line

    def parse_one(line: int, raw: str) -> _Row:
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
        if not isinstance(hashes, list | tuple) or not all(_is_int(h) for h in hashes):
            raise fields.error(line, "hash_ids", f"expected a list of integers, got {hashes!r}")
        priority = fields.priority(obj.get(_PRIORITY_COL), line)
        return _Row(request_id, line, arrival_s, prompt, output, priority, tuple(hashes))

    rows, num_source_rows, skipped = _parse_rows(items(), parse_one, skip_bad_rows=skip_bad_rows)
    if num_source_rows == 0:
        raise TraceError("empty file (no JSON lines)", path=path)
    return _Parsed(rows, True, num_source_rows, skipped, hash_block_tokens=MOONCAKE_BLOCK_TOKENS)


# ---------------------------------------------------------------- reading and detection


def _read_text(path: Path, data: bytes) -> str:
    if path.suffix == ".gz" or data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise TraceError(f"not a readable gzip file ({exc})", path=str(path)) from None
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
    if name.endswith((".jsonl", ".json", ".ndjson")) or first.lstrip().startswith("{"):
        return "mooncake"
    header = {cell.strip() for cell in next(csv.reader([first]))}
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


def _load_file(path: Path, fmt: str | None, options: TraceOptions) -> tuple[_Parsed, str, bytes]:
    """Parse one file: (rows, resolved format, raw bytes)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceError("no such file", path=str(path)) from None
    except OSError as exc:
        raise TraceError(f"cannot read ({exc.strerror})", path=str(path)) from None
    text = _read_text(path, data)
    fmt = fmt or _detect_format(path, text)
    fields = _Fields(
        str(path),
        min_prompt=0 if options.prompt_tokens is not None else 1,
        min_output=0 if options.output_tokens is not None else 1,
    )
    if fmt == "mooncake":
        parsed = _parse_mooncake(str(path), text, fields, skip_bad_rows=options.skip_bad_rows)
    elif fmt in _CSV_SPECS:
        parsed = _parse_csv(
            str(path), text, _CSV_SPECS[fmt], fields, skip_bad_rows=options.skip_bad_rows
        )
    else:
        raise TraceError(f"format {fmt!r} is not a file format", path=str(path))
    if parsed.num_source_rows == 0:
        raise TraceError("no requests (header only)", path=str(path))
    if parsed.timed:
        _sort_and_rezero(parsed)
    return parsed, fmt, data


def _sort_and_rezero(parsed: _Parsed) -> None:
    rows = parsed.rows
    parsed.num_reordered = sum(
        1 for a, b in itertools.pairwise(rows) if b.arrival_s < a.arrival_s
    )
    if parsed.num_reordered:
        rows.sort(key=lambda r: r.arrival_s)  # stable: ties keep file order
    if rows and rows[0].arrival_s != 0.0:
        origin = rows[0].arrival_s
        parsed.rows = [r._replace(arrival_s=r.arrival_s - origin) for r in rows]


# ---------------------------------------------------------------- synthetic arrivals


def synthetic_arrivals_s(
    num_requests: int, rate: float, arrival: str, burstiness: float, rng: np.random.Generator
) -> np.ndarray:
    """Arrival instants: the first at 0, then ``num_requests - 1`` gaps.

    Gaps follow vLLM's ``get_request``: gamma(shape=burstiness, scale=1/(rate*burstiness)), so
    burstiness 1 is Poisson and the gap CV is 1/sqrt(burstiness); "constant" gaps are 1/rate.
    Like vLLM, the gaps are rescaled so their sum is exactly (n-1)/rate: the mean rate is then
    exactly ``rate`` for every seed. ``rate`` inf puts every arrival at 0.
    """
    if num_requests <= 1 or math.isinf(rate):
        return np.zeros(num_requests)
    n_gaps = num_requests - 1
    if arrival == "constant" or math.isinf(burstiness):
        gaps = np.full(n_gaps, 1.0 / rate)
    else:
        shape = 1.0 if arrival == "poisson" else burstiness
        gaps = rng.gamma(shape=shape, scale=1.0 / (rate * shape), size=n_gaps)
        total = float(gaps.sum())
        if total > 0:
            gaps *= (n_gaps / rate) / total
    return np.concatenate(([0.0], np.cumsum(gaps)))


def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream])


# ---------------------------------------------------------------- the pipeline


@dataclass(slots=True)
class _Report:
    counts: dict[str, int]
    notes: list[str]


def _is_synthetic_spec(path: str | Path | None) -> bool:
    return path is None or (isinstance(path, str) and path.split(":")[0] == "synthetic")


def load_trace(path: str | Path | None, options: TraceOptions | None = None) -> Trace:
    """Load a trace file (or ``None`` / ``"synthetic"`` / ``"synthetic:gamma"``) into a Trace.

    Raises TraceError for unreadable files, malformed rows, bad option combinations and traces
    left empty by the options.
    """
    options = options or TraceOptions()
    report = _Report(
        counts={
            "num_source_rows": 0,
            "skipped_bad_rows": 0,
            "dropped_failed": 0,
            "num_reordered": 0,
            "outside_window": 0,
            "dropped_too_long": 0,
            "clipped_too_long": 0,
            "beyond_limit": 0,
        },
        notes=[],
    )
    hasher = hashlib.sha256(_DIGEST_VERSION)
    arrival: str | None
    if _is_synthetic_spec(path) and options.format not in (None, "synthetic"):
        raise TraceError(f"--format {options.format} needs a trace file, not {path or 'none'}")
    if _is_synthetic_spec(path) or options.format == "synthetic":
        parsed, source, fmt, arrival = _synthetic_source(path, options, report, hasher)
    else:
        assert path is not None
        source = str(path)
        if options.lengths_from is not None:
            raise TraceError("--lengths-from applies to synthetic traces (--trace synthetic)")
        if options.num_requests is not None:
            raise TraceError(
                "--num-requests applies to synthetic traces; --limit N keeps the first N "
                f"requests of {source}"
            )
        parsed, fmt, data = _load_file(Path(path), options.format, options)
        hasher.update(data)
        arrival = options.resolved_arrival
    hasher.update(b"\0" + fmt.encode() + b"\0" + options.canonical().encode())
    label = source

    _report_parse(parsed, label, report)
    rows = parsed.rows
    if not parsed.timed and (options.start_s is not None or options.end_s is not None):
        raise TraceError(f"--start-s/--end-s need a timed trace; {label} has no timestamps")
    if not parsed.timed and arrival is None:
        arrival = "poisson"
    rows = _window(rows, options, label, report)
    rows = _override_lengths(rows, options, report)
    rows = _fit_model_len(rows, options, parsed, label, report)
    rows = _limit(rows, options, report)
    if not rows:
        raise TraceError("no requests left after applying the options", path=label)
    rows = _arrivals(rows, options, arrival, parsed.timed, label, report)
    rows = _priorities(rows, options, report)

    requests = tuple(
        TraceRequest(r.request_id, r.arrival_s, r.num_prompt_tokens, r.num_output_tokens,
                     r.priority, r.prefix_hash_ids)
        for r in rows
    )
    return Trace(
        requests=requests,
        source=source,
        format=fmt,
        digest=hasher.hexdigest(),
        notes=tuple(report.notes),
        counts=report.counts,
    )


def _synthetic_source(
    path: str | Path | None, options: TraceOptions, report: _Report, hasher: Any
) -> tuple[_Parsed, str, str, str]:
    """Rows for a synthetic trace: fixed lengths, or pairs sampled from ``lengths_from``."""
    arrival = options.resolved_arrival
    if isinstance(path, str) and ":" in path:
        named = path.split(":", 1)[1]
        if named not in ARRIVALS:
            raise TraceError(
                f"--trace {path!r}: expected synthetic or synthetic:<{'|'.join(ARRIVALS)}>"
            )
        if arrival is not None and arrival != named:
            raise TraceError(f"--trace {path!r} contradicts --arrival {arrival}")
        arrival = named
    elif path is not None and not _is_synthetic_spec(path):
        raise TraceError(
            f"--format synthetic reads no trace file ({path}); --lengths-from {path} samples "
            "its lengths"
        )
    arrival = arrival or "poisson"
    n = options.num_requests
    if n is None:
        raise TraceError("a synthetic trace needs --num-requests N")
    if options.rate is None:
        raise TraceError("a synthetic trace needs --rate R (requests per second)")
    if options.lengths_from is None:
        if options.prompt_tokens is None or options.output_tokens is None:
            raise TraceError(
                "a synthetic trace needs its lengths: --prompt-tokens and --output-tokens, "
                "or --lengths-from FILE"
            )
        rows = [_Row(str(i), 0, 0.0, options.prompt_tokens, options.output_tokens, None, ())
                for i in range(n)]
        parsed = _Parsed(rows, False, n, [])
    else:
        # Lengths come from any trace file; its arrivals are ignored. Sampled with replacement.
        pool, pool_fmt, data = _load_file(Path(options.lengths_from), None, options)
        hasher.update(data)
        if not pool.rows:
            raise TraceError("no usable rows to sample lengths from", path=options.lengths_from)
        picks = _rng(options.seed, _STREAM_LENGTHS).integers(0, len(pool.rows), size=n)
        rows = [
            pool.rows[int(k)]._replace(request_id=str(i), arrival_s=0.0, priority=None)
            for i, k in enumerate(picks)
        ]
        parsed = dataclasses.replace(pool, rows=rows, timed=False)
        report.notes.append(
            f"lengths sampled with replacement from {options.lengths_from} ({pool_fmt}, "
            f"{len(pool.rows)} rows), seed {options.seed}"
        )
    return parsed, f"synthetic:{arrival}", "synthetic", arrival


def _report_parse(parsed: _Parsed, label: str, report: _Report) -> None:
    report.counts["num_source_rows"] = parsed.num_source_rows
    report.counts["skipped_bad_rows"] = len(parsed.skipped)
    report.counts["dropped_failed"] = parsed.num_failed
    report.counts["num_reordered"] = parsed.num_reordered
    if parsed.skipped:
        report.notes.append(
            f"skipped {len(parsed.skipped)} malformed rows (--skip-bad-rows); first: "
            f"{parsed.skipped[0]}"
        )
    if parsed.num_failed:
        report.notes.append(
            f"dropped {parsed.num_failed} failed requests (0 response tokens in the trace)"
        )
    if parsed.num_reordered:
        report.notes.append(
            f"{parsed.num_reordered} rows arrived before the row above them; requests were "
            "sorted by arrival (ties keep file order)"
        )
    if len(parsed.models) > 1:
        mix = ", ".join(f"{m or '(empty)'} {c}" for m, c in parsed.models.most_common())
        report.notes.append(f"models in the trace: {mix}")


def _window(rows: list[_Row], options: TraceOptions, label: str, report: _Report) -> list[_Row]:
    if options.start_s is None and options.end_s is None:
        return rows
    start = options.start_s or 0.0
    end = math.inf if options.end_s is None else options.end_s
    kept = [r._replace(arrival_s=r.arrival_s - start) for r in rows if start <= r.arrival_s < end]
    report.counts["outside_window"] = len(rows) - len(kept)
    if not kept:
        span = rows[-1].arrival_s if rows else 0.0
        raise TraceError(
            f"no requests in the window [{start:g} s, {end:g} s); the trace spans 0 to "
            f"{span:.1f} s",
            path=label,
        )
    report.notes.append(
        f"window [{start:g} s, {end:g} s) kept {len(kept)} of {len(rows)} requests; "
        f"arrivals measured from {start:g} s"
    )
    return kept


def _override_lengths(rows: list[_Row], options: TraceOptions, report: _Report) -> list[_Row]:
    if options.prompt_tokens is not None:
        if any(r.prefix_hash_ids for r in rows):
            report.notes.append("prefix hashes dropped: --prompt-tokens replaced the prompts")
        rows = [r._replace(num_prompt_tokens=options.prompt_tokens, prefix_hash_ids=())
                for r in rows]
        report.notes.append(f"every prompt set to {options.prompt_tokens} tokens")
    if options.output_tokens is not None:
        rows = [r._replace(num_output_tokens=options.output_tokens) for r in rows]
        report.notes.append(f"every output set to {options.output_tokens} tokens")
    return rows


def _fit_model_len(
    rows: list[_Row], options: TraceOptions, parsed: _Parsed, label: str, report: _Report
) -> list[_Row]:
    """A request fits when prompt + output <= max_model_len (what vLLM's server accepts)."""
    max_len = options.max_model_len
    if max_len is None:
        return rows
    too_long = [r for r in rows if r.num_prompt_tokens + r.num_output_tokens > max_len]
    if not too_long:
        return rows
    if options.on_too_long == "error":
        first = too_long[0]
        where = f"{label}:{first.line}" if first.line else label
        raise TraceError(
            f"{len(too_long)} of {len(rows)} requests need more than --max-model-len {max_len} "
            f"tokens (first: {where}, {first.num_prompt_tokens} prompt + "
            f"{first.num_output_tokens} output); --on-too-long drop|clip handles them"
        )
    if options.on_too_long == "drop":
        report.counts["dropped_too_long"] = len(too_long)
        report.notes.append(
            f"dropped {len(too_long)} requests longer than max_model_len {max_len}"
        )
        return [r for r in rows if r.num_prompt_tokens + r.num_output_tokens <= max_len]
    # clip: keep the output (it is what is measured) and truncate the prompt from the left,
    # as a chat client drops its oldest context; only an output that alone does not fit is cut.
    block = parsed.hash_block_tokens
    clipped: list[_Row] = []
    for r in rows:
        if r.num_prompt_tokens + r.num_output_tokens > max_len:
            output = min(r.num_output_tokens, max_len - 1)
            prompt = min(r.num_prompt_tokens, max_len - output)
            hashes = r.prefix_hash_ids
            if hashes and block:
                hashes = hashes[: -(-prompt // block)]
            r = r._replace(num_prompt_tokens=prompt, num_output_tokens=output,
                           prefix_hash_ids=hashes)
        clipped.append(r)
    report.counts["clipped_too_long"] = len(too_long)
    report.notes.append(
        f"clipped {len(too_long)} requests to max_model_len {max_len} (prompt truncated first)"
    )
    return clipped


def _limit(rows: list[_Row], options: TraceOptions, report: _Report) -> list[_Row]:
    if options.limit is None or len(rows) <= options.limit:
        return rows
    report.counts["beyond_limit"] = len(rows) - options.limit
    report.notes.append(f"kept the first {options.limit} of {len(rows)} requests (--limit)")
    return rows[: options.limit]


def _arrivals(
    rows: list[_Row],
    options: TraceOptions,
    arrival: str | None,
    timed: bool,
    label: str,
    report: _Report,
) -> list[_Row]:
    if arrival is None and options.time_scale is None and options.rate is None:
        return rows  # the trace's own timestamps, as they are
    times = np.array([r.arrival_s for r in rows], dtype=float)
    if arrival is None:  # the trace's own timestamps, rescaled
        if options.time_scale is not None and options.time_scale != 1.0:
            times = times * options.time_scale
            report.notes.append(f"arrival times multiplied by {options.time_scale:g}")
        elif options.rate is not None:
            if math.isinf(options.rate):
                times = np.zeros_like(times)
                report.notes.append("rate inf: every request arrives at 0 s")
            else:
                span = float(times[-1] - times[0]) if len(times) else 0.0
                if len(times) < 2 or span <= 0:
                    raise TraceError(
                        "--rate needs at least two distinct arrival times to rescale",
                        path=label,
                    )
                factor = (len(times) - 1) / (options.rate * span)
                times = times * factor
                report.notes.append(
                    f"arrival times multiplied by {factor:.6g} for a mean rate of "
                    f"{options.rate:g} req/s"
                )
    else:
        if options.time_scale is not None:
            raise TraceError(
                f"--time-scale rescales trace timestamps, but arrivals of {label} are "
                "synthesized; --rate sets their rate"
            )
        rate = options.rate
        if rate is None:
            span = rows[-1].arrival_s - rows[0].arrival_s
            if not timed or len(rows) < 2 or span <= 0:
                why = "has no timestamps" if not timed else "has no mean rate to keep"
                raise TraceError(
                    f"{label} {why}: --rate R (requests per second) sets the rate of its "
                    f"synthetic {arrival} arrivals"
                )
            rate = (len(rows) - 1) / span
        burstiness = 1.0 if options.burstiness is None else options.burstiness
        times = synthetic_arrivals_s(
            len(rows), rate, arrival, burstiness, _rng(options.seed, _STREAM_ARRIVALS)
        )
        shape = f", burstiness {burstiness:g}" if arrival == "gamma" else ""
        report.notes.append(
            f"arrivals synthesized: {arrival} at {rate:g} req/s{shape}, seed {options.seed}"
        )
    return [r._replace(arrival_s=float(t)) for r, t in zip(rows, times, strict=True)]


def _priorities(rows: list[_Row], options: TraceOptions, report: _Report) -> list[_Row]:
    has_column = any(r.priority is not None for r in rows)
    if has_column:
        if options.priority_fraction is not None:
            report.notes.append("priorities taken from the trace; --priority-fraction ignored")
        return rows
    if options.priority_fraction is None:
        return rows
    num_high = round(options.priority_fraction * len(rows))
    high = set(
        _rng(options.seed, _STREAM_PRIORITY).permutation(len(rows))[:num_high].tolist()
    )
    report.notes.append(
        f"{num_high} of {len(rows)} requests given priority 0 (high), the rest 1; "
        f"seed {options.seed}"
    )
    return [r._replace(priority=0 if i in high else 1) for i, r in enumerate(rows)]


# ---------------------------------------------------------------- description


def describe(trace: Trace) -> dict[str, Any]:
    """Summary figures of a trace (report header, ``batchlab trace info``).

    ``mean_rate_per_s`` is (N - 1) / (last - first arrival), None when undefined;
    ``interarrival_cv`` is std/mean of the gaps (1 is Poisson-like). Percentiles are numpy's
    linear interpolation.
    """
    n = len(trace.requests)
    arrivals = np.array([r.arrival_s for r in trace.requests], dtype=float)
    prompts = np.array([r.num_prompt_tokens for r in trace.requests], dtype=float)
    outputs = np.array([r.num_output_tokens for r in trace.requests], dtype=float)
    span = float(arrivals[-1] - arrivals[0]) if n else 0.0
    gaps = np.diff(arrivals)
    cv = float(gaps.std() / gaps.mean()) if len(gaps) and gaps.mean() > 0 else None

    def stats(name: str, values: np.ndarray) -> dict[str, float | None]:
        if not len(values):
            return {f"{name}_mean": None, f"{name}_p50": None, f"{name}_p99": None,
                    f"{name}_max": None}
        return {
            f"{name}_mean": float(values.mean()),
            f"{name}_p50": float(np.percentile(values, 50)),
            f"{name}_p99": float(np.percentile(values, 99)),
            f"{name}_max": float(values.max()),
        }

    return {
        "source": trace.source,
        "format": trace.format,
        "digest": trace.digest,
        "num_requests": n,
        "span_s": span,
        "mean_rate_per_s": (n - 1) / span if n > 1 and span > 0 else None,
        "interarrival_cv": cv,
        **stats("prompt_tokens", prompts),
        **stats("output_tokens", outputs),
        "num_with_priority": sum(1 for r in trace.requests if r.priority is not None),
        "num_high_priority": sum(1 for r in trace.requests if r.priority == 0),
        "num_with_prefix_hashes": sum(1 for r in trace.requests if r.prefix_hash_ids),
        "counts": dict(trace.counts),
        "notes": list(trace.notes),
    }

