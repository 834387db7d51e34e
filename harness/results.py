"""A run folder on disk: ``requests.parquet``, ``chunks.parquet``, ``summary.json``.

The same columns for simulated and live runs, so any folder can be re-summarised and re-reported
without re-running. Live runs add columns (``sent_s``, ``send_lag_s``, ...); readers accept both.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from harness.metrics import request_metrics
from harness.timeline import RequestTimeline

REQUESTS_FILE = "requests.parquet"
CHUNKS_FILE = "chunks.parquet"
STEPS_FILE = "steps.parquet"
SUMMARY_FILE = "summary.json"
RUN_ID_KEY = b"batchlab.run_id"  # parquet schema metadata: the run that wrote the file


def _nan_if_none(x: float | None) -> float:
    return math.nan if x is None else x


def requests_table(timelines: Sequence[RequestTimeline], *, live: bool = False) -> pa.Table:
    """One row per request (the columns ``docs/metrics.md`` lists)."""
    metrics = [request_metrics(tl) for tl in timelines]
    cols: dict[str, Any] = {
        "request_id": pa.array([tl.request_id for tl in timelines], pa.string()),
        "arrival_s": pa.array([tl.arrival_s for tl in timelines], pa.float64()),
        "priority": pa.array([tl.priority for tl in timelines], pa.int64()),
        "num_prompt_tokens": pa.array([tl.num_prompt_tokens for tl in timelines], pa.int64()),
        "num_target_output_tokens": pa.array(
            [tl.num_target_output_tokens for tl in timelines], pa.int64()
        ),
        "num_output_tokens": pa.array([tl.output_tokens for tl in timelines], pa.int64()),
        "first_token_s": pa.array([_nan_if_none(tl.first_token_s) for tl in timelines]),
        "finished_s": pa.array([_nan_if_none(tl.finished_s) for tl in timelines]),
        "ttft_s": pa.array([m.ttft_s for m in metrics], pa.float64()),
        "tpot_s": pa.array([m.tpot_s for m in metrics], pa.float64()),
        "e2e_s": pa.array([m.e2e_s for m in metrics], pa.float64()),
        "num_preemptions": pa.array([tl.num_preemptions for tl in timelines], pa.int64()),
        "error_kind": pa.array([tl.error_kind for tl in timelines], pa.string()),
        "error_message": pa.array([tl.error_message for tl in timelines], pa.string()),
        "finish_reason": pa.array([tl.finish_reason for tl in timelines], pa.string()),
        "token_count_source": pa.array([tl.token_count_source for tl in timelines], pa.string()),
    }
    if live:
        cols["sent_s"] = pa.array([_nan_if_none(tl.sent_s) for tl in timelines], pa.float64())
        cols["send_lag_s"] = pa.array([tl.send_lag_s for tl in timelines], pa.float64())
        cols["scheduled_s"] = pa.array(
            [_nan_if_none(tl.scheduled_s) for tl in timelines], pa.float64()
        )
        cols["num_chunks"] = pa.array([len(tl.chunk_times_s) for tl in timelines], pa.int64())
        cols["reached_target_length"] = pa.array(
            [tl.reached_target_length for tl in timelines], pa.bool_()
        )
        cols["num_retries"] = pa.array([tl.num_retries for tl in timelines], pa.int64())
    return pa.table(cols)


def chunks_table(timelines: Sequence[RequestTimeline]) -> pa.Table:
    """One row per streamed chunk (one per token in simulation)."""
    lengths = [len(tl.chunk_times_s) for tl in timelines]
    ids = np.repeat(np.arange(len(timelines)), lengths)
    request_ids = pa.array([tl.request_id for tl in timelines], pa.string()).take(pa.array(ids))
    times = np.fromiter(
        (t for tl in timelines for t in tl.chunk_times_s), dtype=np.float64, count=sum(lengths)
    )
    tokens = np.fromiter(
        (n for tl in timelines for n in tl.chunk_num_tokens), dtype=np.int64, count=sum(lengths)
    )
    index = np.concatenate([np.arange(n) for n in lengths]) if lengths else np.empty(0, np.int64)
    return pa.table(
        {
            "request_id": request_ids,
            "chunk_index": pa.array(index, pa.int64()),
            "t_s": pa.array(times, pa.float64()),
            "num_tokens": pa.array(tokens, pa.int64()),
        }
    )


def write_parquet_atomic(table: pa.Table, path: Path, *, run_id: str | None = None) -> None:
    """Write to a temporary file then rename, so a reader never sees half a file. ``run_id``
    goes into the schema metadata (``batchlab.run_id``): the file says which run wrote it."""
    if run_id is not None:
        table = table.replace_schema_metadata(
            {**(table.schema.metadata or {}), RUN_ID_KEY: run_id.encode()})
    tmp = path.with_suffix(path.suffix + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def write_json_atomic(obj: Any, path: Path) -> None:
    """Write ``obj`` as strict JSON (non-finite floats as null, see ``finite_json``) to a
    temporary file, then rename."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(dumps_json(obj) + "\n")
    os.replace(tmp, path)


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
    out_dir.mkdir(parents=True, exist_ok=True)
    write_parquet_atomic(requests_table(timelines, live=live), out_dir / REQUESTS_FILE,
                         run_id=run_id)
    write_parquet_atomic(chunks_table(timelines), out_dir / CHUNKS_FILE, run_id=run_id)


def read_timelines(run_dir: Path) -> list[RequestTimeline]:
    """Rebuild the timelines of a run folder from its parquet files."""
    req = pq.read_table(run_dir / REQUESTS_FILE).to_pylist()
    chunks_path = run_dir / CHUNKS_FILE
    times: dict[str, list[float]] = {}
    counts: dict[str, list[int]] = {}
    if chunks_path.exists():
        ch = pq.read_table(chunks_path).sort_by([("request_id", "ascending"),
                                                  ("chunk_index", "ascending")])
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
