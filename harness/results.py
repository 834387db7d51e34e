"""A run folder on disk: ``requests.parquet``, ``chunks.parquet``, ``summary.json``.

The same columns for simulated and live runs, so any folder can be re-summarised and re-reported
without re-running. Live runs add columns (``sent_s``, ``send_lag_s``, ...); readers accept both.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from harness import columns
from harness.metrics import ChunkTimes, Pace, Slo, chunk_times, pace, request_metric_columns
from harness.timeline import OneTokenChunks, RequestTimeline

REQUESTS_FILE = "requests.parquet"
CHUNKS_FILE = "chunks.parquet"
STEPS_FILE = "steps.parquet"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"  # a run's or a scenario's report (harness.report writes it)
PROBE_FILE = "probe.json"  # a capacity probe's outcome, beside its run (harness.capacity.probe)
SEARCH_FILE = "search.json"  # a capacity search, beside its probes (harness.capacity.run)
RECORDS_FILE = "records.jsonl"  # a live run's requests as they end (harness.live.recorder)
# the figures harness.report draws beside a report.md: a run's three, a sweep's two more
REPORT_PLOTS = ("latency_cdf.png", "engine_state.png", "throughput.png", "batch_size.png",
                "throughput_latency.png")
RUN_ID_KEY = b"batchlab.run_id"  # parquet schema metadata: the run that wrote the file


def _nan_if_none(x: float | None) -> float:
    return math.nan if x is None else x


def requests_table(timelines: Sequence[RequestTimeline], *, live: bool = False,
                   metrics: Mapping[str, np.ndarray] | None = None,
                   chunks: ChunkTimes | None = None) -> pa.Table:
    """One row per request (the columns ``docs/metrics.md`` lists). ``metrics``:
    ``request_metric_columns(timelines)``, ``chunks``: ``chunk_times(timelines)``, when the
    caller has them already."""
    if chunks is None:
        chunks = chunk_times(timelines)
    if metrics is None:
        metrics = request_metric_columns(timelines, chunks)
    first_token_s, _ = chunks.first_last()
    cols: dict[str, pa.Array] = {
        "request_id": columns.strings([tl.request_id for tl in timelines]),
        "arrival_s": columns.floats(tl.arrival_s for tl in timelines),
        "priority": columns.ints(tl.priority for tl in timelines),
        "num_prompt_tokens": columns.ints(tl.num_prompt_tokens for tl in timelines),
        "num_target_output_tokens": columns.ints(
            tl.num_target_output_tokens for tl in timelines),
        "num_output_tokens": columns.ints(tl.output_tokens for tl in timelines),
        "first_token_s": columns.floats(first_token_s),
        "finished_s": columns.floats(_nan_if_none(tl.finished_s) for tl in timelines),
        "ttft_s": columns.floats(metrics["ttft_s"]),
        "tpot_s": columns.floats(metrics["tpot_s"]),
        "e2e_s": columns.floats(metrics["e2e_s"]),
        "num_preemptions": columns.ints(tl.num_preemptions for tl in timelines),
        "error_kind": columns.strings([tl.error_kind for tl in timelines]),
        "error_message": columns.strings([tl.error_message for tl in timelines]),
        "finish_reason": columns.strings([tl.finish_reason for tl in timelines]),
        "token_count_source": columns.strings([tl.token_count_source for tl in timelines]),
    }
    if live:
        cols["sent_s"] = columns.floats(_nan_if_none(tl.sent_s) for tl in timelines)
        # NaN where the send instant is unknown (a row a dead worker never wrote), as the
        # summary leaves it out: not a request sent on time
        cols["send_lag_s"] = columns.floats(math.nan if tl.sent_s is None else tl.send_lag_s
                                            for tl in timelines)
        cols["scheduled_s"] = columns.floats(_nan_if_none(tl.scheduled_s) for tl in timelines)
        cols["num_chunks"] = columns.ints(len(tl.chunk_times_s) for tl in timelines)
        cols["reached_target_length"] = columns.bools(
            tl.reached_target_length for tl in timelines)
        cols["num_retries"] = columns.ints(tl.num_retries for tl in timelines)
    return columns.table(cols)


def chunks_table(timelines: Sequence[RequestTimeline], chunks: ChunkTimes | None = None
                 ) -> pa.Table:
    """One row per streamed chunk (one per token in simulation).

    Built column by column in C loops: millions of rows on a whole trace. ``chunks``:
    ``chunk_times(timelines)`` when the caller has it already."""
    lengths, times = chunks if chunks is not None else chunk_times(timelines)
    total = int(lengths.sum())
    # each row names its request through a dictionary of the request ids (read back as text)
    request_ids = columns.dictionary(np.repeat(np.arange(len(timelines), dtype=np.int32),
                                               lengths),
                                     columns.strings([tl.request_id for tl in timelines]))
    starts = np.cumsum(lengths) - lengths  # each request's first row
    index = np.arange(total, dtype=np.int64)
    index -= np.repeat(starts, lengths)
    return columns.table({
        "request_id": request_ids,
        "chunk_index": columns.ints(index),
        "t_s": columns.floats(times),
        "num_tokens": columns.ints(_chunk_tokens(timelines, lengths, total)),
    })


def _chunk_tokens(timelines: Sequence[RequestTimeline], lengths: np.ndarray,
                  total: int) -> np.ndarray:
    """Every chunk's token count; a timeline of one-token chunks is recognised by its type
    (``OneTokenChunks``: all of simulation) or in C (``tuple.count``), and costs no per-chunk
    Python work."""
    tokens = np.ones(total, dtype=np.int64)
    end = 0
    for tl, n in zip(timelines, lengths.tolist(), strict=True):
        end += n
        counts = tl.chunk_num_tokens
        if type(counts) is not OneTokenChunks and counts.count(1) != n:
            tokens[end - n:end] = np.asarray(counts, dtype=np.int64)
    return tokens


def write_parquet_atomic(table: pa.Table, path: Path, *, run_id: str | None = None) -> None:
    """Write to a temporary file then rename, so a reader never sees half a file. ``run_id``
    goes into the schema metadata (``batchlab.run_id``): the file says which run wrote it.

    A dictionary column (``columns.dictionary``) is written as Parquet's dictionary pages as
    it is, without hashing its millions of values again, and read back as its value type: the
    file stores no Arrow schema, only Parquet's (same types), and the metadata as the file's
    own key-value pairs (read back as the schema's metadata)."""
    metadata = dict(table.schema.metadata or {})
    if run_id is not None:
        metadata[RUN_ID_KEY] = run_id.encode()
    tmp = path.with_suffix(path.suffix + ".tmp")
    if any(pa.types.is_dictionary(f.type) for f in table.schema):
        with pq.ParquetWriter(tmp, table.schema, store_schema=False,
                              **_parquet_options(table.schema)) as writer:
            writer.write_table(table)
            if metadata:
                writer.add_key_value_metadata(metadata)
    else:
        pq.write_table(table.replace_schema_metadata(metadata or None), tmp,
                       **_parquet_options(table.schema))
    os.replace(tmp, path)


def _parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """Dictionaries for text columns only (numbers have too many distinct values for one: on a
    whole trace's millions of chunk rows that writes faster); pyarrow's default compression,
    snappy, which every Parquet reader takes. Column statistics (each row group's least and
    greatest value) for the other columns only: a request ID's are of no use to a reader, and
    over the chunk rows of a whole trace they cost a third of the file's writing time."""
    text = [f.name for f in schema
            if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
            or pa.types.is_dictionary(f.type)]
    return {"use_dictionary": text,
            "write_statistics": [f.name for f in schema if f.name not in text]}


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; {} when the file is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# Fields every summary.json has (harness.metrics.summarize): a JSON object with none of them is
# not a run's figures (another document written over the file).
SUMMARY_KEYS = ("num_requests", "num_completed", "num_failed")


def read_summary(path: Path) -> dict[str, Any]:
    """A run's ``summary.json`` read for its figures: {} when ``read_json_object`` finds no
    object, and also when the object has none of ``SUMMARY_KEYS``, which must read as no
    summary, not as a run that served nothing."""
    summary = read_json_object(path)
    return summary if any(key in summary for key in SUMMARY_KEYS) else {}


def write_json_atomic(obj: Any, path: Path) -> None:
    """Write ``obj`` as strict JSON (non-finite floats as null, see ``finite_json``) to a
    temporary file, then rename."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(dumps_json(obj) + "\n")
        os.replace(tmp, path)
    except BaseException:  # a full disk: no half-written file left beside the run's own
        tmp.unlink(missing_ok=True)
        raise


def dumps_json(obj: Any, *, indent: int | None = 2) -> str:
    """Strict JSON text of ``obj``: NaN and infinities become null (``finite_json``), so every
    file batchlab writes parses with any JSON reader; ``allow_nan=False`` guards the rest."""
    return json.dumps(finite_json(obj), indent=indent, sort_keys=False, allow_nan=False,
                      default=_json_default)


def finite_json(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN, inf, numpy's too) replaced by None, recursively
    through dicts, lists and tuples. The one place where "no value" becomes JSON null."""
    if isinstance(obj, float):  # np.float64 included
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite_json(v) for v in obj]
    if isinstance(obj, np.generic):
        return finite_json(obj.item())
    return obj


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def write_timelines(out_dir: Path, timelines: Sequence[RequestTimeline], *, live: bool,
                    run_id: str | None = None) -> None:
    write_tables(out_dir, timeline_tables(timelines, live=live), run_id=run_id)


def timeline_tables(timelines: Sequence[RequestTimeline], *, live: bool) -> dict[str, pa.Table]:
    """``requests.parquet`` and ``chunks.parquet`` of ``timelines``, by file name."""
    chunks = chunk_times(timelines)
    return {REQUESTS_FILE: requests_table(timelines, live=live, chunks=chunks),
            CHUNKS_FILE: chunks_table(timelines, chunks)}


def write_tables(out_dir: Path, tables: Mapping[str, pa.Table], *,
                 run_id: str | None = None) -> None:
    """Each table to ``out_dir / name`` (``write_parquet_atomic``), in order. The writing
    itself runs without Python's lock: a thread can write while the caller computes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        write_parquet_atomic(table, out_dir / name, run_id=run_id)


def _request_columns(run_dir: Path, wanted: Sequence[str]
                     ) -> tuple[dict[str, np.ndarray], np.ndarray] | None:
    """The numeric columns ``wanted`` of a run's ``requests.parquet`` (those it has) as float
    arrays, and whether each request completed (no ``error_kind``); None when the file cannot
    be read or lacks ``error_kind``. ``pq.ParquetFile`` and ``columns.numbers``, not
    ``read_table`` and ``to_numpy``: those import pandas and pyarrow.compute, most of a second
    that a simulate command would pay for the checks made of it."""
    try:
        with pq.ParquetFile(run_dir / REQUESTS_FILE) as file:
            names = set(file.schema_arrow.names)
            table = file.read(columns=[c for c in (*wanted, "error_kind") if c in names])
        values = {c: np.asarray(columns.numbers(table.column(c)), dtype=float)
                  for c in wanted if c in names}
        ok = np.array([kind is None for kind in table.column("error_kind").to_pylist()],
                      dtype=bool)
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowInvalid):
        return None
    return values, ok


def pace_of(run_dir: Path) -> Pace | None:
    """``harness.metrics.pace`` of a run folder, from its ``requests.parquet``; None when it
    cannot be made (see ``pace``; no readable file)."""
    read = _request_columns(run_dir, ("arrival_s", "first_token_s", "finished_s", "e2e_s"))
    if read is None or not {"arrival_s", "finished_s", "e2e_s"} <= set(read[0]):
        return None
    values, ok = read
    return pace(values["arrival_s"], values["finished_s"], values["e2e_s"], ok,
                values.get("first_token_s"))


def attainment_after_warm_up(run_dir: Path, slo: Slo) -> tuple[float, int] | None:
    """A closed loop's SLO attainment once its users are under way: over the requests sent
    after the first request completed, as the summary's over every request sent (a failed
    request counts as one that missed); and how many it leaves out: the users' first
    requests, all sent at the start, a burst no steady load of that many users makes
    (docs/metrics.md, "Capacity probes"). None when it cannot be made (no readable file, or
    no request sent after the first completed)."""
    wanted = ("arrival_s", "finished_s", "ttft_s", "tpot_s", "e2e_s")
    read = _request_columns(run_dir, wanted)
    if read is None or not set(wanted) <= set(read[0]):
        return None
    values, ok = read
    arrival, finished, ttft, tpot, e2e = (values[c] for c in wanted)
    done = ok & np.isfinite(finished)
    if not done.any():
        return None
    under_way = arrival >= float(finished[done].min())
    if not under_way.any():
        return None
    good = [bool(ok_i) and slo.met(a, b, c) for ok_i, a, b, c
            in zip(ok[under_way], ttft[under_way], tpot[under_way], e2e[under_way],
                   strict=True)]
    return sum(good) / len(good), int(np.count_nonzero(~under_way))


def run_pace(run_dir: Path, summary: Mapping[str, Any], manifest: Mapping[str, Any]
             ) -> Pace | None:
    """``pace_of`` a run that ran to its end with its requests arriving on their own (open
    loop): None for a closed loop (arrivals wait for completions), a run stopped early or one
    that did not finish (``manifest.json``'s status)."""
    if summary.get("stopped_early") or manifest.get("status") in ("failed", "interrupted",
                                                                    "running"):
        return None
    load, replay = manifest.get("load"), manifest.get("replay")
    modes = (manifest.get("mode"), load.get("mode") if isinstance(load, Mapping) else None,
             replay.get("mode") if isinstance(replay, Mapping) else None)
    if "closed" in modes:  # simulated runs say it under load, live ones at the top and replay
        return None
    return pace_of(run_dir)


def first_error(run_dir: Path) -> str | None:
    """The earliest failed request of a run folder, with the engine's own words (a counter
    such as ``{'http_error': 7}`` alone does not say that the prompt was refused, or why);
    None when none failed or the folder cannot be read."""
    try:
        failed = [tl for tl in read_timelines(run_dir) if not tl.ok]
    except (OSError, ValueError, pa.ArrowInvalid):
        return None
    if not failed:
        return None
    tl = min(failed, key=lambda t: (t.sent_s if t.sent_s is not None else t.arrival_s))
    message = " ".join((tl.error_message or "").split())[:300]
    return f"request {tl.request_id}: {tl.error_kind or 'not_finished'}" + (
        f": {message}" if message else "")


class NothingServed(RuntimeError):
    """A run completed none of its requests (every one rejected, refused or failed): its files
    are on disk, but it measured nothing (``nothing_served`` says why)."""


# The failures of a search or run that are conditions of the engine or the trace, not faults
# of batchlab: requests refused at any load (NothingServed), an engine that exited
# (adapters.process.EngineExited), stopped answering or was restarted under a run
# (harness.scenario.attached.ServerStoppedAnswering, ServerRestarted).
CONDITION_ERRORS = ("NothingServed", "EngineExited", "ServerStoppedAnswering",
                    "ServerRestarted")


def failure_reason(error: str) -> str:
    """A recorded failure ("Class: reason") as the console and the report say it: the reason
    alone for a condition of the engine or the trace (``CONDITION_ERRORS``), the class kept
    for anything else, what a bug report needs."""
    kind, sep, reason = error.partition(": ")
    return reason if sep and kind in CONDITION_ERRORS else error


def nothing_served(summary: Mapping[str, Any], run_dir: Path) -> str | None:
    """Why a run that sent requests served none of them, in words (how many failed, of which
    kinds, and the first one's error); None when any request completed."""
    sent = summary.get("num_requests") or 0
    if not sent or summary.get("num_completed"):
        return None
    failures = ", ".join(f"{k} {v}" for k, v in (summary.get("failures") or {}).items())
    first = first_error(run_dir)
    return (f"none of the {sent} requests completed ({failures or 'no failure recorded'})"
            + (f"; the first: {first}" if first else ""))


def parquet_run_id(path: Path) -> str | None:
    """The run that wrote a parquet file (its ``batchlab.run_id``); None when it names none.
    ValueError naming the file when it is no parquet file (truncated)."""
    try:
        metadata = pq.read_schema(path).metadata or {}
    except pa.ArrowInvalid as exc:
        raise ValueError(f"{path}: cannot be read as a parquet file ({exc})") from None
    value = metadata.get(RUN_ID_KEY)
    return value.decode() if value is not None else None


def _read_parquet(path: Path, columns: Sequence[str] = ()) -> pa.Table:
    """``path`` as a table with ``columns`` at least; ValueError naming the file otherwise
    (pyarrow's own messages do not)."""
    try:
        table = pq.read_table(path)
    except pa.ArrowInvalid as exc:
        raise ValueError(f"{path}: cannot be read as a parquet file ({exc})") from None
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: no column {', '.join(missing)}")
    return table


def read_timelines(run_dir: Path) -> list[RequestTimeline]:
    """Rebuild the timelines of a run folder from its parquet files. ValueError naming the
    file when one cannot be read as one (truncated, not parquet, a column missing)."""
    req = _read_parquet(run_dir / REQUESTS_FILE).to_pylist()
    chunks_path = run_dir / CHUNKS_FILE
    times: dict[str, list[float]] = {}
    counts: dict[str, list[int]] = {}
    if chunks_path.exists():
        ch = _read_parquet(chunks_path, ("request_id", "chunk_index", "t_s", "num_tokens"))
        ch = ch.sort_by([("request_id", "ascending"), ("chunk_index", "ascending")])
        rid_col = ch.column("request_id").to_pylist()
        t_col = ch.column("t_s").to_numpy()
        n_col = ch.column("num_tokens").to_numpy()
        for rid, t, n in zip(rid_col, t_col, n_col, strict=True):
            times.setdefault(rid, []).append(float(t))
            counts.setdefault(rid, []).append(int(n))
    out = []
    for row in req:
        rid = row["request_id"]
        finished = row["finished_s"]
        sent = row.get("sent_s")
        scheduled = row.get("scheduled_s")
        out.append(
            RequestTimeline(
                request_id=rid,
                arrival_s=row["arrival_s"],
                num_prompt_tokens=row["num_prompt_tokens"],
                num_target_output_tokens=row["num_target_output_tokens"],
                priority=row["priority"],
                sent_s=None if sent is None or math.isnan(sent) else sent,
                scheduled_s=None if scheduled is None or math.isnan(scheduled) else scheduled,
                chunk_times_s=tuple(times.get(rid, ())),
                chunk_num_tokens=tuple(counts.get(rid, ())),
                finished_s=None if finished is None or math.isnan(finished) else finished,
                num_output_tokens=row["num_output_tokens"],
                num_preemptions=row["num_preemptions"],
                error_kind=row["error_kind"],
                error_message=row.get("error_message") or "",
                finish_reason=row.get("finish_reason"),
                token_count_source=row.get("token_count_source") or "engine",
                num_retries=row.get("num_retries") or 0,
            )
        )
    return out
