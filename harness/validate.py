"""How well the reference engine predicts a real one: the same trace, live and simulated.

``batchlab validate`` replays a held-out trace against a live engine (``harness.live``) and
simulates it on the reference engine with the same knobs and a calibration profile
(``harness.calibrate``), then compares the two run folders::

    OUT/live/        requests.parquet, chunks.parquet, telemetry.parquet, summary.json, ...
    OUT/simulated/   requests.parquet, chunks.parquet, steps.parquet, summary.json, ...
    OUT/fidelity.json            predicted vs measured (the schema below)
    OUT/per_request_errors.parquet   one row per request present in both runs
    OUT/fidelity.md              the same as the report's "Prediction fidelity" section
    OUT/probes/{before,after}/   a calibration burst again, around the replay: speed drift

``fidelity.json``::

    {"ttft_s": {"p50": {"predicted": s, "measured": s, "relative_error": e}, "p90": ..., ...},
     "tpot_s": {...}, "e2e_s": {...},
     "output_tokens_per_s": {"predicted": x, "measured": x, "relative_error": e},
     "per_request": {"num_matched": n, "ttft_s": {"median_abs": e, "p90_abs": e, "median": e}, ...},
     "running_batch_size": {"mean": {...}, "p90": {...}, "max": {...}, "series": ...},
     "in_flight_requests": {"mean": {...}, "max": {...}},     (when both sides have them)
     "engine_speed_vs_calibration": {"before": e, "after": e, "burst": name}}  (validate)

``relative_error = (predicted - measured) / measured``: signed, so +0.1 means the reference
predicted 10% too high; None when the measured value is missing or zero. ``fidelity`` and
``render_fidelity_markdown`` are pure functions; the report calls them for every live run it
can pair with a simulated run of the same trace.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from adapters.base import Knobs, LaunchPlan
from harness.manifest import jsonable, read_manifest, update_manifest
from harness.metrics import Slo, request_metrics
from harness.results import STEPS_FILE, read_timelines, write_json_atomic, write_parquet_atomic
from harness.telemetry import DEFAULT_INTERVAL_S, TELEMETRY_FILE
from harness.timeline import RequestTimeline
from harness.traces import Trace

FIDELITY_FILE = "fidelity.json"
FIDELITY_MARKDOWN_FILE = "fidelity.md"
PER_REQUEST_FILE = "per_request_errors.parquet"
LIVE_DIR = "live"
PROBE_DIR = "probes"
SIMULATED_DIR = "simulated"

METRICS = ("ttft_s", "tpot_s", "e2e_s")
PERCENTILES = ("p50", "p90", "p99")
_LABELS = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E latency"}
BATCH_GRID_S = 0.25  # the telemetry scraper's default interval
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)


# ---------------------------------------------------------------- the comparison


def compare(predicted: float | None, measured: float | None) -> dict[str, float | None]:
    """``{predicted, measured, relative_error}`` with None where a value is missing."""
    p = _finite(predicted)
    m = _finite(measured)
    error = None if p is None or m is None or m == 0 else (p - m) / m
    return {"predicted": p, "measured": m, "relative_error": error}


def _finite(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _get(summary: Mapping[str, Any] | None, *keys: str) -> Any:
    node: Any = summary
    for key in keys:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def fidelity(
    predicted_summary: Mapping[str, Any],
    measured_summary: Mapping[str, Any],
    predicted_timelines: Sequence[RequestTimeline] | None = None,
    measured_timelines: Sequence[RequestTimeline] | None = None,
    *,
    predicted_steps: pa.Table | None = None,
    measured_telemetry: pa.Table | None = None,
) -> dict[str, Any]:
    """Predicted (simulated) against measured (live) figures; see the module doc for the shape.

    Summaries are ``summary.json`` dicts (``harness.metrics.summarize``). With both timeline
    lists, requests are matched by id for per-request errors. With the simulation's step table
    and the live run's telemetry table, the running batch sizes over time are compared too.
    """
    out: dict[str, Any] = {}
    for metric in METRICS:
        out[metric] = {
            pct: compare(_get(predicted_summary, metric, pct), _get(measured_summary, metric, pct))
            for pct in PERCENTILES
        }
    out["output_tokens_per_s"] = compare(
        _get(predicted_summary, "throughput", "output_tokens_per_s"),
        _get(measured_summary, "throughput", "output_tokens_per_s"),
    )
    out["num_completed"] = {
        "predicted": _get(predicted_summary, "num_completed"),
        "measured": _get(measured_summary, "num_completed"),
    }
    if predicted_timelines is not None and measured_timelines is not None:
        out["per_request"] = per_request_summary(
            per_request_errors(predicted_timelines, measured_timelines))
        in_flight = in_flight_comparison(predicted_timelines, measured_timelines)
        if in_flight is not None:
            out["in_flight_requests"] = in_flight
    if predicted_steps is not None and measured_telemetry is not None:
        batch = batch_size_comparison(predicted_steps, measured_telemetry)
        if batch is not None:
            out["running_batch_size"] = batch
    return out


def per_request_errors(
    predicted: Sequence[RequestTimeline], measured: Sequence[RequestTimeline]
) -> pa.Table:
    """One row per request that succeeded in both runs: measured, predicted, relative error."""
    by_id = {tl.request_id: tl for tl in predicted}
    cols: dict[str, list[Any]] = {"request_id": [], "num_prompt_tokens": [],
                                  "num_output_tokens": []}
    for metric in METRICS:
        for part in ("measured", "predicted", "relative_error"):
            cols[f"{metric}_{part}"] = []
    for m_tl in measured:
        p_tl = by_id.get(m_tl.request_id)
        if p_tl is None or not m_tl.ok or not p_tl.ok:
            continue
        m, p = request_metrics(m_tl), request_metrics(p_tl)
        cols["request_id"].append(m_tl.request_id)
        cols["num_prompt_tokens"].append(m_tl.num_prompt_tokens)
        cols["num_output_tokens"].append(m_tl.output_tokens)
        for metric in METRICS:
            c = compare(getattr(p, metric), getattr(m, metric))
            cols[f"{metric}_measured"].append(c["measured"])
            cols[f"{metric}_predicted"].append(c["predicted"])
            cols[f"{metric}_relative_error"].append(c["relative_error"])
    types = {"request_id": pa.string(), "num_prompt_tokens": pa.int64(),
             "num_output_tokens": pa.int64()}
    return pa.table({name: pa.array(values, types.get(name, pa.float64()))
                     for name, values in cols.items()})


def per_request_summary(errors: pa.Table) -> dict[str, Any]:
    """Medians of the per-request relative errors: absolute (how far) and signed (which way)."""
    out: dict[str, Any] = {"num_matched": errors.num_rows}
    for metric in METRICS:
        values = errors.column(f"{metric}_relative_error").to_numpy(zero_copy_only=False)
        values = np.asarray(values, dtype=np.float64)
        values = values[np.isfinite(values)]
        if values.size == 0:
            out[metric] = {"median_abs": None, "p90_abs": None, "median": None, "count": 0}
            continue
        out[metric] = {
            "median_abs": float(np.median(np.abs(values))),
            "p90_abs": float(np.percentile(np.abs(values), 90)),
            "median": float(np.median(values)),
            "count": int(values.size),
        }
    return out


# ---------------------------------------------------------------- running batch size


def in_flight_comparison(predicted: Sequence[RequestTimeline],
                         measured: Sequence[RequestTimeline], *,
                         grid_s: float = BATCH_GRID_S) -> dict[str, Any] | None:
    """Requests between their send (arrival, simulated) and their finish, on one grid.

    The same definition on both sides, from the timelines alone: a cross-check of the running
    batch size, whose live value is whatever the engine's gauge said when it was scraped.
    """
    def spans(tls: Sequence[RequestTimeline]) -> np.ndarray:
        return np.array([(tl.start_s, tl.finished_s) for tl in tls if tl.ok],
                        dtype=np.float64).reshape(-1, 2)

    p, m = spans(predicted), spans(measured)
    if not p.size or not m.size:
        return None
    grid = np.arange(0.0, max(p[:, 1].max(), m[:, 1].max()) + grid_s / 2, grid_s)

    def count(s: np.ndarray) -> np.ndarray:
        return ((s[:, :1] <= grid) & (grid < s[:, 1:])).sum(axis=0).astype(np.float64)

    pc, mc = count(p), count(m)
    busy = (pc > 0) | (mc > 0)
    return {"mean": compare(float(pc[busy].mean()), float(mc[busy].mean())),
            "max": compare(float(pc.max()), float(mc.max()))}



def _step_series(steps: pa.Table) -> tuple[np.ndarray, np.ndarray] | None:
    """(instants, running) of a simulation: each step's running count, from its start."""
    if "t_s" not in steps.column_names or "num_running" not in steps.column_names:
        return None
    t = np.asarray(steps.column("t_s").to_numpy(zero_copy_only=False), dtype=np.float64)
    n = np.asarray(steps.column("num_running").to_numpy(zero_copy_only=False), dtype=np.float64)
    if t.size == 0:
        return None
    if "duration_s" in steps.column_names:
        # Idle gaps between steps (waiting for arrivals) count as zero running requests.
        d = np.asarray(steps.column("duration_s").to_numpy(zero_copy_only=False),
                       dtype=np.float64)
        ends = t + d
        idle = np.append(t[1:] > ends[:-1] + 1e-12, True)
        t = np.concatenate([t, ends[idle]])
        n = np.concatenate([n, np.zeros(int(idle.sum()))])
        order = np.argsort(t, kind="stable")
        t, n = t[order], n[order]
    return t, n


def _telemetry_series(telemetry: pa.Table) -> tuple[np.ndarray, np.ndarray] | None:
    if "t_s" not in telemetry.column_names or "num_running" not in telemetry.column_names:
        return None
    t = np.asarray(telemetry.column("t_s").to_numpy(zero_copy_only=False), dtype=np.float64)
    n = np.asarray(telemetry.column("num_running").to_numpy(zero_copy_only=False),
                   dtype=np.float64)
    keep = np.isfinite(t) & np.isfinite(n)
    if not keep.any():
        return None
    order = np.argsort(t[keep], kind="stable")
    return t[keep][order], n[keep][order]


def _on_grid(t: np.ndarray, n: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The last value at or before each grid instant (0 before the first)."""
    idx = np.searchsorted(t, grid, side="right") - 1
    return np.where(idx >= 0, n[np.clip(idx, 0, n.size - 1)], 0.0)


def batch_size_comparison(
    predicted_steps: pa.Table, measured_telemetry: pa.Table, *, grid_s: float = BATCH_GRID_S,
    max_points: int = 200,
) -> dict[str, Any] | None:
    """Running batch size over time, both sampled on one grid from 0 to the later end.

    Both clocks start at the run's first arrival (0 s). The live side is what the engine's
    ``num_running`` gauge said at each scrape; the simulated side is the running count of the
    step in progress. Returns mean, p90 and max compared, and the series (thinned to
    ``max_points``) for plots; None when either side has no running counts.
    """
    sim = _step_series(predicted_steps)
    live = _telemetry_series(measured_telemetry)
    if sim is None or live is None:
        return None
    end = max(float(sim[0][-1]), float(live[0][-1]))
    grid = np.arange(0.0, end + grid_s / 2, grid_s)
    p = _on_grid(*sim, grid)
    m = _on_grid(*live, grid)
    # Compare over the span where the live engine had work, so trailing idle scrapes do not
    # dilute the means.
    busy = (m > 0) | (p > 0)
    if not busy.any():
        return None
    pb, mb = p[busy], m[busy]
    stride = max(1, math.ceil(grid.size / max_points))
    return {
        "mean": compare(float(pb.mean()), float(mb.mean())),
        "p90": compare(float(np.percentile(pb, 90)), float(np.percentile(mb, 90))),
        "max": compare(float(pb.max()), float(mb.max())),
        "mean_abs_difference": float(np.abs(pb - mb).mean()),
        "grid_s": grid_s,
        "series": {
            "t_s": [round(float(x), 6) for x in grid[::stride]],
            "predicted": [float(x) for x in p[::stride]],
            "measured": [float(x) for x in m[::stride]],
        },
    }


# ---------------------------------------------------------------- markdown


def _pct_error(error: float | None) -> str:
    if error is None or not math.isfinite(error):
        return "–"
    return f"{error * 100:+.1f}%"


def render_fidelity_markdown(fid: Mapping[str, Any], *, title: str = "Prediction fidelity",
                             level: int = 2, intro: bool = True) -> str:
    """The report section for one fidelity dict (from ``fidelity``): a table and a sentence."""
    from harness.report import fmt_number, fmt_seconds, table  # lazy: report imports us

    lines = ["#" * level + " " + title, ""]
    if intro:
        lines += ["The reference engine's prediction (simulated, with the same knobs and a "
                  "calibration profile) against what the live engine measured on the same "
                  "trace. Error = (predicted − measured) / measured.", ""]
    rows = []
    for metric in METRICS:
        for pct in PERCENTILES:
            c = _get(fid, metric, pct) or {}
            rows.append([f"{_LABELS[metric]} {pct}", fmt_seconds(c.get("predicted")),
                         fmt_seconds(c.get("measured")), _pct_error(c.get("relative_error"))])
    c = fid.get("output_tokens_per_s") or {}
    rows.append(["output tokens/s", fmt_number(c.get("predicted")),
                 fmt_number(c.get("measured")), _pct_error(c.get("relative_error"))])
    batch = fid.get("running_batch_size")
    if batch:
        for stat in ("mean", "max"):
            c = batch.get(stat) or {}
            rows.append([f"running batch size, {stat}", fmt_number(c.get("predicted")),
                         fmt_number(c.get("measured")), _pct_error(c.get("relative_error"))])
    lines += [table(["metric", "predicted", "measured", "error"], rows), ""]
    per = fid.get("per_request")
    if per and per.get("num_matched"):
        parts = []
        for metric in METRICS:
            m = per.get(metric) or {}
            if m.get("median_abs") is not None:
                parts.append(f"{_LABELS[metric]} {m['median_abs'] * 100:.1f}% "
                             f"(p90 {m['p90_abs'] * 100:.1f}%)")
        if parts:
            lines += [f"Per request ({per['num_matched']:,} matched), median absolute error: "
                      + "; ".join(parts) + ".", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- batchlab validate


def run_validation(
    plan: LaunchPlan,
    knobs: Knobs,
    trace: Trace,
    *,
    profile: str,
    reference_model: str,
    out_dir: Path,
    model: str,
    replay_kwargs: Mapping[str, Any] | None = None,
    slo: Slo | None = None,
    command: Sequence[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    telemetry_interval_s: float = DEFAULT_INTERVAL_S,
) -> dict[str, Any]:
    """Replay ``trace`` live against the server ``plan`` describes and simulate it on the
    reference engine (same knobs, ``profile``, the engine's KV cache); write both run folders
    and the comparison (module doc) under ``out_dir``; return the fidelity dict.

    ``knobs`` are the server's: launched with them, or declared for an attached server (they
    reach the simulation either way). ``model`` is what the engine loaded (its tokenizer folder
    makes prompts of exact length).
    """
    from adapters.reference.cost_model import load_profile
    from harness.calibrate import (
        KvCacheInfo,
        probe_kv_cache,
        probe_reference,
        reference_config,
        speed_probe,
    )
    from harness.live import run_live
    from harness.simulate import run_simulation

    params = load_profile(profile)
    meta = _profile_metadata(profile)
    device = params.device or "h100-sxm"
    kv = probe_kv_cache(plan.base_url)
    engine_meta = meta.get("engine") or {}
    if kv is None and engine_meta.get("num_kv_blocks") and engine_meta.get("block_size"):
        kv = KvCacheInfo(int(engine_meta["block_size"]), int(engine_meta["num_kv_blocks"]))
    config = reference_config(reference_model, knobs, device, profile=profile, kv=kv)

    out_dir = Path(out_dir)
    live_dir, sim_dir = out_dir / LIVE_DIR, out_dir / SIMULATED_DIR
    tokenizer = (replay_kwargs or {}).get("tokenizer_path") or (
        model if (Path(model) / "tokenizer.json").is_file() else None)
    probes = out_dir / PROBE_DIR
    reference = probe_reference(meta.get("workload") or [], knobs.max_num_seqs)
    speed_before = None if reference is None else speed_probe(
        plan, reference, probes / "before", tokenizer_path=tokenizer,
        telemetry_interval_s=telemetry_interval_s)
    measured = run_live(
        plan.engine, Knobs(), trace, replay_kwargs, live_dir, launch=False, url=plan.base_url,
        model=model, served_model_name=plan.model, slo=slo, progress=progress,
        command=command, telemetry_interval_s=telemetry_interval_s,
    )
    speed_after = None if reference is None else speed_probe(
        plan, reference, probes / "after", tokenizer_path=tokenizer,
        telemetry_interval_s=telemetry_interval_s)
    _record_knobs(live_dir, plan, knobs)
    live_timelines = read_timelines(live_dir)
    predicted = run_simulation(as_sent(trace, live_timelines), config, sim_dir, slo=slo,
                               command=command, knobs=jsonable(knobs.as_dict()))
    fid = fidelity(
        predicted, measured, read_timelines(sim_dir), live_timelines,
        predicted_steps=_read_table(sim_dir / STEPS_FILE),
        measured_telemetry=_read_table(live_dir / TELEMETRY_FILE),
    )
    # A calibration burst again, right before and after the replay: how far the machine's
    # speed has drifted since calibration (a shared host drifts by 10-30%).
    fid["engine_speed_vs_calibration"] = {
        "before": speed_before, "after": speed_after,
        "burst": None if reference is None else reference.get("name")}
    fid["context"] = {
        "profile": str(profile),
        "profile_source": params.source,
        "device": device,
        "reference_model": reference_model,
        "engine": plan.engine,
        "base_url": plan.base_url,
        "knobs": jsonable(knobs.as_dict()),
        "kv_cache": None if kv is None else {"block_size": kv.block_size,
                                              "num_blocks": kv.num_blocks},
        "trace": {"source": trace.source, "digest": trace.digest,
                  "num_requests": len(trace.requests)},
        "arrivals": "simulated requests arrive when the live client sent them, so the "
                    "client's own lateness is not counted as a prediction error",
        "live_dir": LIVE_DIR,
        "simulated_dir": SIMULATED_DIR,
    }
    write_json_atomic(fid, out_dir / FIDELITY_FILE)
    write_parquet_atomic(per_request_errors(read_timelines(sim_dir), live_timelines),
                         out_dir / PER_REQUEST_FILE)
    (out_dir / FIDELITY_MARKDOWN_FILE).write_text(render_fidelity_markdown(fid))
    return fid


def as_sent(trace: Trace, live: Sequence[RequestTimeline]) -> Trace:
    """The trace with each request arriving when the live client actually sent it.

    Latencies of a live run are measured from the send (``RequestTimeline.start_s``); a
    client that fell behind the trace's schedule changed the load the engine saw. Simulating
    the sends instead of the schedule compares the engines on the same load. Requests the
    client never sent keep their trace arrival. Same source and digest: the same trace.
    """
    sent = {tl.request_id: tl.sent_s for tl in live if tl.sent_s is not None}
    requests = sorted((replace(r, arrival_s=max(0.0, sent.get(r.request_id, r.arrival_s)))
                       for r in trace.requests), key=lambda r: r.arrival_s)
    return replace(trace, requests=tuple(requests))


def _profile_metadata(profile: str) -> dict[str, Any]:
    try:
        raw = json.loads(Path(profile).read_text())
    except (OSError, ValueError):
        return {}
    meta = raw.get("metadata") if isinstance(raw, dict) else None
    return meta if isinstance(meta, dict) else {}


def _record_knobs(live_dir: Path, plan: LaunchPlan, knobs: Knobs) -> None:
    """The live run attached to the server, so its manifest says "knobs not applied"; record
    the knobs the server runs with (and, when batchlab launched it, the launch's mapping)."""
    fields: dict[str, Any] = {"knobs": jsonable(knobs.as_dict())}
    if plan.launch:
        engine = dict(read_manifest(live_dir).get("engine") or {})
        engine["mode"] = "launch"
        fields.update(
            engine=engine,
            mapping=[jsonable(asdict(m)) for m in plan.mapping],
            launch={"argv": list(plan.argv),
                    "env": {k: v for k, v in plan.env.items() if not _SECRET.search(k)}},
            knobs_note="launched by batchlab validate with these knobs",
        )
    else:
        fields["knobs_note"] = ("declared on the command line: the server was started outside "
                                "batchlab with these settings")
    update_manifest(live_dir, fields)


def _read_table(path: Path) -> pa.Table | None:
    try:
        return pq.read_table(path)
    except (OSError, ValueError):
        return None
