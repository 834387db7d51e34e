"""``ReportContext``: what the report says besides the numbers (title, baseline, SLO, names)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.report.format import REPO_ROOT, code, display_path, slo_text
from harness.report.runs import CellResult, classes_not_drawn, get

METRICS_DOC = REPO_ROOT / "docs" / "metrics.md"


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
    notes: Sequence[str] = ()  # said first among the key findings (what the cells differ in)


def metrics_link(ctx: ReportContext, out_dir: Path) -> str:
    """Where the report links to docs/metrics.md: as given, else relative to ``out_dir``."""
    if ctx.metrics_doc is not None:
        return ctx.metrics_doc
    return Path(os.path.relpath(METRICS_DOC, out_dir.resolve())).as_posix()


def class_name(ctx: ReportContext, key: str) -> str:
    """A priority class as the report names it: ``name`` (priority 0), or priority 0."""
    try:
        p = int(key)
    except ValueError:
        return f"priority {key}"
    name = ctx.priority_names.get(p)
    return f"{code(name)} (priority {p})" if name else f"priority {p}"


def priority_sort_key(key: str) -> tuple[int, str]:
    """Priority classes in numeric order, names that are not numbers last."""
    try:
        return int(key), key
    except ValueError:
        return 1 << 30, key


def slo_from(cells: Sequence[CellResult], meta: Mapping[str, Any]) -> Mapping[str, float] | None:
    """The SLO the cells' goodput was computed under (their summaries': ``batchlab summarize
    --slo`` may have changed it since the run), else the scenario's, else a manifest's. When
    the summaries disagree, the first one's (``slo_notes`` says so)."""
    for c in cells:
        slo = get(c.summary, "slo")
        if slo:
            return dict(slo)
    if meta.get("slo"):
        return dict(meta["slo"])
    for c in cells:
        if c.manifest.get("slo"):
            return dict(c.manifest["slo"])
    return None


def difference_notes(cells: Sequence[CellResult]) -> list[str]:
    """For run folders compared as they are (``batchlab report DIR DIR``): a sentence naming
    what else differs between them besides engine and knobs (model, GPU, trace), so that a
    difference in their figures is not read as the engine's alone."""
    ok = [c for c in cells if c.ok]

    def trace(c: CellResult) -> str | None:
        t = c.manifest.get("trace")
        if not isinstance(t, Mapping):
            return None
        return f"{display_path(str(t.get('source')))} ({t.get('num_requests')} requests)"

    parts = []
    for what, value in (("model", lambda c: c.manifest.get("model")),
                        ("GPU", lambda c: c.manifest.get("gpu")), ("trace", trace)):
        values = {c.name: value(c) for c in ok}
        if len({str(v) for v in values.values()}) > 1:
            parts.append(f"{what} (" + "; ".join(f"{code(n)}: {v if v is not None else 'unknown'}"
                                                 for n, v in values.items()) + ")")
    if not parts:
        return []
    return ["These runs differ in " + ", ".join(parts) + ": their figures differ for these "
            "reasons too, not for the engine and knobs alone."]


def same_slo(a: CellResult, b: CellResult) -> bool:
    """Whether two cells' goodput was computed under the same SLO (their summaries')."""
    return bool(get(a.summary, "slo") == get(b.summary, "slo"))


def one_slo(cells: Sequence[CellResult]) -> bool:
    """Whether every cell's goodput was computed under the same SLO."""
    return all(same_slo(c, cells[0]) for c in cells[1:])


def slo_notes(cells: Sequence[CellResult]) -> list[str]:
    """A sentence when the cells' goodput was computed under different SLOs."""
    by_slo: dict[str, tuple[Mapping[str, float], list[str]]] = {}
    for c in cells:
        slo = get(c.summary, "slo")
        if slo:
            by_slo.setdefault(json.dumps(slo, sort_keys=True), (slo, []))[1].append(c.name)
    if len(by_slo) < 2:
        return []
    parts = [f"{', '.join(code(n) for n in names)} under {slo_text(slo)}"
             for slo, names in by_slo.values()]
    return ["Goodput and SLO attainment were computed under different SLOs: "
            + "; ".join(parts) + " (`batchlab summarize DIR --slo ...` recomputes one)."]


def scenario_context(meta: Mapping[str, Any], cells: Sequence[CellResult], scenario_dir: Path,
                     *, baseline: str | None = None, metrics_doc: str | None = None
                     ) -> ReportContext:
    """The context of a scenario sweep's report, from its ``scenario.json``."""
    classes = {int(p["priority"]): str(p["name"]) for p in meta.get("priority_classes") or []}
    labels = {int(k): str(v) for k, v in (meta.get("class_names") or {}).items()}
    if any(classes_not_drawn(c.manifest) is not None for c in cells):
        # the requests' own priorities were kept: the classes' names would be put on them (a
        # mix's labels name the priority they gave their own trace, and stay)
        labels = {p: name for p, name in labels.items() if classes.get(p) != name}
        classes = {}
    names = {**classes, **labels}
    command = meta.get("command")
    return ReportContext(
        title=(f"Capacity at SLO: {meta.get('name') or scenario_dir.name}"
               if meta.get("capacity") else f"Scenario {meta.get('name') or scenario_dir.name}"),
        question=meta.get("question"),
        baseline=baseline or meta.get("baseline"),
        priority_names=names,
        slo=slo_from(cells, meta),
        command=list(command) if command else None,
        rerender=["batchlab", "report", display_path(str(scenario_dir))],
        metrics_doc=metrics_doc,
        scenario=meta,
    )
