"""A live run folder: its manifest, consolidation into parquet + summary, and rebuilding it."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from harness.live.config import (
    MANIFEST_FILE,
    ReplayConfig,
)
from harness.live.prompts import (
    PromptBuilder,
)
from harness.live.protocols import OUTPUT_LENGTH_CONTROL
from harness.live.recorder import (
    RECORDS_FILE,
    SENT_UNRECORDED_MESSAGE,
    Records,
    load_records,
    records_run_id,
)
from harness.live.telemetry import (
    TELEMETRY_FILE,
    engine_preemptions,
    engine_prefix_cache,
    unanswered_tail,
)
from harness.manifest import read_manifest, run_fields, trace_manifest, update_manifest
from harness.metrics import DEFAULT_CLIENT_LAG_THRESHOLD_S, Slo, summarize
from harness.prediction import summary_prediction
from harness.results import (
    CHUNKS_FILE,
    REQUESTS_FILE,
    STEPS_FILE,
    SUMMARY_FILE,
    SUMMARY_KEYS,
    parquet_run_id,
    read_timelines,
    write_json_atomic,
    write_timelines,
)
from harness.runfolder import writer_of
from harness.timeline import RequestTimeline
from harness.traces import Trace

log = logging.getLogger(__name__)


def priority_note(trace: Trace, config: ReplayConfig) -> str:
    """The manifest's word on the trace's priorities: sent (in which scale), or not and why
    (``harness.live.protocols.plan_priority``)."""
    return config.priority_plan(trace.requests).note


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
        "priority": priority_note(trace, config),
        "output_length": OUTPUT_LENGTH_CONTROL[config.protocol],
        "slo": config.slo.as_dict() if config.slo is not None else None,
        "client_lag_threshold_s": config.client_lag_threshold_s,
        "clock": "time.perf_counter_ns, instants in seconds from t0 (run start)",
        "status": "running",
    }


def consolidate(out_dir: Path, timelines: Sequence[RequestTimeline], *, slo: Slo | None,
                 client_lag_threshold_s: float, run_id: str | None = None,
                 fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write the parquet files and ``summary.json`` (all stamped with ``run_id``); ``fields``:
    what the summary says besides the metrics (how the run ended)."""
    ordered = sorted(timelines, key=lambda tl: tl.arrival_s)
    summary = with_engine_counters(
        summarize(ordered, slo=slo, client_lag_threshold_s=client_lag_threshold_s), out_dir)
    if run_id is not None:
        summary["run_id"] = run_id
    summary.update(fields or {})
    write_timelines(out_dir, ordered, live=True, run_id=run_id)
    write_json_atomic(summary, out_dir / SUMMARY_FILE)
    return summary




PREEMPTIONS_FROM_ENGINE = "the engine's telemetry (its preemption counter)"
PREEMPTIONS_UNKNOWN = ("not known: a client cannot see preemptions, and the engine's telemetry "
                       "had no preemption counter")
PREEMPTIONS_UNSCRAPED = ("not known: a client cannot see preemptions, and no engine telemetry "
                         "was scraped (`replay --engine ENGINE --url URL` scrapes it)")


def with_engine_counters(summary: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """A live run's summary with what only the engine counts: ``num_preemptions`` from its
    telemetry (``engine_preemptions``), None when not known, never the requests' zero; and
    ``preemptions_from`` saying which; ``prefix_cache`` when the engine counted lookups in
    its prefix cache (``engine_prefix_cache``). Against the reference engine served over HTTP, also
    ``prediction`` (``harness.prediction.summary_prediction``): its figures are predictions."""
    manifest = read_manifest(out_dir)
    prediction = summary_prediction(manifest.get("engine"))
    if prediction is not None:
        summary["prediction"] = prediction
    n = engine_preemptions(out_dir)
    summary["num_preemptions"] = n
    for figures in (summary.get("by_priority") or {}).values():
        if isinstance(figures, dict):  # the engine's counter does not say whose requests
            figures["num_preemptions"] = None
    summary["preemptions_from"] = (
        PREEMPTIONS_FROM_ENGINE if n is not None else PREEMPTIONS_UNKNOWN
        if (out_dir / TELEMETRY_FILE).exists() else PREEMPTIONS_UNSCRAPED)
    cache = engine_prefix_cache(out_dir)
    if cache is not None and cache["queries_tokens"] > 0:  # none looked up: caching was off
        # which requests' prompts share prefixes is the trace's (Mooncake hash_ids), not the
        # engine's to say
        with_ids = ((manifest.get("trace") or {}).get("stats") or {}).get(
            "num_with_prefix_hashes")
        cache["num_requests_with_prefix_ids"] = with_ids if isinstance(with_ids, int) else None
        summary["prefix_cache"] = cache
    unanswered, last_s = unanswered_tail(out_dir)
    if n is not None and unanswered and last_s is not None:
        # an engine that died or hung: what it counted after its last answer is not known
        summary["preemptions_from"] += (
            f" (up to its last answered scrape, at {last_s:.1f} s; the {unanswered} after it "
            "failed: preemptions after it are not counted)")
    return summary


def finish_run_folder(out_dir: Path, timelines: Sequence[RequestTimeline], config: ReplayConfig,
                      *, run_id: str, error: OSError | None, stopped_at_s: float | None,
                      num_on_disk: int, fields: Mapping[str, Any] | None = None,
                      ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Consolidate the run folder, ``fields`` in its summary (``consolidate``). After a write
    the disk refused (``error``, or one here), also what the manifest records of where the run
    stopped, and the summary says it failed; it is then computed in memory if even it cannot
    be written."""
    try:
        summary = consolidate(out_dir, timelines, slo=config.slo,
                              client_lag_threshold_s=config.client_lag_threshold_s,
                              run_id=run_id, fields=fields)
    except OSError as exc:
        error = error or exc
        summary = with_engine_counters(  # as consolidate would: never the requests' zero
            summarize(timelines, slo=config.slo,
                      client_lag_threshold_s=config.client_lag_threshold_s), out_dir)
        summary["run_id"] = run_id
        summary.update(fields or {})
    if error is None:
        return summary, None
    where = getattr(error, "filename", None) or str(out_dir / RECORDS_FILE)
    at = "" if stopped_at_s is None else f" at t={stopped_at_s:.2f} s"
    reason = (f"{where}: {error.strerror or error}: the run stopped{at} with {num_on_disk} of "
              f"{len(timelines)} requests written to {RECORDS_FILE}; those rows are on disk "
              f"(`batchlab summarize {out_dir}` rebuilds the summary from them once there is "
              "room)")
    stopped = {"error": reason, "stopped_at": {
        "t_s": stopped_at_s, "num_recorded_on_disk": num_on_disk,
        "num_recorded": len(timelines), "file": where}}
    summary["stopped_early"] = reason
    summary["status"] = "failed"
    with contextlib.suppress(OSError):
        write_json_atomic(summary, out_dir / SUMMARY_FILE)
    return summary, stopped


def update_manifest_quietly(out_dir: Path, fields: dict[str, Any]) -> None:
    """The manifest's last word; on a full disk it may not fit, which must not hide the
    run's own error."""
    try:
        update_manifest(out_dir, fields)
    except OSError:
        log.warning("%s: could not update manifest.json (disk full?)", out_dir)


def rebuild_summary(out_dir: Path, *, slo: Slo | None = None) -> dict[str, Any]:
    """Rebuild ``requests.parquet``, ``chunks.parquet`` and ``summary.json`` of a run folder
    from its ``records.jsonl`` (after a crash), or re-summarise its parquet files.

    ``slo`` defaults to the one in the folder's manifest. Keys of an existing summary that
    ``summarize`` does not produce (e.g. a simulation's step count) are kept. A
    ``records.jsonl`` is used only when it belongs to the folder's run (a live run whose
    ``run_id`` its header names); otherwise the parquet files are the run's record.

    How the run ended, where no earlier summary says it, comes from the manifest: ``status``,
    ``stopped_early``, ``num_planned`` and ``num_not_sent`` (where the manifest has no counts,
    as a simulated run's has not: its trace's ``num_requests``, less the rows).

    A request whose sent record no row followed (the replay killed outright) is a
    ``not_finished`` row. When the records hold every request sent (``Records.sends_recorded``)
    of a run whose manifest never said how it ended (still "running": killed), the summary
    also says how much of its trace it sent (``num_planned``, ``num_not_sent``) and how many
    requests were in flight with no end recorded (``num_sent_unrecorded``), and so does the
    manifest, whose status is left as it was."""
    out_dir = Path(out_dir)
    manifest = _json_object_or_none(out_dir / MANIFEST_FILE, "no manifest")
    if slo is None and manifest.get("slo"):
        try:
            slo = Slo(**manifest["slo"])
        except TypeError:  # not an object of Slo's fields
            raise ValueError(f"{out_dir / MANIFEST_FILE}: slo is not an SLO ("
                             f"{json.dumps(manifest['slo'])[:60]}); pass --slo") from None
    threshold = float(manifest.get("client_lag_threshold_s") or DEFAULT_CLIENT_LAG_THRESHOLD_S)
    records = out_dir / RECORDS_FILE
    run_id = manifest.get("run_id") if isinstance(manifest.get("run_id"), str) else None
    worker_records = _workers_records(out_dir)
    read: list[Records] = []  # what the timelines were rebuilt from, when from records
    if records.exists() and _records_belong(records, manifest, run_id):
        read = [load_records(records, unrecorded_message=_unrecorded_message(manifest))]
        timelines = sorted(read[0].timelines, key=lambda tl: tl.arrival_s)
        write_timelines(out_dir, timelines, live=True, run_id=run_id)
    elif worker_records and not (out_dir / REQUESTS_FILE).exists():
        # replay --workers killed before it merged (SIGKILL to the parent): each worker's
        # records, as the merge would have taken them
        for path in worker_records:
            _refuse_if_written(path.parent)
        read = [load_records(path, unrecorded_message=_unrecorded_message(manifest))
                for path in worker_records]
        timelines = sorted((tl for r in read for tl in r.timelines), key=lambda tl: tl.arrival_s)
        write_timelines(out_dir, timelines, live=True, run_id=run_id)
    elif (out_dir / REQUESTS_FILE).exists():
        _check_tables(out_dir, run_id)
        timelines = read_timelines(out_dir)
    elif records.exists():
        raise ValueError(f"{records}: written by another run than this folder's manifest names "
                         f"(run_id {run_id}), and there is no {REQUESTS_FILE}: nothing of this "
                         "run to summarise")
    else:
        raise ValueError(f"{out_dir}: no {RECORDS_FILE} or {REQUESTS_FILE} to summarise")
    summary = summarize(timelines, slo=slo, client_lag_threshold_s=threshold)
    if manifest.get("kind") == "live":
        summary = with_engine_counters(summary, out_dir)
    if run_id is not None:
        summary["run_id"] = run_id
    old_path = out_dir / SUMMARY_FILE
    old = _earlier_summary(old_path)
    if old:
        # the run the tables are of: the manifest's, else (no manifest) the parquet files'
        owner = run_id if run_id is not None else _tables_run_id(out_dir)
        if old.get("run_id") not in (None, owner):
            old = {}  # another run's summary (two runs into one folder): none of its keys
        if not manifest and "num_preemptions" in old:
            # no manifest to say whether the engine's counter was read (a live run's is
            # "not known" without it): the summary's own figure stands
            summary["num_preemptions"] = old["num_preemptions"]
        derived = {"slo", "goodput", "send_lag_s", "client_limited", "client_lag_threshold_s",
                   "gate_wait_s", "by_priority"}
        for key, value in old.items():
            if key not in summary and key not in derived:
                summary[key] = value
    # how the run ended, as its manifest says (a crash rebuilt here has no summary to keep
    # it from): a run that did not finish must not read as a whole one
    if manifest.get("status") and "status" not in summary:
        summary["status"] = manifest["status"]
    if manifest.get("stopped_early") and "stopped_early" not in summary:
        summary["stopped_early"] = manifest["stopped_early"]
    if manifest.get("kind") == "simulated":
        # what simulate wrote beside the figures that the folder still holds: they are
        # predictions (the manifest's record), and how many steps the engine ran
        prediction = summary_prediction(manifest.get("engine"))
        if prediction is not None and "prediction" not in summary:
            summary["prediction"] = prediction
        steps = _num_rows(out_dir / STEPS_FILE)
        if steps is not None and "num_steps" not in summary:
            summary["num_steps"] = steps
    killed = _sends_of_killed_run(manifest, read, len(timelines))
    ended = _sends_of_ended_run(manifest, len(timelines))
    for key in ("num_planned", "num_not_sent"):
        if key not in summary and manifest.get(key) is not None:
            summary[key] = manifest[key]
        elif key not in summary and key in killed:
            summary[key] = killed[key]
        elif key not in summary and key in ended:
            summary[key] = ended[key]
    num_unrecorded = sum(len(r.unrecorded) for r in read)
    if killed or num_unrecorded:
        summary["num_sent_unrecorded"] = num_unrecorded
    workers = summary.get("workers")
    if isinstance(workers, list) and any(isinstance(w, dict) and w.get("client_limited")
                                         for w in workers):
        summary["client_limited"] = True  # as replay --workers merged it: when any worker was
    write_json_atomic(summary, old_path)
    missing = {k: v for k, v in killed.items() if k not in manifest}
    if missing:  # what the killed run never wrote (its status stays: nothing said how it ended)
        update_manifest_quietly(out_dir, missing)
    return summary


def _num_rows(path: Path) -> int | None:
    """The rows of a parquet file, from its footer; None when it cannot be read."""
    try:
        with pq.ParquetFile(path) as file:
            return int(file.metadata.num_rows)
    except (OSError, ValueError, pa.ArrowInvalid):
        return None


def _json_object_or_none(path: Path, none: str) -> dict[str, Any]:
    """The JSON object in ``path``; {} when it is missing or unreadable, and, with a warning
    line saying it is read as ``none``, when it holds JSON that is not an object."""
    try:
        data = json.loads(path.read_text())
    except (ValueError, OSError):
        return {}
    if isinstance(data, dict):
        return data
    log.warning("warning: %s: not a JSON object (%s): read as %s", path,
                json.dumps(data)[:40], none)
    return {}


def _earlier_summary(path: Path) -> dict[str, Any]:
    """The summary a rebuild replaces, for the keys it keeps; {} when there is none, and, with
    a warning line, when the file is not a summary: not a JSON object, or one with none of the
    fields every summary has (another document written over it), none of whose keys may pass
    for the run's."""
    old = _json_object_or_none(path, "no earlier summary")
    if old and not any(key in old for key in SUMMARY_KEYS):
        log.warning("warning: %s: not a summary (none of %s): read as no earlier summary",
                    path, ", ".join(SUMMARY_KEYS))
        return {}
    return old


KILLED_STATUSES = ("running", "starting")  # a manifest that never said how its run ended


def _unrecorded_message(manifest: dict[str, Any]) -> str:
    """What a request sent with no row after its sent record is said to have met."""
    status = manifest.get("status")
    if status in (None, *KILLED_STATUSES):
        return SENT_UNRECORDED_MESSAGE
    return (f"sent, but no row of it was written to {RECORDS_FILE} before the run ended "
            f"({status})")


def _sends_of_killed_run(manifest: dict[str, Any], read: Sequence[Records],
                         num_rows: int) -> dict[str, int]:
    """A run killed outright (its manifest still says running) whose records hold every
    request it sent: how much of its trace that was (the manifest's counts, as the run would
    have written them). Empty for any other run."""
    if manifest.get("status") not in KILLED_STATUSES or not read:
        return {}
    if not all(r.sends_recorded for r in read):
        return {}  # records from before sent records: the requests in flight are not there
    trace = manifest.get("trace")
    planned = manifest.get("num_planned")
    if not isinstance(planned, int) and isinstance(trace, dict):
        planned = trace.get("num_requests")
    if not isinstance(planned, int):
        return {}
    return {"num_planned": planned, "num_not_sent": max(0, planned - num_rows),
            "num_sent": num_rows, "num_recorded": num_rows,
            "num_sent_unrecorded": sum(len(r.unrecorded) for r in read)}


def _sends_of_ended_run(manifest: dict[str, Any], num_rows: int) -> dict[str, int]:
    """A run whose manifest says how it ended but not how much of its trace it sent (a
    simulated run's, which puts that in its summary only): the trace's requests, and those
    with no row, never sent. Every request sent of such a run is a row (one cut off by its
    end is ``not_finished``). Empty for a run killed outright, or a manifest without its
    trace's count."""
    if manifest.get("status") in (None, *KILLED_STATUSES):
        return {}
    trace = manifest.get("trace")
    planned = trace.get("num_requests") if isinstance(trace, dict) else None
    if isinstance(planned, bool) or not isinstance(planned, int):
        return {}
    return {"num_planned": planned, "num_not_sent": max(0, planned - num_rows)}


def _refuse_if_written(folder: Path) -> None:
    """A worker's folder that a process still writes (a worker recording its requests in
    flight after its parent was killed) is not read half-written."""
    holder = writer_of(folder)
    if holder is not None:
        raise ValueError(f"{folder}: {holder} is still writing it (a replay worker recording "
                         "its requests in flight); summarize once it has ended")


def _tables_run_id(out_dir: Path) -> str | None:
    """The run that wrote the folder's requests.parquet, when it says (None otherwise)."""
    path = out_dir / REQUESTS_FILE
    try:
        return parquet_run_id(path) if path.exists() else None
    except ValueError:
        return None


def _check_tables(out_dir: Path, run_id: str | None) -> None:
    """The tables a summary is rebuilt from must be this run's, and complete: a missing
    chunks.parquet would make every TTFT and TPOT unknown, and silently so."""
    chunks = out_dir / CHUNKS_FILE
    if not chunks.exists():
        raise ValueError(f"{out_dir}: {REQUESTS_FILE} without {CHUNKS_FILE}: the streamed "
                         "chunks TTFT, TPOT and ITL are measured from are gone; the summary "
                         "is left as it was")
    for path in (out_dir / REQUESTS_FILE, chunks):
        written_by = parquet_run_id(path)
        if run_id is not None and written_by is not None and written_by != run_id:
            raise ValueError(f"{path}: written by run {written_by}, not by this folder's run "
                             f"{run_id} (manifest.json); the summary is left as it was")


def _workers_records(out_dir: Path) -> list[Path]:
    """``replay --workers``: the records.jsonl of each worker's folder (``workers/w<i>/``)
    that belongs to that worker's run."""
    found = []
    for folder in sorted((out_dir / "workers").glob("w*")):
        records = folder / RECORDS_FILE
        if not records.exists():
            continue
        manifest = _json_object_or_none(folder / MANIFEST_FILE, "no manifest")
        run_id = manifest.get("run_id") if isinstance(manifest.get("run_id"), str) else None
        if _records_belong(records, manifest, run_id):
            found.append(records)
    return found


def _records_belong(records: Path, manifest: dict[str, Any], run_id: str | None) -> bool:
    """Whether ``records.jsonl`` is this folder's run's (not left by an earlier run)."""
    if manifest.get("kind") == "simulated":
        return False  # a simulation writes no records.jsonl
    if run_id is None:
        return True  # a folder from before run ids: its records are all there is
    return records_run_id(records) == run_id
