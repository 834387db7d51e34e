"""The comparative markdown report: ``report.md`` with PNG plots beside it.

Everything is read back from run folders (``summary.json``, ``manifest.json``, the parquet
files, and for scenario sweeps ``cell.json`` / ``status.json`` / ``scenario.json``), so a report
can be re-rendered at any time without re-running, and folders made at different times (a
simulated reference run and a live vLLM run of the same trace) can be compared.

Layout of a report::

    # title                         question, trace + digest, model, GPU, engines, SLO
    ## Key findings                 generated sentences, largest differences first
    ## Cells                        knobs per cell, mapped engine flags, approximations
    ## Latency / Throughput / ...   one table per metric family, deltas against the baseline
    ## Per priority class           when classes exist
    ## Prediction fidelity          live cells against a simulated cell of the same trace
    ## Plots                        latency CDFs, engine state, throughput, batch-size sweep
    ## Reproduce                    the command, and a link to the metric definitions

The text depends only on the results on disk (no clock, no host), so the same results give the
same markdown: the golden tests rely on it.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from harness import plots
from harness.results import CHUNKS_FILE, REQUESTS_FILE, STEPS_FILE, SUMMARY_FILE

REPO_ROOT = Path(__file__).resolve().parent.parent
METRICS_DOC = REPO_ROOT / "docs" / "metrics.md"
MANIFEST_FILE = "manifest.json"
TELEMETRY_FILE = "telemetry.parquet"
CELL_FILE = "cell.json"
STATUS_FILE = "status.json"
SCENARIO_FILE = "scenario.json"
REPORT_FILE = "report.md"

LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E latency"))
PERCENTILES = ("p50", "p90", "p99")
SAME_WITHIN = 0.05  # relative differences under 5% are called "about the same"
MAX_COMPARISONS = 5  # cells compared with the baseline in the findings, largest first
MAX_PRIORITY_FINDINGS = 2  # per-class comparisons in the findings
ENGINE_STATE_POINTS = 600  # points per cell in the engine-state plot


# ---------------------------------------------------------------- formatting


def sig(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` significant digits, thousands separated, no trailing zeros."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    places = digits - 1 - math.floor(math.log10(abs(value)))
    rounded = round(value, places)
    if places <= 0:
        return f"{int(rounded):,}"
    text = f"{rounded:,.{places}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def fmt_seconds(value: float | None) -> str:
    """Latencies for humans: µs and ms below a second, s above; 3 significant digits."""
    if _missing(value):
        return "–"
    assert value is not None
    a = abs(value)
    if a == 0:
        return "0 ms"
    if a < 1e-3 and round(a * 1e6, 3 - 1 - math.floor(math.log10(a * 1e6))) < 1000:
        return f"{sig(value * 1e6)} µs"
    if a < 1 and float(sig(a * 1e3).replace(",", "")) < 1000:
        return f"{sig(value * 1e3)} ms"
    return f"{sig(value)} s"


def fmt_number(value: float | None, unit: str = "") -> str:
    if _missing(value):
        return "–"
    assert value is not None
    text = sig(value) if abs(value) < 1e15 else f"{value:.3g}"
    return f"{text} {unit}".rstrip()


def fmt_int(value: Any) -> str:
    return "–" if _missing(value) else f"{int(value):,}"


def fmt_pct(fraction: float | None) -> str:
    if _missing(fraction):
        return "–"
    assert fraction is not None
    pct = fraction * 100
    if pct in (0, 100):
        return f"{pct:.0f}%"
    return f"{pct:.1f}%"


def fmt_ratio(ratio: float) -> str:
    return f"{sig(ratio, 2)}×" if ratio < 10 else f"{ratio:,.0f}×"


def fmt_delta(value: float | None, base: float | None) -> str:
    """``+12%``, ``-94%``, ``2.8×`` (two-fold and more), ``1/280`` (a fall of 95% and more:
    "-100%" would hide how large it was), or ``""`` when not comparable."""
    if _missing(value) or _missing(base) or base == 0:
        return ""
    assert value is not None and base is not None
    ratio = value / base
    if ratio >= 2:
        return fmt_ratio(ratio)
    if 0 < ratio <= 0.05:
        return f"1/{fmt_number(1 / ratio)}"
    change = (ratio - 1) * 100
    if abs(change) < 0.5:
        return "±0%"
    return f"{change:+.0f}%"


def _with_delta(text: str, value: float | None, base: float | None, is_base: bool) -> str:
    if is_base or text == "–":
        return text
    delta = fmt_delta(value, base)
    return f"{text} ({delta})" if delta else text


def _short(text: str, limit: int = 200) -> str:
    """A reason on one line, cut at ``limit`` characters (the cell's error.txt has it all)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _code(text: Any) -> str:
    return f"`{text}`"


def _cell_text(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]],
          align: Sequence[str] | None = None) -> str:
    """A GitHub markdown table; ``align`` is "l" or "r" per column (default: l then r)."""
    align = align or ["l"] + ["r"] * (len(headers) - 1)
    lines = ["| " + " | ".join(_cell_text(h) for h in headers) + " |",
             "|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell_text(c) for c in row) + " |")
    return "\n".join(lines)


def get(summary: Mapping[str, Any] | None, dotted: str) -> Any:
    """``get(s, "ttft_s.p90")``; None when any part is missing."""
    node: Any = summary
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _display_path(text: str | None) -> str:
    if not text:
        return "–"
    path = Path(text)
    if path.is_absolute():
        try:
            return str(path.resolve().relative_to(REPO_ROOT))
        except (ValueError, OSError):
            return text
    return text


# ---------------------------------------------------------------- loading results


@dataclass(frozen=True)
class CellResult:
    """One column of the comparison: a run folder and what is known about it."""

    name: str
    run_dir: Path
    state: str  # "done", "failed", "running" (interrupted), "not_run"
    reason: str = ""
    summary: Mapping[str, Any] | None = None
    manifest: Mapping[str, Any] = field(default_factory=dict)
    cell: Mapping[str, Any] = field(default_factory=dict)  # cell.json of a scenario sweep

    @property
    def ok(self) -> bool:
        return self.state == "done" and self.summary is not None

    @property
    def knobs(self) -> Mapping[str, Any]:
        return self.cell.get("knobs") or self.manifest.get("knobs") or {}

    @property
    def engine(self) -> str:
        engine = self.cell.get("engine")
        if isinstance(engine, Mapping) and engine.get("engine"):
            return str(engine["engine"])
        return _manifest_engine(self.manifest)[0] or "–"

    @property
    def engine_version(self) -> str | None:
        return _manifest_engine(self.manifest)[1]

    @property
    def mode(self) -> str:
        engine = self.cell.get("engine")
        if isinstance(engine, Mapping) and engine.get("mode"):
            return str(engine["mode"])
        return str(self.manifest.get("kind") or "–")


def _manifest_engine(manifest: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(engine name, version) from the manifest's ``engine`` record (harness/manifest.py)."""
    engine = manifest.get("engine")
    if not isinstance(engine, Mapping):
        return None, None
    version = engine.get("version")
    return (str(engine["name"]) if engine.get("name") else None,
            str(version) if version else None)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load_run(run_dir: Path, name: str | None = None) -> CellResult:
    """A run folder (a scenario cell or a single ``simulate``/``replay`` run)."""
    run_dir = Path(run_dir)
    status = _read_json(run_dir / STATUS_FILE)
    summary = _read_json(run_dir / SUMMARY_FILE) or None
    if status:
        state = str(status.get("state", "running"))
    elif summary is not None:
        state = "done"
    else:
        state = "not_run"
    reason = str(status.get("reason", ""))
    if state == "done" and summary is None:
        state, reason = "failed", f"no {SUMMARY_FILE} in {run_dir}"
    if state == "running":
        reason = reason or "interrupted before it finished (re-run with --resume)"
    return CellResult(
        name=name or run_dir.name, run_dir=run_dir, state=state, reason=reason,
        summary=summary if state == "done" else None,
        manifest=_read_json(run_dir / MANIFEST_FILE), cell=_read_json(run_dir / CELL_FILE),
    )


def load_scenario_dir(scenario_dir: Path) -> tuple[dict[str, Any], list[CellResult]]:
    """``scenario.json`` and every cell of the scenario, in scenario order."""
    meta = _read_json(scenario_dir / SCENARIO_FILE)
    names = list(meta.get("cells") or [])
    if not names:
        names = sorted(p.name for p in scenario_dir.iterdir() if p.is_dir() and (
            (p / STATUS_FILE).exists() or (p / SUMMARY_FILE).exists()))
    cells = []
    for name in names:
        cell_dir = scenario_dir / name
        if cell_dir.is_dir():
            cells.append(load_run(cell_dir, name))
        else:
            cells.append(CellResult(name=name, run_dir=cell_dir, state="not_run",
                                    reason="not run yet (or excluded by --only)"))
    return meta, cells


def _read_columns(path: Path, columns: Sequence[str]) -> dict[str, np.ndarray] | None:
    if not path.exists():
        return None
    try:
        schema = pq.read_schema(path)
        wanted = [c for c in columns if c in schema.names]
        tab = pq.read_table(path, columns=wanted)
    except (OSError, ValueError):
        return None
    return {c: tab.column(c).to_numpy(zero_copy_only=False) for c in wanted}


def _first(cols: Mapping[str, np.ndarray], names: Sequence[str]) -> np.ndarray | None:
    for name in names:
        if name in cols:
            return np.asarray(cols[name], dtype=np.float64)
    return None


def read_engine_state(run_dir: Path) -> plots.EngineState | None:
    """Running / waiting / KV usage over time from ``steps.parquet`` (simulation) or
    ``telemetry.parquet`` (live), down-sampled to a fixed number of points."""
    steps = _read_columns(run_dir / STEPS_FILE, ("t_s", "num_running", "num_waiting",
                                                 "num_kv_blocks_used", "num_kv_blocks_total"))
    if steps and "t_s" in steps:
        t = np.asarray(steps["t_s"], dtype=np.float64)
        kv = None
        if "num_kv_blocks_used" in steps and "num_kv_blocks_total" in steps:
            total = np.asarray(steps["num_kv_blocks_total"], dtype=np.float64)
            with np.errstate(divide="ignore", invalid="ignore"):
                kv = np.where(total > 0, steps["num_kv_blocks_used"] / total, np.nan)
        state = plots.EngineState(t_s=t, num_running=_first(steps, ("num_running",)),
                                  num_waiting=_first(steps, ("num_waiting",)), kv_usage=kv)
        return _downsample(state)
    tele = _read_columns(run_dir / TELEMETRY_FILE, (
        "t_s", "time_s", "num_running", "running", "num_waiting", "waiting",
        "kv_usage", "kv_cache_usage", "kv_usage_frac", "kv_cache_usage_perc",
    ))
    if not tele:
        return None
    t_raw = _first(tele, ("t_s", "time_s"))
    if t_raw is None:
        return None
    kv = _first(tele, ("kv_usage", "kv_cache_usage", "kv_usage_frac", "kv_cache_usage_perc"))
    if kv is not None and np.nanmax(kv, initial=0) > 1.0:  # a percentage
        kv = kv / 100.0
    return _downsample(plots.EngineState(
        t_s=t_raw, num_running=_first(tele, ("num_running", "running")),
        num_waiting=_first(tele, ("num_waiting", "waiting")), kv_usage=kv))


def _downsample(state: plots.EngineState) -> plots.EngineState:
    t = state.t_s
    if t.size <= ENGINE_STATE_POINTS:
        return state
    order = np.argsort(t, kind="stable")
    t = t[order]
    grid = np.linspace(t[0], t[-1], ENGINE_STATE_POINTS)
    idx = np.clip(np.searchsorted(t, grid, side="right") - 1, 0, t.size - 1)

    def pick(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else np.asarray(a)[order][idx]

    return plots.EngineState(t_s=grid, num_running=pick(state.num_running),
                             num_waiting=pick(state.num_waiting), kv_usage=pick(state.kv_usage))


def _request_columns(run_dir: Path) -> dict[str, np.ndarray]:
    return _read_columns(run_dir / REQUESTS_FILE,
                         ("ttft_s", "tpot_s", "e2e_s", "num_preemptions")) or {}


# ---------------------------------------------------------------- report context


@dataclass(frozen=True)
class ReportContext:
    """What the report says besides the numbers."""

    title: str
    question: str | None = None
    baseline: str | None = None  # cell name; default: the first cell that finished
    priority_names: Mapping[int, str] = field(default_factory=dict)
    slo: Mapping[str, float] | None = None
    command: Sequence[str] | None = None  # reproduces the whole report
    rerender: Sequence[str] | None = None  # re-renders it from saved results
    metrics_doc: str | None = None  # link target for docs/metrics.md; default relative
    scenario: Mapping[str, Any] = field(default_factory=dict)


def _metrics_link(ctx: ReportContext, out_dir: Path) -> str:
    if ctx.metrics_doc is not None:
        return ctx.metrics_doc
    return Path(os.path.relpath(METRICS_DOC, out_dir.resolve())).as_posix()


# ---------------------------------------------------------------- key findings


def _ratio(a: Any, b: Any) -> float | None:
    if _missing(a) or _missing(b) or b == 0 or a < 0 or b < 0:
        return None
    return float(a) / float(b)


def _log_score(*ratios: float | None) -> float:
    return max((abs(math.log(r)) for r in ratios if r is not None and r > 0), default=0.0)


def _throughput_phrase(c: CellResult, b: CellResult) -> tuple[str, float | None]:
    cv = get(c.summary, "throughput.output_tokens_per_s")
    bv = get(b.summary, "throughput.output_tokens_per_s")
    r = _ratio(cv, bv)
    if r is None:
        return "", None
    nums = f"({fmt_number(cv)} vs {fmt_number(bv)} tok/s)"
    if r >= 1 + SAME_WITHIN:
        return f"served {fmt_ratio(r)} the output tokens/s of {_code(b.name)} {nums}", r
    if r <= 1 - SAME_WITHIN:
        return (f"served {(1 - r) * 100:.0f}% fewer output tokens/s than {_code(b.name)} "
                f"{nums}"), r
    return f"served about the same output tokens/s as {_code(b.name)} {nums}", r


def _latency_phrase(label: str, cv: Any, bv: Any) -> tuple[str, float | None]:
    r = _ratio(cv, bv)
    if r is None:
        return "", None
    if abs(r - 1) < SAME_WITHIN:
        return f"{label} about the same ({fmt_seconds(cv)} vs {fmt_seconds(bv)})", r
    verb = "fell" if r < 1 else "rose"
    return f"{label} {verb} from {fmt_seconds(bv)} to {fmt_seconds(cv)}", r


def _attainment_phrase(c: CellResult, b: CellResult) -> str:
    cv = get(c.summary, "goodput.slo_attainment")
    bv = get(b.summary, "goodput.slo_attainment")
    if _missing(cv) or _missing(bv) or abs(cv - bv) < 0.005:
        return ""
    verb = "rose" if cv > bv else "fell"
    return f"SLO attainment {verb} from {fmt_pct(bv)} to {fmt_pct(cv)}"


def _comparison(c: CellResult, b: CellResult) -> tuple[float, str]:
    tp, r_tp = _throughput_phrase(c, b)
    ttft, r_ttft = _latency_phrase("TTFT p90", get(c.summary, "ttft_s.p90"),
                                   get(b.summary, "ttft_s.p90"))
    tpot, r_tpot = _latency_phrase("TPOT p90", get(c.summary, "tpot_s.p90"),
                                   get(b.summary, "tpot_s.p90"))
    slo = _attainment_phrase(c, b)
    parts = [p for p in (ttft, tpot, slo) if p]
    if tp:
        text = f"{_code(c.name)} {tp}"
        if parts:
            text += "; " + "; ".join(parts)
    elif parts:
        text = f"{_code(c.name)} against {_code(b.name)}: " + "; ".join(parts)
    else:
        return 0.0, ""
    return _log_score(r_tp, r_ttft, r_tpot), text + "."


def _leaders(cells: Sequence[CellResult]) -> str:
    def best(metric: str, pick: Callable[[Iterable[float]], float]) -> tuple[str, float] | None:
        values = [(c.name, get(c.summary, metric)) for c in cells]
        values = [(n, v) for n, v in values if not _missing(v)]
        if not values:
            return None
        target = pick(v for _, v in values)
        return next((n, v) for n, v in values if v == target)

    parts = []
    tp = best("throughput.output_tokens_per_s", max)
    if tp:
        parts.append(f"highest output throughput {_code(tp[0])} ({fmt_number(tp[1], 'tok/s')})")
    for metric, label in (("ttft_s.p90", "TTFT p90"), ("tpot_s.p90", "TPOT p90")):
        lo = best(metric, min)
        if lo:
            parts.append(f"lowest {label} {_code(lo[0])} ({fmt_seconds(lo[1])})")
    slo = best("goodput.slo_attainment", max)
    if slo:
        parts.append(f"best SLO attainment {_code(slo[0])} ({fmt_pct(slo[1])})")
    if not parts:
        return ""
    text = "; ".join(parts)
    return "Across all cells: " + text + "."


def _knob(c: CellResult, name: str) -> Any:
    return c.knobs.get(name)


def _sweep_cells(cells: Sequence[CellResult]) -> list[CellResult]:
    """Cells of a batch-size sweep: max_num_seqs takes several values and nothing else varies
    except the grid's other knobs (which split the sweep into series)."""
    with_bs = [c for c in cells if isinstance(_knob(c, "max_num_seqs"), int)]
    if len({_knob(c, "max_num_seqs") for c in with_bs}) < 2:
        return []
    return with_bs


def _series_key(c: CellResult, varying: Sequence[str]) -> str:
    """What besides max_num_seqs tells this cell's line apart: engine, other knobs, load."""
    engine = c.cell.get("engine") or {}
    load = c.cell.get("load") or {}
    parts = [str(engine.get("name") or c.engine)]
    parts += [f"{k}={_value_text(_knob(c, k))}" for k in varying if k != "max_num_seqs"]
    if load.get("kind") not in (None, "trace"):
        parts.append(_load_text(load))
    return ", ".join(parts)


def _batch_size_findings(cells: Sequence[CellResult], slo: Mapping[str, float] | None
                         ) -> list[str]:
    sweep = _sweep_cells(cells)
    if len(sweep) < 3:
        return []
    varying = _varying_knobs(sweep)
    if set(varying) - {"max_num_seqs"}:
        return []  # more than one dimension: the tables and plot say it better
    pts = sorted(sweep, key=lambda c: int(_knob(c, "max_num_seqs")))
    lo, hi = pts[0], pts[-1]
    out = []
    r = _ratio(get(hi.summary, "throughput.output_tokens_per_s"),
               get(lo.summary, "throughput.output_tokens_per_s"))
    tpot_lo, tpot_hi = get(lo.summary, "tpot_s.p90"), get(hi.summary, "tpot_s.p90")
    if r is not None:
        change = (f"rose {fmt_ratio(r)}" if r >= 1 + SAME_WITHIN else
                  f"fell {(1 - r) * 100:.0f}%" if r <= 1 - SAME_WITHIN else "stayed about the same")
        out.append(
            f"From max_num_seqs {_knob(lo, 'max_num_seqs')} to {_knob(hi, 'max_num_seqs')}, "
            f"output throughput {change} "
            f"({fmt_number(get(lo.summary, 'throughput.output_tokens_per_s'))} to "
            f"{fmt_number(get(hi.summary, 'throughput.output_tokens_per_s'))} tok/s) while "
            f"TPOT p90 went from {fmt_seconds(tpot_lo)} to {fmt_seconds(tpot_hi)}."
        )
    tpot_slo = (slo or {}).get("tpot_s")
    if tpot_slo:
        meeting = [c for c in pts if not _missing(get(c.summary, "tpot_s.p90"))
                   and get(c.summary, "tpot_s.p90") <= tpot_slo]
        if meeting:
            best = max(meeting, key=lambda c: int(_knob(c, "max_num_seqs")))
            out.append(
                f"The largest max_num_seqs whose TPOT p90 meets the {fmt_seconds(tpot_slo)} "
                f"TPOT SLO is {_knob(best, 'max_num_seqs')} ({_code(best.name)}: TPOT p90 "
                f"{fmt_seconds(get(best.summary, 'tpot_s.p90'))}, "
                f"{fmt_number(get(best.summary, 'throughput.output_tokens_per_s'), 'tok/s')})."
            )
        else:
            out.append(f"No max_num_seqs tried kept TPOT p90 within the "
                       f"{fmt_seconds(tpot_slo)} TPOT SLO.")
    return out


def _class_name(ctx: ReportContext, key: str) -> str:
    try:
        p = int(key)
    except ValueError:
        return f"priority {key}"
    name = ctx.priority_names.get(p)
    return f"{_code(name)} (priority {p})" if name else f"priority {p}"


def _priority_findings(cells: Sequence[CellResult], base: CellResult, ctx: ReportContext
                       ) -> list[str]:
    base_classes = get(base.summary, "by_priority") or {}
    if len(base_classes) < 2:
        return []
    scored = []
    for c in cells:
        if c is base:
            continue
        classes = get(c.summary, "by_priority") or {}
        phrases, ratios = [], []
        for key in sorted(base_classes, key=_priority_sort_key):
            if key not in classes:
                continue
            parts = []
            for metric, label in (("ttft_s.p90", "TTFT p90"), ("tpot_s.p90", "TPOT p90")):
                phrase, r = _latency_phrase(label, get(classes[key], metric),
                                            get(base_classes[key], metric))
                if phrase and (metric == "ttft_s.p90" or "about the same" not in phrase):
                    parts.append(phrase)
                    ratios.append(r)
            if parts:
                phrases.append(f"class {_class_name(ctx, key)} " + ", ".join(parts))
        if phrases:
            # A cell with another scheduling policy is what a per-class comparison is for.
            other_policy = _knob(c, "policy") != _knob(base, "policy")
            scored.append((other_policy, _log_score(*ratios), f"Under {_code(c.name)} rather "
                           f"than {_code(base.name)}: " + "; ".join(phrases) + "."))
    scored.sort(key=lambda s: (not s[0], -s[1]))
    return [text for _, score, text in scored[:MAX_PRIORITY_FINDINGS] if score > 0]


def _priority_sort_key(key: str) -> tuple[int, str]:
    try:
        return int(key), key
    except ValueError:
        return 1 << 30, key


def _preemption_finding(cells: Sequence[CellResult], counts: Mapping[str, int | None]) -> str:
    if not any((get(c.summary, "num_preemptions") or 0) > 0 for c in cells):
        return ""
    parts = []
    for c in cells:
        n = get(c.summary, "num_preemptions") or 0
        text = f"{_code(c.name)} {n:,}"
        preempted = counts.get(c.name)
        if n and preempted is not None:
            text += f" ({preempted:,} requests)"
        parts.append(text)
    return "Preemptions: " + ", ".join(parts) + "."


def key_findings(cells: Sequence[CellResult], base: CellResult | None, ctx: ReportContext,
                 preempted: Mapping[str, int | None]) -> list[str]:
    """Generated sentences: the largest differences against the baseline first."""
    ok = [c for c in cells if c.ok]
    out: list[str] = []
    if len(ok) == 1:
        sentence = _single_run_sentence(ok[0])
        out.append(sentence if len(cells) == 1 else
                   f"{_code(ok[0].name)} s{sentence[1:]}")  # "`x` served ..."
    elif ok and base is not None:
        scored = []
        for c in ok:
            if c is base:
                continue
            score, text = _comparison(c, base)
            if text:
                scored.append((score, text))
        scored.sort(key=lambda s: -s[0])  # stable: equal scores keep cell order
        out += [text for _, text in scored[:MAX_COMPARISONS]]
        if len(scored) > MAX_COMPARISONS:
            out.append(f"{len(scored) - MAX_COMPARISONS} more cells compare with "
                       f"{_code(base.name)} in the tables below.")
        if len(ok) >= 3:
            leaders = _leaders(ok)
            if leaders:
                out.append(leaders)
        out += _batch_size_findings(ok, ctx.slo)
        out += _priority_findings(ok, base, ctx)
    preemption = _preemption_finding(ok, preempted) if len(ok) > 1 else ""
    if preemption:
        out.append(preemption)
    for c in cells:
        if c.state in ("failed", "running"):
            reason = _short(c.reason) if c.reason else "no reason recorded"
            out.append(f"{_code(c.name)} did not finish: {reason.rstrip('.')}.")
    not_run = [c.name for c in cells if c.state == "not_run"]
    if not_run:
        out.append(f"{len(not_run)} cell{'s' if len(not_run) > 1 else ''} not run "
                   f"(excluded by --only or not yet run): {', '.join(map(_code, not_run))}.")
    for c in ok:
        failed = get(c.summary, "num_failed") or 0
        if failed:
            kinds = ", ".join(f"{k} {v:,}" for k, v in (get(c.summary, "failures") or {}).items())
            out.append(f"{_code(c.name)} failed {failed:,} of "
                       f"{get(c.summary, 'num_requests') or 0:,} requests ({kinds}).")
        if _client_limited(c):
            out.append(f"The client was the limit in {_code(c.name)} (send lag p99 "
                       f"{fmt_seconds(get(c.summary, 'send_lag_s.p99'))}): its latencies "
                       "include client delay.")
        frac = get(c.summary, "output_length_fidelity.fraction_reached_target")
        if not _missing(frac) and frac < 0.99:
            out.append(f"In {_code(c.name)} only {fmt_pct(frac)} of requests reached their "
                       "target output length, so its tokens/s is not comparable token for "
                       "token.")
        n_approx = len(_approximations(c))
        if n_approx:
            out.append(f"{_code(c.name)} ran with {n_approx} knob{'s' if n_approx > 1 else ''} "
                       "approximated or not applied (see Approximations).")
    if not ok:
        out.insert(0, "No cell produced results.")
    return out


def _single_run_sentence(c: CellResult) -> str:
    s = c.summary
    text = (f"Served {get(s, 'num_completed') or 0:,} of {get(s, 'num_requests') or 0:,} "
            f"requests in {fmt_seconds(get(s, 'duration_s'))}: "
            f"{fmt_number(get(s, 'throughput.output_tokens_per_s'), 'output tokens/s')}, "
            f"TTFT p90 {fmt_seconds(get(s, 'ttft_s.p90'))}, "
            f"TPOT p90 {fmt_seconds(get(s, 'tpot_s.p90'))}, "
            f"E2E p90 {fmt_seconds(get(s, 'e2e_s.p90'))}")
    attainment = get(s, "goodput.slo_attainment")
    if not _missing(attainment):
        text += f"; {fmt_pct(attainment)} of requests met the SLO"
    return text + "."


def _client_limited(c: CellResult) -> bool:
    value = c.manifest.get("client_limited")
    if value is None:
        value = get(c.summary, "client_limited")
    return bool(value)


def _approximations(c: CellResult) -> list[str]:
    out = [str(a) if not isinstance(a, Mapping) else
           f"{a.get('knob', '?')}: {a.get('note') or a.get('status', '')}".strip()
           for a in c.manifest.get("approximations") or []]
    listed = set(out)
    for m in c.manifest.get("mapping") or []:
        if not isinstance(m, Mapping) or m.get("status", "applied") == "applied":
            continue
        status = str(m.get("status")).replace("_", " ")
        text = f"{m.get('knob')}={_value_text(m.get('value'))} {status}"
        if m.get("note"):
            text += f" ({m['note']})"
        if text not in listed:
            out.append(text)
    return out


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value)) if value else "[]"
    return str(value)


# ---------------------------------------------------------------- sections


def _varying_knobs(cells: Sequence[CellResult]) -> list[str]:
    """Knobs that differ between the cells that recorded knobs (a cell that never started
    has none and is not a difference)."""
    known = [c for c in cells if c.knobs]
    names: list[str] = []
    for c in known:
        names += [k for k in c.knobs if k not in names]
    return [k for k in names
            if len({_value_text(c.knobs.get(k)) for c in known}) > 1]


def _header(cells: Sequence[CellResult], base: CellResult | None, ctx: ReportContext
            ) -> list[str]:
    lines = [f"# {ctx.title}", ""]
    if ctx.question:
        lines += [f"> **Question.** {ctx.question}", ""]
    rows: list[tuple[str, str]] = []
    traces: dict[str, list[str]] = {}
    for c in cells:
        trace = c.manifest.get("trace") or {}
        if not trace:
            continue
        key = f"{trace.get('source')}|{trace.get('digest')}"
        traces.setdefault(key, []).append(c.name)
    if traces:
        described = []
        for names in traces.values():
            c = next(x for x in cells if x.name == names[0])
            text = _trace_text(c)
            if len(traces) > 1:
                text += f" — {', '.join(map(_code, names))}"
            described.append(text)
        rows.append(("Trace", "<br>".join(described)))
    elif ctx.scenario.get("trace"):
        rows.append(("Trace", _code(_display_path(ctx.scenario["trace"].get("path")))))
    for key, label in (("model", "Model"), ("gpu", "GPU")):
        values = list(dict.fromkeys(
            str(c.manifest.get(key) or ctx.scenario.get(key) or "–") for c in cells
            if c.manifest or ctx.scenario))
        if values:
            rows.append((label, ", ".join(values)))
    engines = list(dict.fromkeys(_engine_text(c) for c in cells if c.manifest or c.cell))
    if engines:
        rows.append(("Engines", "; ".join(engines)))
    if ctx.slo:
        rows.append(("SLO", _slo_text(ctx.slo)))
    if base is not None and len(cells) > 1:
        rows.append(("Baseline", _code(base.name)))
    rows.append(("Client ever the limit", _client_text(cells)))
    lines += [table(("", ""), rows, align=("l", "l")), ""]
    return lines


def _trace_text(c: CellResult) -> str:
    trace = c.manifest.get("trace") or {}
    parts = [_code(_display_path(trace.get("source")))]
    fmt = trace.get("format")
    stats = trace.get("stats") or {}
    details = []
    if fmt:
        details.append(str(fmt))
    n = stats.get("num_requests", get(c.summary, "num_requests"))
    if n is not None:
        details.append(f"{int(n):,} requests")
    span = stats.get("span_s")
    if not _missing(span):
        details.append(f"over {fmt_seconds(span)}")
    for key, label in (("prompt_tokens_mean", "mean prompt"),
                       ("output_tokens_mean", "mean output")):
        if not _missing(stats.get(key)):
            details.append(f"{label} {fmt_number(stats[key])} tokens")
    if details:
        parts.append("(" + ", ".join(details) + ")")
    digest = trace.get("digest")
    if digest:
        parts.append(f"digest {_code(str(digest)[:12])}")
    return " ".join(parts)


def _engine_text(c: CellResult) -> str:
    version = c.engine_version
    if not version and c.engine == "reference":
        bv = c.manifest.get("batchlab_version")
        version = f"batchlab {bv}" if bv else None
    mode = c.mode
    text = c.engine
    if version:
        text += f" {version}"
    if mode not in ("–", ""):
        text += f" ({mode})"
    return text


def _slo_text(slo: Mapping[str, float]) -> str:
    labels = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}
    return ", ".join(f"{labels.get(k, k)} ≤ {fmt_seconds(v)}" for k, v in slo.items())


def _client_text(cells: Sequence[CellResult]) -> str:
    live = [c for c in cells if c.ok and c.mode == "live"]
    if not live:
        if any(c.mode == "live" for c in cells):
            return "not known: no live cell finished"
        return "not applicable: every cell was simulated" if any(c.ok for c in cells) else "–"
    limited = [c for c in live if _client_limited(c)]
    if not limited:
        return "no: every live cell's send lag stayed within its threshold"
    return "**yes**, in " + ", ".join(
        f"{_code(c.name)} (send lag p99 {fmt_seconds(get(c.summary, 'send_lag_s.p99'))})"
        for c in limited)


def _cells_section(cells: Sequence[CellResult]) -> list[str]:
    lines = ["## Cells", ""]
    varying = _varying_knobs(cells)
    all_knobs: list[str] = []
    for c in cells:
        all_knobs += [k for k in c.knobs if k not in all_knobs]
    common = [k for k in all_knobs if k not in varying]
    show_status = any(c.state != "done" for c in cells)
    show_load = any((c.cell.get("load") or {}).get("kind") not in (None, "trace") for c in cells)
    headers = ["cell", "engine", "mode"] + (["load"] if show_load else []) + varying
    if show_status:
        headers.append("status")
    rows = []
    for c in cells:
        row = [_code(c.name), c.engine, c.mode]
        if show_load:
            row.append(_load_text(c.cell.get("load") or {}))
        row += [_value_text(c.knobs.get(k)) if k in c.knobs else "–" for k in varying]
        if show_status:
            row.append(_status_text(c))
        rows.append(row)
    lines += [table(headers, rows, align=["l"] * len(headers)), ""]
    if common:
        first = next((c for c in cells if c.knobs), None)
        if first is not None:
            lines += ["Knobs common to every cell: " + ", ".join(
                f"{k}={_value_text(first.knobs.get(k))}" for k in common) + ".", ""]
    flags = [(c, _flags_text(c)) for c in cells]
    flags = [(c, f) for c, f in flags if f]
    if flags:
        lines += ["### Engine flags", "",
                  "Each cell's uniform knobs as its engine received them:", ""]
        lines += [f"- {_code(c.name)} ({c.engine}): {f}" for c, f in flags]
        lines.append("")
    lines += ["### Approximations", ""]
    approx = [(c, _approximations(c)) for c in cells]
    approx = [(c, a) for c, a in approx if a]
    if approx:
        for c, items in approx:
            lines += [f"- {_code(c.name)}: " + "; ".join(items)]
    else:
        lines.append("Nothing was approximated or left unapplied: every knob was applied as "
                     "given.")
    lines.append("")
    return lines


def _status_text(c: CellResult) -> str:
    if c.state == "done":
        return "done"
    if c.state == "not_run":
        return "not run"
    return f"{c.state}: {_short(c.reason)}" if c.reason else c.state


def _load_text(load: Mapping[str, Any]) -> str:
    kind, value = load.get("kind"), load.get("value")
    if kind in (None, "trace") or value is None:
        return "trace timing"
    if kind == "rate":
        return f"{sig(value)} req/s"
    if kind == "time_scale":
        return f"time × {sig(value)}"
    return f"{int(value)} users"


# Reference-engine settings that the scenario's knobs do not already show.
_REFERENCE_SETTINGS = ("policy", "admission", "preemption", "max_num_seqs",
                       "max_num_batched_tokens", "chunked_prefill", "weights_dtype",
                       "kv_cache_dtype", "num_gpu_blocks", "block_size", "max_model_len")


def _flags_text(c: CellResult) -> str:
    parts = []
    engine = c.manifest.get("engine")
    config = engine.get("config") if isinstance(engine, Mapping) else None
    if not c.manifest.get("mapping") and isinstance(config, Mapping):
        # The reference engine takes the knobs directly; show its resolved settings (the KV
        # block count and admission it derived) as `batchlab simulate` flags.
        for key in _REFERENCE_SETTINGS:
            value = config.get(key)
            if value is None:
                continue
            flag = "--" + key.replace("_", "-")
            if isinstance(value, bool):
                parts.append(_code(flag if value else "--no-" + key.replace("_", "-")))
            else:
                parts.append(_code(f"{flag} {value}"))
        return " ".join(parts)
    for m in c.manifest.get("mapping") or []:
        if not isinstance(m, Mapping):
            continue
        flags = m.get("flags") or []
        if isinstance(flags, str):
            flags = [flags]
        if flags:
            parts.append(_code(" ".join(str(f) for f in flags)))
    return " ".join(parts)


def _latency_section(ok: Sequence[CellResult], base: CellResult | None) -> list[str]:
    lines = ["## Latency", "",
             "Percentiles over successful requests; in brackets the change against "
             + (f"the baseline {_code(base.name)}." if base else "the baseline."), ""]
    for metric, label in LATENCIES:
        if not any(get(c.summary, f"{metric}.count") for c in ok):
            continue
        rows = []
        for c in ok:
            row: list[str] = [_code(c.name)]
            for p in PERCENTILES:
                v = get(c.summary, f"{metric}.{p}")
                bv = get(base.summary, f"{metric}.{p}") if base else None
                row.append(_with_delta(fmt_seconds(v), v, bv, c is base))
            row.append(fmt_seconds(get(c.summary, f"{metric}.mean")))
            rows.append(row)
        lines += [f"### {label}", "", table(["cell", *PERCENTILES, "mean"], rows), ""]
    return lines


def _throughput_section(ok: Sequence[CellResult], base: CellResult | None) -> list[str]:
    cols = (("throughput.requests_per_s", "requests/s"),
            ("throughput.input_tokens_per_s", "input tok/s"),
            ("throughput.output_tokens_per_s", "output tok/s"),
            ("throughput.total_tokens_per_s", "total tok/s"))
    rows = []
    for c in ok:
        row: list[str] = [_code(c.name)]
        for key, _ in cols:
            v = get(c.summary, key)
            row.append(_with_delta(fmt_number(v), v, get(base.summary, key) if base else None,
                                   c is base))
        row.append(fmt_seconds(get(c.summary, "duration_s")))
        rows.append(row)
    return ["## Throughput", "",
            "Completed requests and their tokens divided by the run's duration (first arrival "
            "to last event).", "",
            table(["cell", *(label for _, label in cols), "duration"], rows), ""]


def _goodput_section(ok: Sequence[CellResult], base: CellResult | None, ctx: ReportContext
                     ) -> list[str]:
    lines = ["## Goodput and SLO attainment", ""]
    if not any(get(c.summary, "goodput") for c in ok):
        return [*lines, "No SLO was set, so goodput is not computed.", ""]
    if ctx.slo:
        lines += [f"A request is good when it succeeded and met every SLO ({_slo_text(ctx.slo)});"
                  " attainment divides by requests sent.", ""]
    rows = []
    for c in ok:
        att = get(c.summary, "goodput.slo_attainment")
        batt = get(base.summary, "goodput.slo_attainment") if base else None
        att_text = fmt_pct(att)
        if c is not base and not _missing(att) and not _missing(batt):
            att_text += f" ({(att - batt) * 100:+.1f} pts)"
        gp = get(c.summary, "goodput.requests_per_s")
        rows.append([_code(c.name), fmt_int(get(c.summary, "goodput.num_good")),
                     fmt_int(get(c.summary, "num_requests")),
                     _with_delta(fmt_number(gp), gp,
                                 get(base.summary, "goodput.requests_per_s") if base else None,
                                 c is base),
                     att_text])
    lines += [table(["cell", "good requests", "requests", "goodput req/s", "SLO attainment"],
                    rows), ""]
    return lines


def _preemption_section(ok: Sequence[CellResult], preempted: Mapping[str, int | None]
                        ) -> list[str]:
    rows = []
    for c in ok:
        n = get(c.summary, "num_preemptions") or 0
        total = get(c.summary, "num_requests") or 0
        rows.append([_code(c.name), f"{n:,}", fmt_int(preempted.get(c.name)),
                     fmt_number(100 * n / total) if total else "–"])
    return ["## Preemptions", "",
            "A preemption frees a running request's KV blocks (recompute resets its progress, "
            "swap moves the blocks to host memory).", "",
            table(["cell", "preemptions", "requests preempted", "per 100 requests"], rows), ""]


def _fidelity_section(ok: Sequence[CellResult]) -> list[str]:
    rows = []
    for c in ok:
        rows.append([_code(c.name), fmt_int(get(c.summary, "num_completed")),
                     fmt_int(get(c.summary, "output_length_fidelity.num_reached_target")),
                     fmt_pct(get(c.summary, "output_length_fidelity.fraction_reached_target"))])
    return ["## Output-length fidelity", "",
            "Requests that produced at least the trace's output length (an engine that stops "
            "early serves fewer tokens).", "",
            table(["cell", "completed", "reached target", "fraction"], rows), ""]


def _failures_section(ok: Sequence[CellResult]) -> list[str]:
    kinds: list[str] = []
    for c in ok:
        kinds += [k for k in (get(c.summary, "failures") or {}) if k not in kinds]
    kinds.sort()
    rows = []
    for c in ok:
        failures = get(c.summary, "failures") or {}
        rows.append([_code(c.name), fmt_int(get(c.summary, "num_requests")),
                     fmt_int(get(c.summary, "num_completed")),
                     fmt_int(get(c.summary, "num_failed")),
                     *(fmt_int(failures.get(k, 0)) for k in kinds)])
    lines = ["## Failures", ""]
    if not kinds:
        lines += ["No request failed.", ""]
    lines += [table(["cell", "requests", "completed", "failed", *kinds], rows), ""]
    return lines


def _priority_section(ok: Sequence[CellResult], base: CellResult | None, ctx: ReportContext
                      ) -> list[str]:
    keys: list[str] = []
    for c in ok:
        keys += [k for k in (get(c.summary, "by_priority") or {}) if k not in keys]
    if not keys:
        return []
    keys.sort(key=_priority_sort_key)
    lines = ["## Per priority class", "",
             "Requests split by priority (lower values are served first under the priority "
             "policy; other policies ignore them). Deltas against the same class in the "
             "baseline.", ""]
    has_slo = any(get(c.summary, "goodput") for c in ok)
    for key in keys:
        rows = []
        base_cls = get(base.summary, f"by_priority.{key}") if base else None
        for c in ok:
            cls = get(c.summary, f"by_priority.{key}")
            if not cls:
                continue
            row: list[str] = [_code(c.name), fmt_int(get(cls, "num_requests"))]
            for metric in ("ttft_s.p50", "ttft_s.p90", "tpot_s.p90", "e2e_s.p90"):
                v = get(cls, metric)
                row.append(_with_delta(fmt_seconds(v), v, get(base_cls, metric), c is base))
            if has_slo:
                row.append(fmt_pct(get(cls, "goodput.slo_attainment")))
            rows.append(row)
        headers = ["cell", "requests", "TTFT p50", "TTFT p90", "TPOT p90", "E2E p90"]
        if has_slo:
            headers.append("SLO attainment")
        title = _class_name(ctx, key).replace("`", "")
        lines += [f"### Class {title}", "", table(headers, rows), ""]
    return lines


def _plots(ok: Sequence[CellResult], out_dir: Path, ctx: ReportContext) -> list[tuple[str, str]]:
    """Draw every plot there is data for; return (alt text, file name) in report order."""
    drawn: list[tuple[str, str]] = []
    if not ok:
        return drawn
    out_dir.mkdir(parents=True, exist_ok=True)
    latencies = {}
    for c in ok:
        cols = _request_columns(c.run_dir)
        latencies[c.name] = {m: cols[m] for m, _ in plots.LATENCY_PANELS if m in cols}
    if plots.latency_cdfs(latencies, out_dir / "latency_cdf.png"):
        drawn.append(("Latency CDFs (TTFT, TPOT, E2E) per cell", "latency_cdf.png"))
    states = {c.name: s for c in ok if (s := read_engine_state(c.run_dir)) is not None}
    if states and plots.engine_state(states, out_dir / "engine_state.png"):
        drawn.append(("Running batch size, waiting queue and KV usage over time",
                      "engine_state.png"))
    tput = {}
    for c in ok:
        chunks = _read_columns(c.run_dir / CHUNKS_FILE, ("t_s", "num_tokens"))
        if chunks and "t_s" in chunks and "num_tokens" in chunks:
            tput[c.name] = (np.asarray(chunks["t_s"], dtype=np.float64),
                            np.asarray(chunks["num_tokens"], dtype=np.float64))
    if tput and plots.throughput_over_time(tput, out_dir / "throughput.png"):
        drawn.append(("Output tokens per second over time", "throughput.png"))
    sweep = _sweep_cells(ok)
    if sweep:
        varying = _varying_knobs(sweep)
        series = {c.name: _series_key(c, varying) for c in sweep}
        if len(set(series.values())) == 1:
            series = dict.fromkeys(series, "")
        points = [plots.SweepPoint(
            series=series[c.name],
            max_num_seqs=int(_knob(c, "max_num_seqs")),
            tpot_p50_s=get(c.summary, "tpot_s.p50"), tpot_p90_s=get(c.summary, "tpot_s.p90"),
            output_tokens_per_s=get(c.summary, "throughput.output_tokens_per_s"),
        ) for c in sweep]
        tpot_slo = (ctx.slo or {}).get("tpot_s")
        if plots.batch_size_sweep(points, out_dir / "batch_size.png", tpot_slo_s=tpot_slo):
            drawn.append(("TPOT and throughput against max_num_seqs", "batch_size.png"))
    return drawn


def _trace_digest(c: CellResult) -> str | None:
    trace = c.manifest.get("trace") or {}
    digest = trace.get("digest")
    return str(digest) if digest else None


def fidelity_pairs(ok: Sequence[CellResult]) -> list[tuple[CellResult, CellResult]]:
    """(live, simulated) cells that ran the same trace (same digest): the simulated one with the
    same knobs when there is one, else the first simulated one."""
    pairs = []
    for live in ok:
        if live.mode != "live" or _trace_digest(live) is None:
            continue
        sims = [c for c in ok if c.mode == "simulated"
                and _trace_digest(c) == _trace_digest(live)]
        if not sims:
            continue
        same_knobs = [c for c in sims if dict(c.knobs) == dict(live.knobs)]
        pairs.append((live, (same_knobs or sims)[0]))
    return pairs


def _prediction_section(ok: Sequence[CellResult]) -> list[str]:
    """How well each simulated cell predicted a live cell of the same trace."""
    pairs = fidelity_pairs(ok)
    if not pairs:
        return []
    from harness import validate
    from harness.results import read_timelines
    from harness.timeline import RequestTimeline

    lines = ["## Prediction fidelity", "",
             "Each live cell against the simulated cell that ran the same trace (the same knobs "
             "where one did): error = (predicted - measured) / measured.", ""]
    for live, sim in pairs:
        steps = _read_table(sim.run_dir / STEPS_FILE)
        telemetry = _read_table(live.run_dir / TELEMETRY_FILE)
        sim_timelines: list[RequestTimeline] | None = None
        live_timelines: list[RequestTimeline] | None = None
        try:
            sim_timelines = read_timelines(sim.run_dir)
            live_timelines = read_timelines(live.run_dir)
        except (OSError, ValueError, KeyError):
            sim_timelines = live_timelines = None
        fid = validate.fidelity(sim.summary or {}, live.summary or {}, sim_timelines,
                                live_timelines, predicted_steps=steps,
                                measured_telemetry=telemetry)
        title = f"{_code(live.name)} measured, {_code(sim.name)} predicted"
        lines.append(validate.render_fidelity_markdown(fid, title=title, level=3, intro=False))
    return lines


def _read_table(path: Path) -> Any:
    if not path.exists():
        return None
    try:
        return pq.read_table(path)
    except (OSError, ValueError):
        return None


def _preempted_requests(ok: Sequence[CellResult]) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for c in ok:
        cols = _request_columns(c.run_dir)
        n = cols.get("num_preemptions")
        out[c.name] = int(np.count_nonzero(np.asarray(n) > 0)) if n is not None else None
    return out


def _reproduce(cells: Sequence[CellResult], ctx: ReportContext, out_dir: Path) -> list[str]:
    lines = ["## Reproduce", ""]
    if ctx.command:
        lines += ["Run it again:", "", "```sh", shlex.join(ctx.command), "```", ""]
    else:
        commands = [(c, list(c.manifest["command"])) for c in cells
                    if c.manifest.get("command")]
        if commands:
            lines += ["Each cell was produced by:", "", "```sh"]
            for c, cmd in commands:
                lines += [f"# {c.name}", shlex.join(str(a) for a in cmd)]
            lines += ["```", ""]
    if ctx.rerender:
        lines += ["Re-render this report from the saved results, without re-running:", "",
                  "```sh", shlex.join(ctx.rerender), "```", ""]
    lines += [f"Metric definitions (TTFT, TPOT, ITL, E2E, goodput): "
              f"[docs/metrics.md]({_metrics_link(ctx, out_dir)}).", ""]
    return lines


def render_markdown(cells: Sequence[CellResult], ctx: ReportContext, out_dir: Path,
                    *, draw: bool = True) -> str:
    """The report's text; draws its plots into ``out_dir`` when ``draw``."""
    ok = [c for c in cells if c.ok]
    base = None
    if ctx.baseline is not None:
        base = next((c for c in ok if c.name == ctx.baseline), None)
    if base is None and ok:
        base = ok[0]
    preempted = _preempted_requests(ok)
    lines = _header(cells, base, ctx)
    lines += ["## Key findings", ""]
    lines += [f"- {text}" for text in key_findings(cells, base, ctx, preempted)]
    if ctx.baseline and (base is None or base.name != ctx.baseline):
        lines.append(f"- The requested baseline {_code(ctx.baseline)} has no results; "
                     + (f"{_code(base.name)} is used instead." if base else "nothing to compare."))
    lines.append("")
    lines += _cells_section(cells)
    if ok:
        lines += _latency_section(ok, base)
        lines += _throughput_section(ok, base)
        lines += _goodput_section(ok, base, ctx)
        lines += _preemption_section(ok, preempted)
        lines += _fidelity_section(ok)
        lines += _failures_section(ok)
        lines += _priority_section(ok, base, ctx)
        lines += _prediction_section(ok)
    drawn = _plots(ok, out_dir, ctx) if draw else []
    if drawn:
        lines += ["## Plots", ""]
        for alt, name in drawn:
            lines += [f"![{alt}]({name})", ""]
    lines += _reproduce(cells, ctx, out_dir)
    return "\n".join(lines).rstrip() + "\n"


def write_report(cells: Sequence[CellResult], ctx: ReportContext, out_file: Path) -> Path:
    """Render and write ``out_file`` (atomically), plots beside it."""
    out_file = Path(out_file)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    text = render_markdown(cells, ctx, out_file.parent)
    tmp = out_file.with_name(out_file.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, out_file)
    return out_file


# ---------------------------------------------------------------- entry points


def _slo_from(cells: Sequence[CellResult], meta: Mapping[str, Any]) -> Mapping[str, float] | None:
    if meta.get("slo"):
        return dict(meta["slo"])
    for c in cells:
        slo = c.manifest.get("slo") or get(c.summary, "slo")
        if slo:
            return dict(slo)
    return None


def scenario_context(meta: Mapping[str, Any], cells: Sequence[CellResult], scenario_dir: Path,
                     *, baseline: str | None = None, metrics_doc: str | None = None
                     ) -> ReportContext:
    names = {int(p["priority"]): str(p["name"]) for p in meta.get("priority_classes") or []}
    names.update({int(k): str(v) for k, v in (meta.get("class_names") or {}).items()})
    command = meta.get("command")
    return ReportContext(
        title=f"Scenario {meta.get('name') or scenario_dir.name}",
        question=meta.get("question"),
        baseline=baseline or meta.get("baseline"),
        priority_names=names,
        slo=_slo_from(cells, meta),
        command=list(command) if command else None,
        rerender=["batchlab", "report", _display_path(str(scenario_dir))],
        metrics_doc=metrics_doc,
        scenario=meta,
    )


def render_scenario_report(scenario_dir: Path, *, out_file: Path | None = None,
                           baseline: str | None = None, metrics_doc: str | None = None) -> Path:
    """``<scenario_dir>/report.md`` comparing every cell of a scenario sweep."""
    scenario_dir = Path(scenario_dir)
    meta, cells = load_scenario_dir(scenario_dir)
    ctx = scenario_context(meta, cells, scenario_dir, baseline=baseline, metrics_doc=metrics_doc)
    return write_report(cells, ctx, out_file or scenario_dir / REPORT_FILE)


def render_run_report(run_dir: Path, *, metrics_doc: str | None = None) -> Path:
    """``<run_dir>/report.md`` for one ``simulate`` or ``replay`` run folder."""
    run_dir = Path(run_dir)
    cell = load_run(run_dir)
    ctx = ReportContext(
        title=f"Run {run_dir.name}",
        slo=_slo_from([cell], {}),
        command=[str(a) for a in cell.manifest.get("command") or []] or None,
        rerender=["batchlab", "report", _display_path(str(run_dir))],
        metrics_doc=metrics_doc,
    )
    return write_report([cell], ctx, run_dir / REPORT_FILE)


def collect(dirs: Sequence[Path]) -> tuple[list[CellResult], list[dict[str, Any]]]:
    """Run folders from the given directories: a scenario folder gives all its cells, a run
    folder gives itself. Names are made unique with the parent folder's name when needed."""
    cells: list[CellResult] = []
    metas: list[dict[str, Any]] = []
    for d in dirs:
        d = Path(d)
        if (d / SCENARIO_FILE).exists():
            meta, found = load_scenario_dir(d)
            metas.append(meta)
            cells += found
        elif any((d / f).exists() for f in (SUMMARY_FILE, STATUS_FILE, REQUESTS_FILE)):
            cells.append(load_run(d))
        else:
            raise FileNotFoundError(f"{d}: not a run folder or scenario folder (no "
                                    f"{SUMMARY_FILE}, {STATUS_FILE} or {SCENARIO_FILE})")
    seen: dict[str, int] = {}
    for c in cells:
        seen[c.name] = seen.get(c.name, 0) + 1
    unique = []
    for c in cells:
        if seen[c.name] > 1:
            c = CellResult(name=f"{c.run_dir.parent.name}/{c.name}", run_dir=c.run_dir,
                           state=c.state, reason=c.reason, summary=c.summary,
                           manifest=c.manifest, cell=c.cell)
        unique.append(c)
    return unique, metas


def render_comparison(dirs: Sequence[Path], out_file: Path, *, baseline: str | None = None,
                      title: str | None = None, metrics_doc: str | None = None) -> Path:
    """Compare run folders made at any time (``batchlab report DIR DIR ...``)."""
    cells, metas = collect(dirs)
    if len(dirs) == 1 and metas:
        meta = metas[0]
        ctx = scenario_context(meta, cells, Path(dirs[0]), baseline=baseline,
                               metrics_doc=metrics_doc)
    else:
        names = [c.name for c in cells]
        if baseline is not None and baseline not in names:
            raise ValueError(f"--baseline {baseline!r}: no such cell; cells: {', '.join(names)}")
        question = " / ".join(str(m["question"]) for m in metas if m.get("question")) or None
        ctx = ReportContext(
            title=title or "Comparison of " + ", ".join(names),
            question=question, baseline=baseline, slo=_slo_from(cells, {}),
            rerender=["batchlab", "report", *(_display_path(str(d)) for d in dirs),
                      *(["--baseline", baseline] if baseline else []),
                      "-o", _display_path(str(out_file))],
            metrics_doc=metrics_doc,
        )
    return write_report(cells, ctx, out_file)
