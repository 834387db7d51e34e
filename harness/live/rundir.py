"""A live run folder: its manifest, consolidation into parquet + summary, and rebuilding it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.live.config import (
    MANIFEST_FILE,
    ReplayConfig,
)
from harness.live.prompts import (
    PromptBuilder,
)
from harness.live.protocols import (
    OUTPUT_LENGTH_CONTROL,
    PRIORITY_FIELD,
    ProtocolName,
)
from harness.live.recorder import RECORDS_FILE, read_records
from harness.manifest import run_fields, trace_manifest
from harness.metrics import DEFAULT_CLIENT_LAG_THRESHOLD_S, Slo, summarize
from harness.results import (
    REQUESTS_FILE,
    SUMMARY_FILE,
    read_timelines,
    write_json_atomic,
    write_timelines,
)
from harness.timeline import RequestTimeline
from harness.traces import Trace


def priority_note(trace: Trace, protocol: ProtocolName) -> str:
    if not any(r.priority is not None for r in trace.requests):
        return "none: no request has a priority"
    fld = PRIORITY_FIELD[protocol]
    if fld is None:
        return f"not applied: the {protocol} protocol has no priority field"
    return f"applied: sent in the request's {fld!r} field"


def replay_manifest(trace: Trace, config: ReplayConfig, builder: PromptBuilder,
              command: Sequence[str] | None) -> dict[str, Any]:
    return {
        **run_fields("live", command),
        "trace": trace_manifest(trace),
        "target": config.target_url,
        "protocol": config.protocol,
        "model": config.model,
        "mode": config.mode,
        "replay": config.as_manifest(),
        "prompt_mode": builder.mode,
        "priority": priority_note(trace, config.protocol),
        "output_length": OUTPUT_LENGTH_CONTROL[config.protocol],
        "slo": config.slo.as_dict() if config.slo is not None else None,
        "client_lag_threshold_s": config.client_lag_threshold_s,
        "clock": "time.perf_counter_ns, instants in seconds from t0 (run start)",
        "status": "running",
    }


def consolidate(out_dir: Path, timelines: Sequence[RequestTimeline], *, slo: Slo | None,
                 client_lag_threshold_s: float) -> dict[str, Any]:
    ordered = sorted(timelines, key=lambda tl: tl.arrival_s)
    write_timelines(out_dir, ordered, live=True)
    summary = summarize(ordered, slo=slo, client_lag_threshold_s=client_lag_threshold_s)
    write_json_atomic(summary, out_dir / SUMMARY_FILE)
    return summary




def rebuild_summary(out_dir: Path, *, slo: Slo | None = None) -> dict[str, Any]:
    """Rebuild ``requests.parquet``, ``chunks.parquet`` and ``summary.json`` of a run folder
    from its ``records.jsonl`` (after a crash), or re-summarise its parquet files.

    ``slo`` defaults to the one in the folder's manifest. Keys of an existing summary that
    ``summarize`` does not produce (e.g. a simulation's step count) are kept."""
    out_dir = Path(out_dir)
    manifest: dict[str, Any] = {}
    with contextlib.suppress(ValueError, OSError):
        manifest = json.loads((out_dir / MANIFEST_FILE).read_text())
    if slo is None and manifest.get("slo"):
        slo = Slo(**manifest["slo"])
    threshold = float(manifest.get("client_lag_threshold_s") or DEFAULT_CLIENT_LAG_THRESHOLD_S)
    records = out_dir / RECORDS_FILE
    if records.exists():
        timelines = sorted(read_records(records), key=lambda tl: tl.arrival_s)
        write_timelines(out_dir, timelines, live=True)
    elif (out_dir / REQUESTS_FILE).exists():
        timelines = read_timelines(out_dir)
    else:
        raise ValueError(f"{out_dir}: no {RECORDS_FILE} or {REQUESTS_FILE} to summarise")
    summary = summarize(timelines, slo=slo, client_lag_threshold_s=threshold)
    old_path = out_dir / SUMMARY_FILE
    if old_path.exists():
        with contextlib.suppress(ValueError, OSError):
            old = json.loads(old_path.read_text())
            derived = {"slo", "goodput", "send_lag_s", "client_limited", "client_lag_threshold_s",
                       "gate_wait_s", "by_priority"}
            for key, value in old.items():
                if key not in summary and key not in derived:
                    summary[key] = value
    write_json_atomic(summary, old_path)
    return summary
