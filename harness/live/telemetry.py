"""Engine telemetry during a live run: scrape on a timer, write ``telemetry.parquet``.

The engine's own view of the run (how many requests it runs and queues, KV use, preemptions,
tokens per step) next to the client's request timeline. Each adapter says where its engine
keeps these signals (``adapters.base.TelemetrySpec``); this module reads them under canonical
names. A signal the engine does not export is *missing* (null, and named in the ``missing``
column), never zero.

Columns of ``telemetry.parquet`` (one row per scrape):

    t_s                 seconds since the scraper started (the replay starts it with the run)
    num_running         requests in the running batch (gauge)
    num_waiting         requests queued (gauge)
    kv_usage            KV-cache blocks in use, 0..1 (gauge)
    num_preemptions     preemptions since the previous scrape (counter increase)
    num_steps           engine steps since the previous scrape (histogram count increase)
    num_batched_tokens  tokens of those steps (histogram sum increase), as the engine counts
                        them: vLLM 0.32 (``vllm:iteration_tokens_total``) counts a prompt's
                        computed (uncached) tokens at the step that finishes it, plus the
                        tokens generated; the served reference counts the tokens each step
                        scheduled (each prefill chunk at its own step, a prompt's first token
                        not again), so a run's sum is lower by one token per request
    batch_tokens_mean   num_batched_tokens / num_steps (NaN when no step ran)
    prefix_cache_queries  prompt tokens looked up in the prefix cache at admission since the
                        previous scrape (counter increase; vLLM's, re-admissions not counted)
    prefix_cache_hits   of those, the tokens found (counter increase)
    missing             comma-separated canonical signals absent from this scrape
    scrape_error        why the scrape failed (then every signal is null), else null

Counter increases are taken per series (sample name and labels), then summed; a decrease is
a restart (the increase is the new value). The baseline is a read before the run's t0
(``TelemetryScraper.baseline``), not written as a row; when it had none of the engine's metrics,
the first scrape with them is the baseline (its increases are 0). Non-finite values (NaN, +-Inf)
are missing. A line the parser refuses is skipped, not the scrape (``parse_lines``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from prometheus_client.parser import text_string_to_metric_families

from adapters.base import CANONICAL_SIGNALS, MetricSource, TelemetrySpec
from harness.columns import numbers
from harness.results import write_parquet_atomic

log = logging.getLogger(__name__)

TELEMETRY_FILE = "telemetry.parquet"
DEFAULT_INTERVAL_S = 0.25
# after the run's end, scrapes while the engine's counters still rise (TelemetryScraper._settle)
SETTLE_SCRAPES = 8
SETTLE_INTERVAL_S = 0.25
BASELINE_TIMEOUT_S = 5.0  # the read before t0 (TelemetryScraper.baseline) waits no longer

COLUMNS = (
    "t_s",
    "num_running",
    "num_waiting",
    "kv_usage",
    "num_preemptions",
    "num_steps",
    "num_batched_tokens",
    "batch_tokens_mean",
    "prefix_cache_queries",
    "prefix_cache_hits",
)
# Columns that are counters' increases since the last scrape.
_COUNTED = ("num_preemptions", "num_steps", "num_batched_tokens", "prefix_cache_queries",
            "prefix_cache_hits")
# Output columns each canonical signal fills.
_SIGNAL_COLUMNS = {
    "num_running": ("num_running",),
    "num_waiting": ("num_waiting",),
    "kv_usage": ("kv_usage",),
    "num_preemptions": ("num_preemptions",),
    "batch_tokens": ("num_steps", "num_batched_tokens", "batch_tokens_mean"),
    "prefix_cache_queries": ("prefix_cache_queries",),
    "prefix_cache_hits": ("prefix_cache_hits",),
}


def _counted(out_dir: Path, column: str) -> int | None:
    """A counter's increases over a live run (``telemetry.parquet``'s ``column``), summed; None
    when there is no telemetry, no such column (written before it existed), or the engine
    exported no such counter (every scrape's value null)."""
    try:
        with pq.ParquetFile(out_dir / TELEMETRY_FILE) as file:
            if column not in file.schema_arrow.names:
                return None
            values = np.asarray(numbers(file.read(columns=[column]).column(0)), dtype=float)
    except (OSError, KeyError, ValueError, pa.ArrowInvalid):
        return None
    values = values[np.isfinite(values)]
    return round(float(values.sum())) if values.size else None


def engine_preemptions(out_dir: Path) -> int | None:
    """The preemptions the engine counted over a live run: the increases of its counter in
    ``telemetry.parquet``, summed. None when there is no telemetry, or the engine exported no
    preemption counter (then how many there were is not known: a client cannot see them)."""
    return _counted(out_dir, "num_preemptions")


def engine_prefix_cache(out_dir: Path) -> dict[str, Any] | None:
    """The prefix-cache lookups and hits the engine counted over a live run, in prompt tokens
    (the increases of its counters in ``telemetry.parquet``, summed), as a simulated run's
    ``prefix_cache`` has them; None when there is no telemetry or the engine exported no such
    counters. Re-admissions after a preemption are not in them (vLLM counts them apart and
    exports them not), nor is which requests carried prefix identities."""
    queries, hits = (_counted(out_dir, c) for c in ("prefix_cache_queries", "prefix_cache_hits"))
    if queries is None or hits is None:
        return None
    return {"queries_tokens": queries, "hits_tokens": hits,
            "hit_rate": hits / queries if queries else None,
            "preempted_queries_tokens": None, "preempted_hits_tokens": None,
            "preempted_hit_rate": None, "num_requests_with_prefix_ids": None,
            "from": "the engine's telemetry (its prefix-cache counters)"}


def unanswered_tail(out_dir: Path) -> tuple[int, float | None]:
    """The scrapes of ``telemetry.parquet`` that failed after its last answered one (an
    engine that died or hung), and the instant of that last answered scrape (None when none
    was answered): (0, t) when the last scrape was answered, or there is no telemetry."""
    try:
        with pq.ParquetFile(out_dir / TELEMETRY_FILE) as file:
            table = file.read(columns=["t_s", "scrape_error"])
    except (OSError, KeyError, ValueError, pa.ArrowInvalid):
        return 0, None
    errors = table.column("scrape_error").to_pylist()
    times = table.column("t_s").to_pylist()
    answered = [i for i, e in enumerate(errors) if e is None]
    if not answered:
        return len(errors), None
    last = answered[-1]
    return len(errors) - 1 - last, float(times[last])


@dataclass(frozen=True, slots=True)
class Reading:
    """One scrape, in canonical columns. ``values`` maps column -> value or None (missing)."""

    values: dict[str, float | None]
    missing: tuple[str, ...] = ()  # canonical signals absent from this scrape
    error: str | None = None  # the scrape failed as a whole


class TelemetrySource(Protocol):
    """Where readings come from: a live endpoint, or a fake in tests."""

    async def read(self) -> Reading: ...


# ---------------------------------------------------------------- Prometheus


LabelSet = tuple[tuple[str, str], ...]  # a sample's labels, sorted: which series it is


class Values(list[float]):
    """A sample name's values, one per label set in scrape order; ``label_sets[i]`` names the
    series of ``self[i]`` (counter increases are taken per series, then summed)."""

    def __init__(self) -> None:
        super().__init__()
        self.label_sets: list[LabelSet] = []

    def add(self, labels: Mapping[str, str], value: float) -> None:
        self.append(value)
        self.label_sets.append(tuple(sorted(labels.items())))


Samples = dict[str, list[float]]  # sample name -> one value per label set (``Values``)


@dataclass(frozen=True, slots=True)
class Exposition:
    """One scrape's samples, and the lines the parser refused (skipped, not fatal)."""

    samples: Samples
    num_skipped_lines: int = 0


# what prometheus_client's parser raises on a line it cannot read
_PARSE_ERRORS = (ValueError, IndexError, KeyError)


def parse_exposition(text: str) -> Samples:
    """Prometheus text -> sample name -> values (one per label set); ``_created`` dropped.
    A line the parser refuses is skipped (``parse_lines``), never the whole scrape."""
    return parse_lines(text).samples


def parse_lines(text: str) -> Exposition:
    """``parse_exposition``, saying how many lines were skipped. The text is parsed whole;
    where that fails, family by family, and in a family that fails, line by line under the
    family's ``# HELP``/``# TYPE`` lines: one malformed line of a family nobody reads (a new
    exporter's label, a UTF-8 name) costs that line, not every signal of the scrape."""
    samples: Samples = {}
    num_skipped = 0
    lines = text.splitlines()
    whole = _parsed(lines)  # nearly always
    for block in [lines] if whole is not None else _family_blocks(lines):
        families = whole if whole is not None else _parsed(block)
        if families is None:
            header = [line for line in block if line.startswith("#")]
            families = []
            for line in block:
                if line.startswith("#") or not line.strip():
                    continue
                one = _parsed([*header, line])
                if one is None:
                    num_skipped += 1
                else:
                    families += one
        for family in families:
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                values = samples.setdefault(sample.name, Values())
                assert isinstance(values, Values)
                values.add(sample.labels, float(sample.value))
    return Exposition(samples, num_skipped)


def _family_blocks(lines: Sequence[str]) -> list[list[str]]:
    """``lines`` cut where a ``# HELP`` or ``# TYPE`` line names another family."""
    blocks: list[list[str]] = [[]]
    name = None
    for line in lines:
        parts = line.split(None, 3)
        if len(parts) >= 3 and parts[0] == "#" and parts[1] in ("HELP", "TYPE"):
            if parts[2] != name and blocks[-1]:
                blocks.append([])
            name = parts[2]
        blocks[-1].append(line)
    return blocks


def _parsed(lines: Sequence[str]) -> list[Any] | None:
    """The metric families of ``lines``, or None when the parser refuses any of them."""
    try:
        return list(text_string_to_metric_families("\n".join(lines) + "\n"))
    except _PARSE_ERRORS:
        return None


def _spellings(name: str, counter: bool) -> tuple[str, ...]:
    """The sample names a metric may have: a counter's also with and without ``_total``
    (prometheus_client's parser appends ``_total`` to a sample of a family typed ``counter``
    whose name lacks it; an untyped line keeps its name)."""
    if not counter:
        return (name,)
    bare = name.removesuffix("_total")
    return tuple(dict.fromkeys((name, bare + "_total", bare)))


def _first(samples: Samples, names: Sequence[str], suffix: str = "",
           counter: bool = False) -> tuple[str, list[float]] | None:
    """The sample name and values of the first alias present (newest name first)."""
    for name in names:
        for spelling in _spellings(name, counter):
            values = samples.get(spelling + suffix)
            if values:
                return spelling + suffix, values
    return None


def _series(name: str, values: list[float]) -> dict[tuple[str, LabelSet], float]:
    """Each series' value, by sample name and label set (a plain list: by position)."""
    if isinstance(values, Values):
        keys = values.label_sets
    else:
        keys = [(("", str(i)),) for i in range(len(values))]
    return {(name, labels): value for labels, value in zip(keys, values, strict=True)}


def _finite(values: Iterable[float]) -> bool:
    return all(math.isfinite(v) for v in values)


def _reduce(values: list[float], how: str) -> float:
    return sum(values) / len(values) if how == "mean" else sum(values)


class CanonicalReader:
    """Turns successive Prometheus scrapes into canonical readings (keeps counter baselines)."""

    def __init__(self, spec: TelemetrySpec) -> None:
        self.spec = spec
        # counter key -> series (sample name, labels) -> its last value
        self._previous: dict[str, dict[tuple[str, LabelSet], float]] = {}
        self._num_readings = 0  # scrapes answered with any of the engine's metrics so far

    def _increase(self, key: str, series: dict[tuple[str, LabelSet], float]) -> float:
        """The counter's increase since the previous scrape, taken per series then summed: a
        series that dropped restarted (its increase is its new value), one that disappeared
        adds nothing (two data-parallel engines, one restarted or gone)."""
        previous = self._previous.get(key, {})
        self._previous[key] = series
        total = 0.0
        for name, value in series.items():
            before = previous.get(name)
            if before is None:
                # in the first answered scrape: the baseline (what the engine counted before
                # the run); in a later one, a series the engine made at its first increment,
                # as Prometheus clients do for labelled series: it rose from 0 during the run
                total += 0.0 if self._num_readings == 0 else value
            else:
                total += value - before if value >= before else value  # a decrease: restarted
        return total

    def reading(self, samples: Samples) -> Reading:
        values: dict[str, float | None] = dict.fromkeys(COLUMNS[1:])
        missing: list[str] = []
        for signal in CANONICAL_SIGNALS:
            source = self.spec.source(signal)
            got = None if source is None else self._signal(signal, source, samples)
            if got is None:
                missing.append(signal)
            else:
                values.update(got)
        if len(missing) < len(CANONICAL_SIGNALS):  # the engine's metrics were there: a baseline
            self._num_readings += 1
        return Reading(values, tuple(missing))

    def _signal(
        self, signal: str, src: MetricSource, samples: Samples
    ) -> dict[str, float | None] | None:
        """The signal's columns, or None (missing): absent, or not finite (NaN, +-Inf)."""
        if src.kind == "histogram":
            sums = _first(samples, src.names, "_sum")
            counts = _first(samples, src.names, "_count")
            if sums is None or counts is None or not _finite([*sums[1], *counts[1]]):
                return None
            tokens = self._increase(signal + ":sum", _series(*sums))
            steps = self._increase(signal + ":count", _series(*counts))
            mean = tokens / steps if steps > 0 else math.nan
            return {"num_steps": steps, "num_batched_tokens": tokens, "batch_tokens_mean": mean}
        found = _first(samples, src.names, counter=src.kind == "counter")
        if found is None or not _finite(found[1]):
            return None
        if src.kind == "counter":
            value = self._increase(signal, _series(*found))
        else:
            value = _reduce(found[1], src.reduce)
        if src.kind == "ratio":
            denominator = _first(samples, src.denominator)
            if denominator is None:
                return None
            total = _reduce(denominator[1], src.reduce)
            if not total > 0 or not math.isfinite(total):
                return None  # an engine that reports a zero capacity has not told us the usage
            value = value / total
        (column,) = _SIGNAL_COLUMNS[signal]
        return {column: value}


Fetch = Callable[[], Awaitable[str]]


class PrometheusSource:
    """Reads a Prometheus ``/metrics`` endpoint (or any ``fetch`` returning exposition text)."""

    def __init__(
        self,
        spec: TelemetrySpec,
        url: str | None = None,
        *,
        fetch: Fetch | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if fetch is None and url is None:
            raise ValueError("PrometheusSource needs a url or a fetch function")
        self.url = url
        self._reader = CanonicalReader(spec)
        self._client = client
        self._fetch = fetch or self._http_fetch
        self.num_skipped_lines = 0  # lines of /metrics the parser refused, over every scrape

    def prepare(self) -> None:
        """Build the HTTP client now, before the run's t0: building one loads the CA bundle
        (about 0.1 s), which inside the run would hold up the replay's first sends."""
        if self._client is None and self._fetch == self._http_fetch:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(5.0))

    async def _http_fetch(self) -> str:
        assert self.url is not None
        self.prepare()
        assert self._client is not None
        response = await self._client.get(self.url)
        if response.status_code != 200:
            raise httpx.HTTPStatusError(
                f"HTTP {response.status_code}", request=response.request, response=response
            )
        return response.text

    async def read(self) -> Reading:
        try:
            text = await self._fetch()
            exposition = parse_lines(text)
        except (httpx.HTTPError, OSError, ValueError) as exc:
            return _failed(f"{type(exc).__name__}: {exc}")
        if exposition.num_skipped_lines and not self.num_skipped_lines:
            log.warning("%s: %d line(s) the Prometheus parser refused were skipped",
                        self.url or "telemetry", exposition.num_skipped_lines)
        self.num_skipped_lines += exposition.num_skipped_lines
        return self._reader.reading(exposition.samples)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


def _failed(error: str) -> Reading:
    return Reading(dict.fromkeys(COLUMNS[1:]), tuple(CANONICAL_SIGNALS), error)


# ---------------------------------------------------------------- TensorRT-LLM JSON /metrics


def trtllm_iterations_reading(entries: Sequence[Mapping[str, Any]]) -> Reading:
    """TensorRT-LLM's JSON ``/metrics``: the per-iteration stats since the previous poll.

    The endpoint drains its queue on every read, so each poll sees only new iterations: gauges
    come from the last one, counts are summed over all of them. No iterations (idle, or
    ``enable_iter_perf_stats`` off) leaves the gauges missing.
    """
    values: dict[str, float | None] = dict.fromkeys(COLUMNS[1:])
    if not entries:
        return Reading(values, CANONICAL_SIGNALS)
    last = entries[-1]
    missing: list[str] = []
    for column, key in (("num_running", "numActiveRequests"), ("num_waiting", "numQueuedRequests")):
        if isinstance(last.get(key), int | float):
            values[column] = float(last[key])
        else:
            missing.append(column)
    kv = last.get("kvCacheStats") or {}
    if kv.get("maxNumBlocks"):
        values["kv_usage"] = float(kv.get("usedNumBlocks", 0)) / float(kv["maxNumBlocks"])
    else:
        missing.append("kv_usage")
    batching = [e.get("inflightBatchingStats") or {} for e in entries]
    if all("numPausedRequests" in b for b in batching):
        values["num_preemptions"] = float(sum(b["numPausedRequests"] for b in batching))
    else:
        missing.append("num_preemptions")
    if all("numCtxTokens" in b and "numGenRequests" in b for b in batching):
        # one token per generating request plus the context tokens of the step
        tokens = float(sum(b["numCtxTokens"] + b["numGenRequests"] for b in batching))
        values.update(
            num_steps=float(len(entries)),
            num_batched_tokens=tokens,
            batch_tokens_mean=tokens / len(entries),
        )
    else:
        missing.append("batch_tokens")
    # its kvCacheStats give block reuse, not prompt tokens looked up and found
    missing += ["prefix_cache_queries", "prefix_cache_hits"]
    return Reading(values, tuple(missing))


class TrtllmJsonSource:
    """Polls TensorRT-LLM's draining JSON ``/metrics``. Its first read (the scraper's baseline,
    before t0) drains what the engine queued before the run, which is discarded."""

    def __init__(self, url: str, *, client: httpx.AsyncClient | None = None) -> None:
        self.url = url
        self._client = client

    def prepare(self) -> None:
        """Build the HTTP client before the run's t0 (see ``PrometheusSource.prepare``)."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(5.0))

    async def read(self) -> Reading:
        self.prepare()
        assert self._client is not None
        try:
            response = await self._client.get(self.url)
            response.raise_for_status()
            entries = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            return _failed(f"{type(exc).__name__}: {exc}")
        if not isinstance(entries, list):
            return _failed("not a JSON list of iteration stats")
        return trtllm_iterations_reading(entries)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


class NoTelemetry:
    """An engine with no metrics endpoint (e.g. ``transformers serve``): all missing."""

    async def read(self) -> Reading:
        return Reading(dict.fromkeys(COLUMNS[1:]), tuple(CANONICAL_SIGNALS))


class FakeSource:
    """In-memory source for tests: yields exposition texts (or ready readings) in order.

    After the last item the last one repeats, as a quiet engine would.
    """

    def __init__(self, items: Iterable[str | Reading], spec: TelemetrySpec | None = None) -> None:
        self._items = list(items)
        self._reader = CanonicalReader(spec or TelemetrySpec())
        self._index = 0
        self.num_reads = 0

    async def read(self) -> Reading:
        item = self._items[min(self._index, len(self._items) - 1)]
        self._index += 1
        self.num_reads += 1
        if isinstance(item, Reading):
            return item
        return self._reader.reading(parse_exposition(item))


def source_for(spec: TelemetrySpec, base_url: str) -> TelemetrySource:
    """The source an adapter's spec asks for, at a server's base URL."""
    url = base_url.rstrip("/") + spec.path
    if spec.format == "none":
        return NoTelemetry()
    if spec.format == "trtllm_json":
        return TrtllmJsonSource(url)
    return PrometheusSource(spec, url)


# ---------------------------------------------------------------- the scraper


@dataclass
class TelemetryScraper:
    """Scrapes ``source`` every ``interval_s`` until ``stop`` is set; writes the parquet file.

    Satisfies the replay client's telemetry protocol: ``async def run(stop)``. The file is
    written when ``run`` ends, however it ends (stop, cancellation, Ctrl-C).
    """

    source: TelemetrySource
    out_path: Path | None = None
    interval_s: float = DEFAULT_INTERVAL_S
    clock_ns: Callable[[], int] = time.perf_counter_ns
    origin_ns: int | None = None  # t_s = 0; default: when run() starts
    rows: list[dict[str, Any]] = field(default_factory=list)
    run_id: str | None = None  # the run folder's, stamped into the parquet file's metadata

    def prepare(self) -> None:
        """What the source can set up before the run's t0 (its HTTP client)."""
        prepare = getattr(self.source, "prepare", None)
        if prepare is not None:
            prepare()

    async def baseline(self) -> None:
        """One read before the run's t0, not written as a row (the replay calls it after
        ``prepare``): the counters' baseline (what the engine counted before the run), taken
        before the first request rather than racing it, and for TensorRT-LLM's draining JSON
        endpoint the iterations queued before the run, drained and discarded. A read without
        the engine's metrics is no baseline: the first scrape with them is then."""
        try:
            async with asyncio.timeout(BASELINE_TIMEOUT_S):
                await self.source.read()
        except TimeoutError:
            pass
        except Exception:  # telemetry failing must not stop the run (as in ``run``)
            log.exception("telemetry baseline read failed")

    async def scrape_once(self) -> dict[str, Any]:
        reading = await self.source.read()
        if self.origin_ns is None:
            self.origin_ns = self.clock_ns()
        row: dict[str, Any] = {"t_s": (self.clock_ns() - self.origin_ns) / 1e9}
        row.update(reading.values)
        row["missing"] = ",".join(reading.missing)
        row["scrape_error"] = reading.error
        self.rows.append(row)
        return row

    async def run(self, stop: asyncio.Event) -> None:
        if self.origin_ns is None:
            self.origin_ns = self.clock_ns()
        try:
            while True:
                tick_ns = self.clock_ns()
                row = await self.scrape_once()
                if stop.is_set():
                    await self._settle(row)
                    break
                # keep the period: sleep what is left of the interval after the scrape
                left_s = self.interval_s - (self.clock_ns() - tick_ns) / 1e9
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=max(0.0, left_s))
                if stop.is_set():
                    await self._settle(await self.scrape_once())  # the state at the end
                    break
        finally:
            if self.out_path is not None:
                self.write(self.out_path)
            aclose = getattr(self.source, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()

    async def _settle(self, row: Mapping[str, Any]) -> None:
        """After the run's last scrape (``row``), scrape once more, then again while the
        engine's counters still rise, up to ``SETTLE_SCRAPES`` times in all: an engine may
        publish a step's stats after its tokens were streamed (vLLM's API server gets them
        from the engine core, behind the streams), so the last steps of a run can reach
        /metrics after its end. Not after a scrape that failed (an engine gone)."""
        for i in range(SETTLE_SCRAPES):
            if row.get("scrape_error") is not None:
                return
            if i > 0 and not any((row.get(c) or 0) > 0 for c in _COUNTED):
                return
            await asyncio.sleep(min(self.interval_s, SETTLE_INTERVAL_S))
            row = await self.scrape_once()

    def table(self) -> pa.Table:
        return telemetry_table(self.rows)

    def write(self, path: Path) -> None:
        write_parquet_atomic(self.table(), Path(path), run_id=self.run_id)

    def missing_signals(self) -> list[str]:
        """Signals missing from every successful scrape (what the engine does not export)."""
        ok = [r for r in self.rows if r["scrape_error"] is None]
        if not ok:
            return list(CANONICAL_SIGNALS)
        sets = [set(filter(None, r["missing"].split(","))) for r in ok]
        return [s for s in CANONICAL_SIGNALS if all(s in m for m in sets)]


def telemetry_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    cols: dict[str, pa.Array] = {
        name: pa.array([r.get(name) for r in rows], pa.float64()) for name in COLUMNS
    }
    cols["missing"] = pa.array([r.get("missing", "") for r in rows], pa.string())
    cols["scrape_error"] = pa.array([r.get("scrape_error") for r in rows], pa.string())
    return pa.table(cols)
