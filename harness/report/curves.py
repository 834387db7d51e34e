"""Load curves and capacity, read back from run folders: the data behind the report's
throughput–latency curves, its capacity-at-SLO table and its batch-size table.

    cells with a load (cell.json "load")  ──► Series per engine × knob setting, by load
    search.json of a capacity search      ──► SearchRecord (capacity, bracket, precision)
    Series + SearchRecord                 ──► CapacityRow: from the search when there is one,
                                              else interpolated between the load points
    a batch-size sweep + engine state     ──► BatchRow (running batch, KV use, regime)

A setting is the engine's name in the scenario plus its grid values, so the cells of one
setting at several loads, and the probes of its capacity search, fall together.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.manifest import read_manifest
from harness.metrics import attainment_text, num_cut_off
from harness.report.format import sig, slo_text, value_text
from harness.report.plots import CapacityMark
from harness.report.runs import CellResult, get, knob, preemptions, read_engine_samples
from harness.results import PROBE_FILE, SEARCH_FILE, failure_reason, read_json_object

DEFAULT_TARGET = 0.99  # SLO attainment a capacity keeps, when no search says otherwise
FLAT_GAIN = 0.5  # tokens/s growing at under half the batch's growth: past the turn
KV_FULL = 0.95  # KV use this high counts as a full cache
MIN_SWEEP_CAPS = 3  # caps a batch-size series needs for its table and tuning findings


# ---------------------------------------------------------------- settings and load curves


def setting_key(engine: Any, grid: Mapping[str, Any] | None) -> str:
    """``fcfs`` or ``fcfs, max_num_seqs=64``: how the report names an engine × knob setting."""
    parts = [str(engine)]
    parts += [f"{k}={value_text(v)}" for k, v in (grid or {}).items()]
    return ", ".join(parts)


def cell_setting(c: CellResult) -> str | None:
    engine = c.cell.get("engine")
    if not isinstance(engine, Mapping) or not engine.get("name"):
        return None
    return setting_key(engine["name"], c.cell.get("grid"))


@dataclass(frozen=True, slots=True)
class Baselines:
    """What each cell is compared with. At one load: the baseline cell. Across several loads
    (a scenario's rates, time scales or users), a change of load is not a change of setting:
    each cell is compared with the baseline setting's cell at its own load, and with nothing
    at a load where that setting has no result."""

    base: CellResult | None
    by_cell: Mapping[str, CellResult | None]
    per_load: bool  # cells at other loads than the baseline cell's are compared at their own
    # cells left uncompared because they, or the cell each would be compared with, ran part
    # of their trace (``CellResult.partial``): that cell, by name of the one left uncompared
    withheld: Mapping[str, CellResult] = field(default_factory=dict)

    @classmethod
    def of(cls, ok: Sequence[CellResult], base: CellResult | None) -> Baselines:
        """A cell that ended or was stopped early is compared with nothing, and nothing with
        it: its figures cover part of its trace (``CellResult.partial``)."""
        loads = {c.load for c in ok}
        setting = cell_setting(base) if base is not None else None
        per_load = base is not None and setting is not None and len(loads) >= 2
        by_cell: dict[str, CellResult | None]
        if base is None or not per_load:
            by_cell = dict.fromkeys((c.name for c in ok), base)
        else:
            at_load: dict[str, CellResult] = {}
            for c in ok:  # at a load, a whole run of the setting over one of part of it
                if cell_setting(c) == setting and (c.load not in at_load
                                                   or at_load[c.load].partial):
                    at_load[c.load] = c
            at_load[base.load] = base
            by_cell = {c.name: at_load.get(c.load) for c in ok}
        withheld: dict[str, CellResult] = {}
        for c in ok:
            b = by_cell[c.name]
            if b is not None and b is not c and (c.partial or b.partial):
                by_cell[c.name] = None
                withheld[c.name] = b
        return cls(base, by_cell, per_load, withheld)

    def of_cell(self, c: CellResult) -> CellResult | None:
        return self.by_cell.get(c.name)

    def compared(self) -> bool:
        """Whether any cell is shown against another (a single run has nothing to compare)."""
        return any(b is not None and b.name != name for name, b in self.by_cell.items())

    def phrase(self, code: Callable[[str], str] = str) -> str:
        """``the baseline `x```, or ``the baseline setting `x` at the same load``."""
        if self.base is None:
            return "the baseline"
        if self.per_load:
            return f"the baseline setting {code(str(cell_setting(self.base)))} at the same load"
        return f"the baseline {code(self.base.name)}"


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """One cell of a setting at one load."""

    cell: str
    load: float
    output_tokens_per_s: float | None
    tpot_p50_s: float | None
    tpot_p90_s: float | None
    ttft_p90_s: float | None
    attainment: float | None
    stopped: str | None = None
    slo: Mapping[str, float] | None = None  # the SLO its attainment was computed under
    # a capacity probe that failed the pace check, whatever its attainment: why ("fell
    # behind: ...", "too short to show a steady state: ..."): its search.json's ``behind``,
    # as the capacity table reads it, else its probe.json's
    behind: str | None = None
    # a closed-loop capacity probe: the attainment its search judged it by, once its users
    # were under way, and how many of their first requests that leaves out (probe.json)
    under_way: tuple[float, int] | None = None
    # stopped early: requests it cut off (``not_finished``), whose latencies no percentile
    # holds: those of the point are then a lower bound (docs/metrics.md)
    num_cut_off: int = 0


@dataclass(frozen=True)
class Series:
    """A setting across its load points, by load."""

    key: str
    kind: str  # rate, time_scale or concurrency
    points: tuple[CurvePoint, ...]


def load_series(ok: Sequence[CellResult]) -> list[Series]:
    """Settings measured at two or more loads, in report order."""
    groups: dict[tuple[str, str], list[CurvePoint]] = {}
    listed = _listed_probes(ok)
    for c in ok:
        key = cell_setting(c)
        load = c.cell.get("load") or {}
        if key is None or load.get("kind") in (None, "trace") or load.get("value") is None:
            continue
        s = c.summary
        groups.setdefault((key, str(load["kind"])), []).append(CurvePoint(
            cell=c.name, load=float(load["value"]),
            output_tokens_per_s=get(s, "throughput.output_tokens_per_s"),
            tpot_p50_s=get(s, "tpot_s.p50"), tpot_p90_s=get(s, "tpot_s.p90"),
            ttft_p90_s=get(s, "ttft_s.p90"), attainment=get(s, "goodput.slo_attainment"),
            stopped=get(s, "stopped_early"), slo=get(s, "slo") or None,
            behind=_behind(c.run_dir, listed) or _cell_behind(c),
            under_way=_probe_under_way(c.run_dir),
            num_cut_off=stopped_cut_off(s)))
    return [Series(key, kind, tuple(sorted(points, key=lambda p: p.load)))
            for (key, kind), points in groups.items() if len(points) >= 2]


def stopped_cut_off(summary: Mapping[str, Any] | None) -> int:
    """The requests a run stopped early cut off (``metrics.num_cut_off``); 0 for a run that
    was not stopped."""
    return num_cut_off(summary) if get(summary, "stopped_early") else 0


def _listed_probes(cells: Sequence[CellResult]) -> dict[Path, str | None]:
    """The pace verdict (``_pace_failure``) of every probe a capacity search beside the cells
    (``search.json`` in a cell's parent) lists, by its resolved run folder: read once per
    search, from the record the capacity table reads."""
    listed: dict[Path, str | None] = {}
    for parent in dict.fromkeys(c.run_dir.parent for c in cells):
        path = parent / SEARCH_FILE
        record = _read_search(path) if path.is_file() else None
        if record is not None:
            listed.update(record.probe_behind)
    return listed


def _cell_behind(c: CellResult) -> str | None:
    """A sweep's load point (no capacity probe) whose engine fell behind its arrivals: what
    the command line warned of it (``Pace.behind_warning``), as a probe's ``behind``."""
    pace = c.pace
    return (f"fell behind: {pace.behind_warning()}" if pace is not None and pace.overloaded
            else None)


def _behind(run_dir: Path, listed: Mapping[Path, str | None]) -> str | None:
    """Why a capacity probe failed the pace check: as its search's ``search.json`` lists it,
    else (no search lists it) its own ``probe.json``."""
    resolved = run_dir.resolve()
    return listed[resolved] if resolved in listed else _probe_behind(run_dir)


def _probe_under_way(run_dir: Path) -> tuple[float, int] | None:
    """A closed-loop capacity probe's attainment once its users were under way, and how many
    of their first requests that leaves out (its ``probe.json``); None for any other run."""
    probe = read_json_object(run_dir / PROBE_FILE)
    attainment, num = probe.get("attainment"), probe.get("num_warm_up")
    if not isinstance(attainment, int | float) or not isinstance(num, int) or not num:
        return None
    return float(attainment), num


def _probe_behind(run_dir: Path) -> str | None:
    """Why a capacity probe's run failed the pace check (its ``probe.json``), None when it is
    no probe or kept pace."""
    return _pace_failure(read_json_object(run_dir / PROBE_FILE))


def _pace_failure(probe: Mapping[str, Any]) -> str | None:
    """A probe's outcome (``ProbeOutcome.as_dict``, in ``probe.json`` or ``search.json``):
    why it failed the pace check, None when it kept pace or none was checked."""
    if probe.get("kept_pace") is not False:
        return None
    return str(probe.get("behind") or "fell behind")


# ---------------------------------------------------------------- capacity


@dataclass(frozen=True)
class SearchRecord:
    """A capacity search's ``search.json``, as the report needs it."""

    path: Path
    key: str
    kind: str
    unit: str
    status: str
    capacity: float | None
    passing: float | None
    failing: float | None
    target: float
    precision_text: str
    num_probes: int
    num_stopped: int
    num_behind: int = 0  # rate probes that met the SLO and failed only as falling behind
    num_short: int = 0  # ... or only as too short a trace to show a steady state
    # The bracket's failing probe, when it was not stopped: why it failed the pace check
    # (``harness.metrics.pace``), whatever its attainment, and its attainment, so that the
    # report says "met the SLO" only of a probe that did.
    behind: str | None = None
    failing_attainment: float | None = None
    load_cap: str | None = None  # why the highest load tried was that (search.json)
    precision: float | None = None  # rate: relative; concurrency: users
    probe_labels: Mapping[float, str] = field(default_factory=dict)  # load -> probe folder
    slo: Mapping[str, float] = field(default_factory=dict)
    probe_dirs: tuple[Path, ...] = ()
    knobs: Mapping[str, Any] = field(default_factory=dict)
    # each listed probe's pace verdict (``_pace_failure``), by its resolved run folder: the
    # curve table marks the same probes failed that the capacity table counts
    probe_behind: Mapping[Path, str | None] = field(default_factory=dict)
    # the answer in words where a capacity and its bound would mislead (search.json's
    # ``answer``): no load meets the SLO, or the trace too short to tell at the lowest load
    answer: str | None = None
    error: str | None = None  # a failed search: why (search.json's ``error``)


def find_searches(cells: Sequence[CellResult], slo: Mapping[str, float] | None
                  ) -> list[SearchRecord]:
    """``search.json`` files beside the cells: in a cell's parent (the probes of a search),
    in its siblings (a capacity folder's settings) and under ``capacity/`` (a capacity search
    run into a scenario's folder). Only the searches that measured this report's setting at
    its SLO (``search_applies``): a capacity is a fact about one setting, trace and SLO."""
    parents = list(dict.fromkeys(c.run_dir.parent for c in cells))
    paths: list[Path] = []
    for p in parents:
        paths += [p / SEARCH_FILE, *sorted(p.glob(f"*/{SEARCH_FILE}")),
                  *sorted(p.glob(f"capacity/*/{SEARCH_FILE}"))]
    out, seen = [], set()
    for path in paths:
        if not path.is_file() or path.resolve() in seen:
            continue
        seen.add(path.resolve())
        record = _read_search(path)
        if record is not None and search_applies(record, cells, slo):
            out.append(record)
    return out


def search_applies(r: SearchRecord, cells: Sequence[CellResult],
                   slo: Mapping[str, float] | None) -> bool:
    """Whether the search measured this report's SLO, and either its probes are cells of the
    report, or a cell of the same setting (scenario engine, grid point and knobs) ran the trace
    its probes ran (a search run into a scenario's folder; when its probe folders are gone,
    the setting alone decides)."""
    if {k: float(v) for k, v in r.slo.items()} != {k: float(v) for k, v in (slo or {}).items()}:
        return False
    run_dirs = {c.run_dir.resolve() for c in cells}
    if any(d.resolve() in run_dirs for d in r.probe_dirs):
        return True
    same = [c for c in cells if cell_setting(c) == r.key
            and any(_agree(r.knobs, k) for k in (c.asked_knobs, c.knobs))]
    probe_trace = next((t for t in map(_trace_of, r.probe_dirs) if t is not None), None)
    return any(probe_trace is None or _trace_of(c.run_dir) == probe_trace for c in same)


def _agree(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """The knobs both name have the same values."""
    return all(value_text(a[k]) == value_text(b[k]) for k in a.keys() & b.keys())


def _trace_of(run_dir: Path) -> tuple[str, int] | None:
    """The trace a run folder replayed, whatever its timing: (source, number of requests)."""
    trace = read_manifest(run_dir).get("trace")
    try:
        return str(trace["source"]), int(trace["num_requests"])  # type: ignore[index]
    except (ValueError, TypeError, KeyError):
        return None


def _read_search(path: Path) -> SearchRecord | None:
    try:
        d = json.loads(path.read_text())
        engine = d.get("engine") or {}
        bracket = d.get("bracket") or {}
        probes = d.get("probes") or []
        failing = next((p for p in probes if p.get("load") == bracket.get("failing")
                        and not p.get("stopped")), None)
        return SearchRecord(
            path=path, key=setting_key(engine.get("name") or d.get("setting"), d.get("grid")),
            kind=str(d.get("kind")), unit=str(d.get("unit") or ""), status=str(d.get("status")),
            capacity=d.get("capacity"), passing=bracket.get("passing"),
            failing=bracket.get("failing"),
            target=float(d.get("target_attainment") or DEFAULT_TARGET),
            precision_text=str(d.get("precision_text") or ""), num_probes=len(probes),
            num_stopped=sum(1 for p in probes if p.get("stopped")),
            num_behind=sum(1 for p in probes if _only_pace(p, d, "fell behind")),
            num_short=sum(1 for p in probes if _only_pace(p, d, "too short")),
            load_cap=str(d["load_cap"]) if d.get("load_cap") else None,
            precision=float(d["precision"]) if d.get("precision") is not None else None,
            behind=str(failing["behind"]) if failing and failing.get("behind") else None,
            failing_attainment=_attainment(failing),
            probe_labels={float(p["load"]): str(p.get("label") or p.get("run_dir"))
                          for p in probes if p.get("load") is not None},
            slo=dict(d.get("slo") or {}), knobs=dict(d.get("knobs") or {}),
            probe_dirs=tuple(path.parent / str(p["run_dir"]) for p in probes
                             if p.get("run_dir")),
            probe_behind={(path.parent / str(p["run_dir"])).resolve(): _pace_failure(p)
                          for p in probes if p.get("run_dir")},
            answer=str(d["answer"]) if d.get("answer") else None,
            error=str(d["error"]) if d.get("error") else None)
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _attainment(probe: Mapping[str, Any] | None) -> float | None:
    """A probe's SLO attainment in search.json (None: no probe, or nothing measured)."""
    value = probe.get("attainment") if probe else None
    return None if value is None else float(value)


def _only_pace(probe: Mapping[str, Any], search: Mapping[str, Any], why: str) -> bool:
    """The probe met the SLO, was not stopped, and failed only the pace check, for ``why``."""
    attainment = probe.get("attainment")
    target = float(search.get("target_attainment") or DEFAULT_TARGET)
    return (attainment is not None and attainment >= target and not probe.get("stopped")
            and str(probe.get("behind") or "").startswith(why))


@dataclass(frozen=True)
class CapacityRow:
    """One setting's capacity at the SLO, and where the number comes from."""

    key: str
    kind: str
    capacity: float | None  # None: not known (below every load tried)
    bound: str  # "=" a value, "≥" none of the loads failed (or the next failed only by
    # falling behind its arrivals: between the two, not interpolated), "<" all failed
    source: str  # "search" or "interpolated"
    evidence: str  # probes or load points the number comes from
    cells: tuple[str, ...] = field(default_factory=tuple)
    note: str = ""  # why a capacity is only a bound, in a few words (for the key finding)
    precision: float | None = None  # a search's (rate: relative; concurrency: users)
    slo: Mapping[str, float] | None = None  # the SLO the capacity was judged under
    # instead of a number, when a bound would mislead (search.json's ``answer``): "the SLO is
    # not met even at the lowest load tried, ...", "not known: ... the trace was too short"
    answer: str = ""


LOAD_UNITS = {"rate": "req/s", "concurrency": "users", "time_scale": "× time"}


def capacity_text(row: CapacityRow) -> str:
    """``19 req/s``, ``≥ 32 req/s``, ``< 1 req/s``, or – when not known."""
    if row.capacity is None:
        return "–"
    sign = "" if row.bound == "=" else f"{row.bound} "
    # a searched load exactly as probed (4 significant digits): never rounded above it
    value = f"{row.capacity:.4g}" if row.source == "search" else sig(row.capacity)
    unit = "user" if row.kind == "concurrency" and row.capacity == 1 else LOAD_UNITS.get(
        row.kind, "")
    return f"{sign}{value} {unit}".strip()


def capacity_mark(row: CapacityRow | None, s: Series, target: float) -> CapacityMark | None:
    """Where the throughput–latency figure marks a setting's capacity (``plots.CapacityMark``):
    a capacity found or a lower bound (no load failed), of the same kind of load as the
    setting's curve and within its loads; None for none to mark (not known, below every load
    tried). The figure draws each SLO as a per-request limit, which a percentile may cross
    below or above the capacity: the mark shows the load the SLO attainment decided."""
    if row is None or row.capacity is None or row.bound == "<" or row.kind != s.kind:
        return None
    loads = [p.load for p in s.points]
    if not min(loads) <= row.capacity <= max(loads):
        return None
    return CapacityMark(row.capacity, capacity_text(row), target)


def capacity_ratio(row: CapacityRow, base: CapacityRow) -> str | None:
    """``1.42×`` (``≥ 1.42×`` for a lower bound) of ``base``'s capacity; None when the two do
    not compare (either unknown, the base only a bound, another kind of load or SLO)."""
    if (row.capacity is None or base.capacity is None or base.bound != "="
            or base.capacity <= 0 or row.kind != base.kind or row.slo != base.slo):
        return None  # (capacities under two SLOs answer two questions)
    return ("" if row.bound == "=" else f"{row.bound} ") + f"{row.capacity / base.capacity:.2f}×"


def capacity_rows(series: Sequence[Series], searches: Sequence[SearchRecord],
                  target: float) -> list[CapacityRow]:
    """A row per setting: from its capacity search when present, else interpolated. When the
    rows' capacities were judged under different SLOs (``batchlab summarize --slo`` recomputed
    some cells' goodput), each interpolated row's evidence names its SLO."""
    rows: dict[str, CapacityRow] = {}
    for s in series:
        if s.kind in ("rate", "concurrency"):
            rows[s.key] = interpolated_capacity(s, target)
    for r in searches:
        rows[r.key] = _search_row(r)
    slos = [r.slo for r in rows.values() if r.slo is not None]
    if any(slo != slos[0] for slo in slos[1:]):
        rows = {k: dataclasses.replace(r, evidence=f"{r.evidence}; under {slo_text(r.slo)}")
                if r.source != "search" and r.slo is not None else r for k, r in rows.items()}
    return list(rows.values())


def status_bound(status: str) -> str:
    """What a search's status says of its capacity: "=" found, "≥" a lower bound (no load
    tried failed; cut short by --max-probes, Ctrl-C or a kill; the trace too short to test
    more: no number when no load passed), "<" every load tried failed (the lowest failing
    load is the bound; none when it failed on SLO attainment: search.json's ``answer``)."""
    return {"at_least_max": "≥", "below_min": "<", "max_probes": "≥", "interrupted": "≥",
            "running": "≥", "trace_too_short": "≥"}.get(status, "=")


def _search_row(r: SearchRecord) -> CapacityRow:
    bound = status_bound(r.status)
    value = r.capacity if bound != "<" else r.failing
    if value is None and bound == "≥":
        value = r.passing
    if r.answer:  # no load meets the SLO, or not known: no number to give
        value = None
    passing = "–" if r.passing is None else f"{r.passing:g}"
    failing = "–" if r.failing is None else f"{r.failing:g}"
    stopped = f", {r.num_stopped} stopped early" if r.num_stopped else ""
    behind = "".join(f", {n} met the SLO but {what}" for n, what in (
        (r.num_behind, "fell behind the arrivals"),
        (r.num_short, "were too short a trace to show a steady state")) if n)
    precision = {
        "max_probes": f"not {r.precision_text}: stopped by --max-probes",
        "interrupted": f"not {r.precision_text}: interrupted, `--resume` goes on",
        "running": f"not {r.precision_text}: still running, or killed",
        "below_min": f"every load tried failed, down to the lowest ({failing})",
        "at_least_max": f"no load tried failed, up to the highest ({passing}"
                        + (f": {r.load_cap}" if r.load_cap else "") + ")",
        "trace_too_short": (f"a lower bound: at {failing} the trace was too short to show a "
                            "steady state; a trace with more requests may show more")
        if r.passing is not None else r.answer or "not known: the trace too short",
    }.get(r.status, r.precision_text)
    if r.status == "below_min" and r.answer:
        precision = r.answer
    evidence = (f"search ({r.status}): {passing} passed, {failing} failed ({precision}); "
                f"{r.num_probes} probe{'' if r.num_probes == 1 else 's'}{stopped}{behind}")
    if r.status == "failed" and r.error:  # no verdict about any load: why is all there is
        evidence = f"search failed: {failure_reason(r.error)}"
    if r.behind:
        evidence += f"; {failing} {_failed_text(r, r.behind)}"
    bracket = tuple(f"{r.path.parent.name}/{r.probe_labels[load]}"
                    for load in (r.passing, r.failing)
                    if load is not None and load in r.probe_labels)
    note = {"trace_too_short": "the trace too short to test more",
            "max_probes": "search cut short by --max-probes",
            "interrupted": "search interrupted", "running": "search unfinished",
            "at_least_max": "no load tried failed"}.get(r.status, "")
    if r.status == "at_least_max" and r.load_cap:
        note = f"no load tried failed, up to {r.load_cap}"
    return CapacityRow(r.key, r.kind, value, bound, "search", evidence, bracket, note,
                       r.precision, dict(r.slo) or None, r.answer or "")


def unsearched_settings(scenario_dir: Path, meta: Mapping[str, Any],
                        rows: Sequence[CapacityRow]) -> list[str]:
    """The settings of a capacity search that have no row in the capacity table, each with
    why, as its ``capacity.json`` says (``meta``: the folder's scenario.json, which names it):
    a setting not searched because the search was interrupted before it started, or one
    interrupted before a probe finished, and those ``left_out`` (an earlier search here of a
    setting whose definition has changed). Without them a reader of the report would not
    know the search had more settings than its table shows."""
    name = meta.get("capacity")
    if not isinstance(name, str):
        return []
    data = read_json_object(scenario_dir / name)
    shown = {cell.split("/", 1)[0] for r in rows for cell in r.cells}
    out: list[str] = []
    for row in data.get("settings") or []:
        setting = row.get("setting") if isinstance(row, Mapping) else None
        if not isinstance(setting, str) or setting in shown:
            continue
        status, error = row.get("status"), row.get("error")
        if status == "running":
            why = "still being searched"
        elif error:
            why = failure_reason(str(error))
        elif status == "interrupted":
            why = "interrupted before a probe finished"
        else:
            continue  # measured (its row is in the table under its engine and knobs)
        out.append(f"`{setting}/`: {why}")
    for item in data.get("left_out") or []:
        if isinstance(item, Mapping) and isinstance(item.get("setting"), str):
            out.append(f"`{item['setting']}/`: {item.get('why') or 'left out'}")
    return out


def _failed_text(r: SearchRecord, behind: str) -> str:
    """Why the bracket's failing probe failed, when it failed the pace check (``behind``):
    "met the SLO but fell behind: ..." only when its attainment reached the target; else the
    attainment, under the target, and the pace as well."""
    attained = r.failing_attainment
    if attained is not None and attained >= r.target:
        return f"met the SLO but {behind}"
    # pace.why reads "fell behind: ..." or "too short to show a steady state: ..."
    pace = behind if behind.startswith("fell behind") else f"was {behind}"
    if attained is None:
        return pace
    return (f"failed on SLO attainment ({attainment_text(attained)}, under the "
            f"{attainment_text(r.target)} target) and {pace}")


def within_precision(row: CapacityRow, base: CapacityRow) -> bool:
    """Two searched capacities closer than the searches' precision: no difference shown."""
    if (row.source != "search" or base.source != "search" or row.bound != "="
            or base.bound != "=" or row.capacity is None or base.capacity is None
            or row.precision is None or base.precision is None or row.kind != base.kind
            or row.slo != base.slo):
        return False
    precision = max(row.precision, base.precision)
    if row.kind == "concurrency":
        return abs(row.capacity - base.capacity) <= precision
    low, high = sorted((row.capacity, base.capacity))
    return low > 0 and high / low - 1 <= precision


def interpolated_capacity(s: Series, target: float) -> CapacityRow:
    """Linear in attainment between the last load that met ``target`` and the first that did
    not (points with no attainment are skipped). Not when the points' attainments were
    computed under different SLOs: which load met the SLO would then depend on whose SLO."""
    pts = [p for p in s.points if p.attainment is not None]
    if not pts:
        return CapacityRow(s.key, s.kind, None, "=", "interpolated", "no SLO attainment")
    slo = pts[0].slo
    if any(p.slo != slo for p in pts[1:]):
        return _mixed_slo_row(s, pts)
    # a load point whose engine fell behind its arrivals fails, whatever its attainment: a
    # longer trace would turn its backlog into missed SLOs (the capacity search's rule)
    first_fail = next((i for i, p in enumerate(pts)
                       if (p.attainment or 0.0) < target or p.behind), None)
    if first_fail is None:
        top = pts[-1]
        return CapacityRow(s.key, s.kind, top.load, "≥", "interpolated",
                           f"every load point met it (highest {top.load:g})", (top.cell,),
                           slo=slo)
    if first_fail == 0:
        low = pts[0]
        return CapacityRow(s.key, s.kind, low.load, "<", "interpolated",
                           f"even the lowest load point ({low.load:g}) missed it", (low.cell,),
                           slo=slo)
    a, b = pts[first_fail - 1], pts[first_fail]
    assert a.attainment is not None and b.attainment is not None
    if b.attainment >= target:  # failed by falling behind alone: nothing to interpolate in
        return CapacityRow(s.key, s.kind, a.load, "≥", "interpolated",
                           f"{a.load:g} met it; {b.load:g} met the SLO but its engine fell "
                           "behind its arrivals", (a.cell, b.cell), slo=slo)
    frac = (a.attainment - target) / (a.attainment - b.attainment)
    value = a.load + frac * (b.load - a.load)
    return CapacityRow(s.key, s.kind, value, "=", "interpolated",
                       f"between {a.load:g} ({attainment_text(a.attainment)}) and {b.load:g} "
                       f"({attainment_text(b.attainment)})", (a.cell, b.cell), slo=slo)


def _mixed_slo_row(s: Series, pts: Sequence[CurvePoint]) -> CapacityRow:
    """A setting whose load points' goodput was computed under different SLOs (``batchlab
    summarize --slo`` recomputed some): no capacity, and the loads under each SLO named."""
    by_slo: list[tuple[Mapping[str, float] | None, list[str]]] = []
    for p in pts:
        loads = next((loads for slo, loads in by_slo if slo == p.slo), None)
        if loads is None:
            by_slo.append((p.slo, loads := []))
        loads.append(f"{p.load:g}")
    parts = "; ".join(f"{slo_text(slo) if slo else 'no SLO recorded'} at {', '.join(loads)}"
                      for slo, loads in by_slo)
    return CapacityRow(s.key, s.kind, None, "=", "interpolated",
                       f"not interpolated: its load points' goodput was computed under "
                       f"different SLOs ({parts}); `batchlab summarize DIR --slo ...` "
                       "recomputes one", tuple(p.cell for p in pts),
                       note="its load points' goodput computed under different SLOs")


# ---------------------------------------------------------------- batch size


@dataclass(frozen=True)
class EngineUse:
    """How full the engine ran (``engine_use``): means weighted by time, over the time it
    was busy (at least one request running); peaks over every sample."""

    running_mean: float | None
    running_peak: float | None
    waiting_peak: float | None
    kv_mean: float | None
    kv_peak: float | None


def engine_use(run_dir: Path) -> EngineUse | None:
    """The run's running batch and KV use over busy time, from every step of a simulated run
    (each weighted by its duration) or every telemetry scrape of a live one (each until the
    next), not from a plot's down-sampled points."""
    samples = read_engine_samples(run_dir)
    if samples is None:
        return None
    state, held = samples.state, samples.held_s
    running = state.num_running
    busy = (np.ones(held.size, dtype=bool) if running is None
            else np.nan_to_num(running, nan=0.0) > 0)

    def mean(values: np.ndarray | None) -> float | None:
        if values is None:
            return None
        keep = busy & np.isfinite(values)
        weights = held[keep]
        if not keep.any():
            return None
        if weights.sum() <= 0:  # a single scrape: nothing to weigh by
            return float(values[keep].mean())
        return float(np.average(values[keep], weights=weights))

    def peak(values: np.ndarray | None) -> float | None:
        if values is None:
            return None
        finite = values[np.isfinite(values)]
        return float(finite.max()) if finite.size else None

    return EngineUse(mean(running), peak(running), peak(state.num_waiting),
                     mean(state.kv_usage), peak(state.kv_usage))


@dataclass(frozen=True)
class BatchRow:
    """One cap of a batch-size sweep, with what bounded the running batch."""

    cell: CellResult
    cap: int
    use: EngineUse | None
    limit: str  # "kv", "cap", "budget", "load" (``kv_bound``) or "–"
    gain: float | None  # d log(tok/s) / d log(running batch) from the previous row
    past_turn: bool  # tokens/s no longer grow with the batch (from this row on)
    roofline: str  # "memory" / "compute" at this row's running batch, "–" when not known


def kv_bound(c: CellResult, use: EngineUse | None) -> str:
    """What kept the running batch from growing: KV memory (it preempted, or the cache ran
    full), else the cap (reached), else the per-step token budget (requests waited with
    room in the batch: prefills admitted only so fast), else the load (nothing waited)."""
    cap = knob(c, "max_num_seqs")
    if use is None or use.running_peak is None or not isinstance(cap, int):
        return "–"
    # a live run whose engine exported no count: its preemptions are no evidence either way
    if (preemptions(c) or 0) > 0 or (use.kv_peak or 0) >= KV_FULL:
        return "kv"
    if use.running_peak >= cap:
        return "cap"
    return "budget" if (use.waiting_peak or 0) > 0 else "load"


def batch_rows(cells: Sequence[CellResult]) -> list[BatchRow]:
    """The rows of one series of a batch-size sweep, by cap, with the turn the runs showed marked:
    the first cap whose larger running batch raised tokens/s by under half as much."""
    pts = sorted(cells, key=lambda c: int(knob(c, "max_num_seqs")))
    rows: list[BatchRow] = []
    prev: tuple[float, float] | None = None
    turned = False
    for c in pts:
        use = engine_use(c.run_dir)
        cap = int(knob(c, "max_num_seqs"))
        batch = use.running_mean if use is not None and use.running_mean else float(cap)
        tps = get(c.summary, "throughput.output_tokens_per_s")
        limit = kv_bound(c, use)
        gain = None
        # Only between saturated rows: a batch the load bounds says nothing about the engine;
        # nor to or from a run stopped early, whose tokens/s is of part of its trace
        saturated = limit in ("cap", "kv", "budget") and not c.partial  # requests waited
        if prev is not None and tps and saturated and batch / prev[0] >= 1.1:
            gain = math.log(tps / prev[1]) / math.log(batch / prev[0])
            turned = turned or gain < FLAT_GAIN
        prev = (batch, float(tps)) if tps and saturated else None
        rows.append(BatchRow(c, cap, use, limit, gain, turned, _roofline_bound(c, batch)))
    return rows


def roofline_of(c: CellResult) -> Mapping[str, Any] | None:
    roof = c.manifest.get("roofline")
    return roof if isinstance(roof, Mapping) and roof.get("ridge_flop_per_byte") else None


def _roofline_bound(c: CellResult, batch: float) -> str:
    roof = roofline_of(c)
    if roof is None:
        return "–"
    turn = roof.get("turn_batch_size")
    return "compute" if turn is not None and batch >= turn else "memory"
