"""Prediction fidelity: a simulated run's figures against a live run's, and its report section.

The comparison (``fidelity``) and its markdown (``render_fidelity_markdown``) are pure
functions: ``batchlab validate`` writes them as ``fidelity.json`` and ``fidelity.md``, and the
report renders them for every live cell it can pair with a simulated cell of the same trace.
The shape of ``fidelity``'s dict::

    {"ttft_s": {"p50": {"predicted": s, "measured": s, "relative_error": e}, "p90": ..., ...},
     "tpot_s": {...}, "e2e_s": {...},
     "output_tokens_per_s": {"predicted": x, "measured": x, "relative_error": e},
     "num_completed": {"predicted": n, "measured": n},
     "requests_compared": {"basis": "all completed" | "completed on both sides",
                           "num_compared": n, "note": text | None},  (common_requests_only)
     "per_request": {"num_matched": n, "ttft_s": {"median_abs": e, "p90_abs": e, "median": e}, ...},
     "running_batch_size": {"mean": {...}, "p90": {...}, "max": {...}, "series": ...},
     "in_flight_requests": {"mean": {...}, "max": {...}}}     (when both sides have them)

``relative_error = (predicted - measured) / measured``: signed, so +0.1 means the reference
predicted 10% too high; None when the measured value is missing or zero.

With ``common_requests_only`` (``batchlab validate``), percentiles and throughput compare like
with like: when the two sides completed different requests (the live engine died mid-replay, a
request failed on one side), both are computed over the requests completed on both sides only
(throughput: their output tokens over each run's own ``duration_s``), and ``requests_compared``
says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from harness.columns import numbers
from harness.metrics import request_metrics, summarize
from harness.report.format import code, fmt_number, fmt_seconds, table, value_text
from harness.report.predictions import UNRECORDED, is_served_prediction, predictor
from harness.report.runs import (
    TELEMETRY_FILE,
    CellResult,
    engine_config,
    read_table,
    trace_digest,
)
from harness.results import STEPS_FILE, read_timelines
from harness.timeline import RequestTimeline

METRICS = ("ttft_s", "tpot_s", "e2e_s")
PERCENTILES = ("p50", "p90", "p99")
_LABELS = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E latency"}
BATCH_GRID_S = 0.25  # the telemetry scraper's default interval


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


def _duration(summary: Mapping[str, Any]) -> float | None:
    """A summary's ``duration_s`` when it has a usable one."""
    value = _get(summary, "duration_s")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value) and value > 0 else None


def fidelity(
    predicted_summary: Mapping[str, Any],
    measured_summary: Mapping[str, Any],
    predicted_timelines: Sequence[RequestTimeline] | None = None,
    measured_timelines: Sequence[RequestTimeline] | None = None,
    *,
    predicted_steps: pa.Table | None = None,
    measured_telemetry: pa.Table | None = None,
    common_requests_only: bool = False,
) -> dict[str, Any]:
    """Predicted (simulated) against measured (live) figures; see the module doc for the shape.

    Summaries are ``summary.json`` dicts (``harness.metrics.summarize``). With both timeline
    lists, requests are matched by id for per-request errors; with ``common_requests_only``
    too, when the sides completed different requests every figure is computed over those
    completed on both (module doc). With the simulation's step table and the live run's
    telemetry table, the running batch sizes over time are compared too (a run-wide series:
    left out when restricted to a subset).
    """
    out: dict[str, Any] = {}
    compared: dict[str, Any] | None = None
    num_completed = {"predicted": _get(predicted_summary, "num_completed"),
                     "measured": _get(measured_summary, "num_completed")}
    if (common_requests_only and predicted_timelines is not None
            and measured_timelines is not None):
        p_ok = {tl.request_id for tl in predicted_timelines if tl.ok}
        m_ok = {tl.request_id for tl in measured_timelines if tl.ok}
        compared = {"basis": "all completed", "num_compared": len(p_ok & m_ok), "note": None}
        if p_ok != m_ok:
            both = p_ok & m_ok
            predicted_timelines = [tl for tl in predicted_timelines if tl.request_id in both]
            measured_timelines = [tl for tl in measured_timelines if tl.request_id in both]
            # throughput stays over each run's own duration (docs/metrics.md): the span of
            # the requests kept would leave out the time the others took
            predicted_summary = summarize(predicted_timelines,
                                          duration_s=_duration(predicted_summary))
            measured_summary = summarize(measured_timelines,
                                         duration_s=_duration(measured_summary))
            compared.update(basis="completed on both sides", note=(
                f"the live run completed {_requests(len(m_ok))} and the prediction "
                f"{len(p_ok):,}: every figure is over the {len(both):,} completed on both "
                "sides (over each side's own, they would compare different requests); "
                "throughput is their output tokens over each run's own duration"))
            predicted_steps = measured_telemetry = None
    for metric in METRICS:
        out[metric] = {
            pct: compare(_get(predicted_summary, metric, pct), _get(measured_summary, metric, pct))
            for pct in PERCENTILES
        }
    out["output_tokens_per_s"] = compare(
        _get(predicted_summary, "throughput", "output_tokens_per_s"),
        _get(measured_summary, "throughput", "output_tokens_per_s"),
    )
    out["num_completed"] = num_completed
    if compared is not None:
        out["requests_compared"] = compared
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


def _requests(n: int) -> str:
    return f"{n:,} request" + ("" if n == 1 else "s")


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
        values = np.asarray(numbers(errors.column(f"{metric}_relative_error")),
                            dtype=np.float64)
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
    t = np.asarray(numbers(steps.column("t_s")), dtype=np.float64)
    n = np.asarray(numbers(steps.column("num_running")), dtype=np.float64)
    if t.size == 0:
        return None
    if "duration_s" in steps.column_names:
        # Idle gaps between steps (waiting for arrivals) count as zero running requests.
        d = np.asarray(numbers(steps.column("duration_s")), dtype=np.float64)
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
    t = np.asarray(numbers(telemetry.column("t_s")), dtype=np.float64)
    n = np.asarray(numbers(telemetry.column("num_running")), dtype=np.float64)
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
                             level: int = 2, intro: bool = True,
                             live_engine: Mapping[str, Any] | None = None) -> str:
    """The report section for one fidelity dict (from ``fidelity``): a table and a sentence.

    ``live_engine``: the live run's manifest ``engine`` record. When it carries a prediction
    record (the reference engine served over HTTP), the live side is a prediction too, and
    its column and a sentence say so. Without it, ``fid``'s ``context.engine`` (what
    ``batchlab validate`` drove) decides: ``reference`` is the reference engine served."""
    served = _served_predictor(fid, live_engine)
    side = "measured" if served is None else "served"
    lines = ["#" * level + " " + title, ""]
    if intro:
        lines += ["The reference engine's prediction (simulated, with the same knobs and a "
                  "calibration profile) against "
                  + ("what the live engine measured" if served is None
                     else "the reference engine served over HTTP")
                  + f" on the same trace. Error = (predicted − {side}) / {side}.", ""]
    if served is not None:
        lines += ["The live side is the reference engine served over HTTP, itself a "
                  f"prediction: its step times are predicted with {served}, and only HTTP, "
                  "the client and real time are measured. Its column is no measurement of "
                  "hardware: each error is one prediction against another.", ""]
    compared = fid.get("requests_compared") or {}
    if compared.get("note"):
        lines += [f"**Compared on {_requests(compared.get('num_compared', 0))} only**: "
                  f"{compared['note']}.", ""]
    for warning in fid.get("warnings") or []:
        lines += [f"Warning: {warning}.", ""]
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
    live = "measured" if served is None else "served reference (itself predicted)"
    lines += [table(["metric", "predicted", live, "error"], rows), ""]
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


def _served_predictor(fid: Mapping[str, Any], live_engine: Mapping[str, Any] | None
                      ) -> str | None:
    """What predicted the live side's figures when it was the reference engine served over
    HTTP ("profile `x`", "catalog coefficients", or "its cost model" when only ``fid``'s
    context says which engine it was); None for a measurement."""
    if live_engine is not None:
        return predictor(live_engine)
    context = fid.get("context")
    if isinstance(context, Mapping) and context.get("engine") == "reference":
        return "its cost model"
    return None


# ---------------------------------------------------------------- the report section


# A reference run's settings (its manifest's ``config``; a served one's ``/version``
# answer) that make its cost model: two runs that differ in one predict other step times
# (the coefficients' digest last: named only when nothing else differs).
_COST_MODEL_KEYS = ("model", "gpu", "tp", "weights_dtype", "kv_cache_dtype",
                    "cost_model_digest")


def fidelity_pairs(ok: Sequence[CellResult]) -> list[tuple[CellResult, CellResult]]:
    """(live, simulated) cells that ran the same trace (same digest): the simulated one with the
    same knobs when there is one, else the first simulated one. A served reference engine (a
    prediction itself) is paired first with a simulation by its own cost model, the one with
    its settings when there is one: that comparison shows what HTTP, the client and real time
    add; against another cost model (a profile calibrated on it), the two models' differences
    (``prediction_section`` says which)."""
    pairs = []
    for live in ok:
        if live.mode != "live" or trace_digest(live) is None:
            continue
        sims = [c for c in ok if c.mode == "simulated"
                and trace_digest(c) == trace_digest(live)]
        if sims:  # (min: the first of the best)
            pairs.append((live, min(sims, key=partial(_unlikeness, live))))
    return pairs


def _unlikeness(live: CellResult, sim: CellResult) -> tuple[bool, bool, bool]:
    """What ``sim`` does not share with ``live``, most telling first: of a served reference,
    its cost model, then its settings; of any live cell, its knobs."""
    served = is_served_prediction(live)
    return (served and bool(_cost_model_differences(live, sim)),
            served and bool(_settings_differences(live, sim)),
            dict(sim.asked_knobs) != dict(live.asked_knobs))


def _cost_model_differences(served: CellResult, sim: CellResult) -> list[str]:
    """How the cost model of a served reference differs from a simulation's, in words
    ("served with catalog coefficients, simulated with profile `a`"; "gpu h100-sxm served,
    a100-80gb simulated"): what each was predicted with, and each of its settings
    (``_COST_MODEL_KEYS``) that both runs recorded; the coefficients' digest only when
    nothing else tells the two apart (a profile edited between the runs). A run that recorded
    no prediction record is not known to differ in what it was predicted with."""
    a, b = predictor(served.manifest.get("engine")), predictor(sim.manifest.get("engine"))
    out = ([] if a == b or UNRECORDED in (a, b)
           else [f"served with {a}, simulated with {b}"])
    out += _differences(served, sim, _COST_MODEL_KEYS[:-1])
    return out or _differences(served, sim, _COST_MODEL_KEYS[-1:])


def _settings_differences(served: CellResult, sim: CellResult) -> list[str]:
    """The scheduler settings both runs recorded (batch caps, policy, KV blocks, ...) that
    differ, in words ("max_num_seqs 256 served, 2048 simulated")."""
    keys = [k for k in engine_config(served)
            if k not in _COST_MODEL_KEYS and k != "cost_model"]  # (the source's name)
    return _differences(served, sim, keys)


def _differences(served: CellResult, sim: CellResult, keys: Sequence[str]) -> list[str]:
    a, b = engine_config(served), engine_config(sim)
    return [f"{k} {value_text(a[k])} served, {value_text(b[k])} simulated" for k in keys
            if k in a and k in b and value_text(a[k]) != value_text(b[k])]


def prediction_section(ok: Sequence[CellResult]) -> list[str]:
    """How well each simulated cell predicted a live cell of the same trace; of a served
    reference engine, what the comparison is of (``_served_pair_text``)."""
    pairs = fidelity_pairs(ok)
    if not pairs:
        return []
    lines = ["## Prediction fidelity", "",
             "Each live cell against the simulated cell that ran the same trace (the same knobs "
             "where one did; a served reference engine against a simulation by its own cost "
             "model where one did): error = (predicted - measured) / measured.", ""]
    for live, sim in pairs:
        steps = read_table(sim.run_dir / STEPS_FILE)
        telemetry = read_table(live.run_dir / TELEMETRY_FILE)
        sim_timelines: list[RequestTimeline] | None = None
        live_timelines: list[RequestTimeline] | None = None
        try:
            sim_timelines = read_timelines(sim.run_dir)
            live_timelines = read_timelines(live.run_dir)
        except (OSError, ValueError, KeyError):
            sim_timelines = live_timelines = None
        # over the requests completed on both sides, as `batchlab validate` compares them: a
        # live engine that died or refused requests would otherwise have its few completed
        # figures set against a whole simulated run's
        fid = fidelity(sim.summary or {}, live.summary or {}, sim_timelines, live_timelines,
                       predicted_steps=steps, measured_telemetry=telemetry,
                       common_requests_only=True)
        served = is_served_prediction(live)
        title = (f"{code(live.name)} served, {code(sim.name)} simulated" if served
                 else f"{code(live.name)} measured, {code(sim.name)} predicted")
        engine = live.manifest.get("engine")
        lines.append(render_fidelity_markdown(
            fid, title=title, level=3, intro=False,
            live_engine=engine if isinstance(engine, Mapping) else None))
        if served:
            lines += ["", _served_pair_text(live, sim), ""]
    return lines


def _served_pair_text(live: CellResult, sim: CellResult) -> str:
    """What a served reference against a simulation compares: by the same cost model, what
    HTTP, the client and real time add (and the settings they differ in, if any); by another,
    the two cost models, said plainly with what differs."""
    names = f"{code(live.name)} and {code(sim.name)}"
    models = _cost_model_differences(live, sim)
    settings = _listed(_settings_differences(live, sim))
    if models:
        other = f"; and other settings: {settings}" if settings else ""
        return (f"{names} predict with different cost models ({'; '.join(models)}{other}): "
                "the errors are the two models' differences together with what HTTP, the "
                "client and real time add, not what HTTP adds alone, and neither side is a "
                "measurement of hardware.")
    text = f"{names} predict with the same cost model ({predictor(live.manifest.get('engine'))})"
    if not settings:
        return (text + " and the same settings, so this compares the simulation with its own "
                "served form: what HTTP, the client and real time add, not a prediction with "
                "hardware.")
    return (text + f", but with other settings ({settings}): the errors are partly those "
            "settings', not only what HTTP, the client and real time add, and not a "
            "prediction's against hardware.")


def _listed(items: Sequence[str], most: int = 4) -> str:
    """``items`` joined by "; ", the first ``most`` of them and how many more."""
    more = f"; {len(items) - most} more" if len(items) > most else ""
    return "; ".join(items[:most]) + more
