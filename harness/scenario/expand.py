"""Expansion into cells (engines × grid × load) with stable names, ``select``, each load's trace."""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.scenario._text import as_keys
from harness.scenario.schema import (
    Cell,
    LoadPoint,
    PriorityClass,
    Scenario,
    ScenarioError,
    TraceSpec,
)

if TYPE_CHECKING:
    from harness.traces import MixPart, Trace, TraceRequest


def select(cells: Sequence[Cell], patterns: str | Sequence[str] | None) -> tuple[Cell, ...]:
    """Cells whose name (or engine name) matches any shell pattern; ``a*,b*`` gives two."""
    if not patterns:
        return tuple(cells)
    if isinstance(patterns, str):
        patterns = [p for p in (s.strip() for s in patterns.split(",")) if p]
    return tuple(
        cell for cell in cells
        if any(fnmatch.fnmatchcase(cell.name, p) or fnmatch.fnmatchcase(cell.engine.name, p)
               for p in patterns)
    )


# ---------------------------------------------------------------- traces for cells


def trace_options(scenario: Scenario, load: LoadPoint, spec: TraceSpec | None = None
                  ) -> dict[str, Any]:
    """The ``TraceOptions`` keyword arguments of one trace (default: the main one) at one load
    point. A load's time scale multiplies the trace's own: each part of a mix keeps its timing
    relative to the others."""
    options = dict((spec or scenario.trace).options)
    if load.kind == "rate":
        options["rate"] = load.value
    elif load.kind == "time_scale" and load.value is not None:
        options["time_scale"] = load.value * options.get("time_scale", 1.0)
    options.setdefault("seed", scenario.seed)
    return options


def load_cell_trace(scenario: Scenario, load: LoadPoint) -> Any:
    """Load the scenario's trace at one load point, with its priority classes applied."""
    from harness import traces

    parts = []
    for i, spec in enumerate(scenario.trace.components()):
        try:
            fields = trace_options(scenario, load, spec)
            if load.kind == "concurrency" and spec.file is None and fields.get("rate") is None:
                fields["rate"] = math.inf  # generated for N users: no arrival times, no rate
            try:
                trace = traces.load_trace(spec.path, traces.TraceOptions(**fields))
            except traces.TraceError as exc:
                if (load.kind != "concurrency" or fields.get("rate") is not None
                        or "has no timestamps" not in str(exc)):
                    raise
                # lengths only (ShareGPT): N users need no arrival times, nor a rate for them
                trace = traces.load_trace(spec.path,
                                          traces.TraceOptions(**{**fields, "rate": math.inf}))
        except (ValueError, OSError, TypeError) as exc:
            key = "trace" if i == 0 else f"trace.mix[{i - 1}]"
            raise ScenarioError(scenario.source, spec.line, key, as_keys(str(exc))) from None
        parts.append(traces.MixPart(trace, spec.priority))
    trace = with_priority(parts[0]) if len(parts) == 1 else merge_traces(parts)
    components = scenario.trace.components()
    # where priorities come from, before the classes could be drawn: a trace's `priority:`
    # gives its every request one; a priority column wins over priority_fraction (a note)
    column = any(str(n).endswith(f"{traces.PRIORITIES_FROM_TRACE}; --priority-fraction ignored")
                 for n in trace.notes)
    origin = ("given by the trace's `priority:`" if any(
        spec.priority is not None for spec in components)
        else "drawn by its `priority_fraction`" if not column and any(
        spec.options.get("priority_fraction") is not None for spec in components)
        else "the trace's own (its priority column)")
    return assign_priorities(trace, scenario.priority_classes, seed=scenario.seed,
                             origin=origin)


def with_priority(part: MixPart) -> Trace:
    """The part's trace, every request given the part's priority (if it has one)."""
    if part.priority is None:
        return part.trace
    from harness.traces.records import requests_digest

    requests = tuple(dataclasses.replace(r, priority=part.priority) for r in part.trace.requests)
    # the digest covers priorities: other priorities are other requests
    return dataclasses.replace(part.trace, requests=requests, digest=requests_digest(requests))


def merge_traces(parts: Sequence[MixPart]) -> Trace:
    """Replay several traces at once: requests merged by arrival (stable), ids made unique by
    a ``m<i>-`` prefix for the i-th added trace, prefix ids renumbered apart for each trace
    (``renumber_prefix_ids``), digest over the merged requests. ``parts`` keeps each trace
    as it was loaded, so that a manifest can name every one."""
    from harness.traces.records import requests_digest

    requests: list[TraceRequest] = []
    next_id = 0
    for i, part in enumerate(parts):
        renumbered, next_id = renumber_prefix_ids(with_priority(part).requests, next_id)
        if i:
            renumbered = [dataclasses.replace(r, request_id=f"m{i}-{r.request_id}")
                          for r in renumbered]
        requests += renumbered
    requests.sort(key=lambda r: r.arrival_s)
    counts: dict[str, int] = {}
    for part in parts:
        for key, value in part.trace.counts.items():
            counts[key] = counts.get(key, 0) + value
    notes = [f"{Path(p.trace.source).name}: {n}" for p in parts for n in p.trace.notes]
    notes.append(f"mix of {len(parts)} traces merged by arrival")
    if next_id:
        notes.append("prefix ids renumbered apart for each trace: no two traces share a "
                     "cached prefix")
    first = parts[0].trace
    return dataclasses.replace(
        first, requests=tuple(requests), source=" + ".join(p.trace.source for p in parts),
        format="+".join(p.trace.format for p in parts), digest=requests_digest(requests),
        notes=tuple(notes), counts=counts,
        # no one file or set of options loads a mix: each part's are in ``parts``
        options={}, file_sha256=None, parts=tuple(parts),
    )


def renumber_prefix_ids(requests: Sequence[TraceRequest], first_id: int
                        ) -> tuple[list[TraceRequest], int]:
    """The requests with each distinct prefix id renamed ``first_id``, ``first_id + 1``, ... in
    order of first appearance, and the next free id.

    Each trace names its prefix blocks in a space of its own: Mooncake files number their
    hash ids from 0, and clipped requests' own ids come from their line numbers, so the same
    id in two traces of a mix is different content. Renamed one trace after another from
    where the last stopped, no id is in two traces, while a trace's requests share exactly
    the prefixes they shared before; the same trace always gets the same ids."""
    renamed: dict[int, int] = {}
    out = []
    for r in requests:
        if r.prefix_hash_ids:
            ids = tuple(renamed.setdefault(h, first_id + len(renamed))
                        for h in r.prefix_hash_ids)
            r = dataclasses.replace(r, prefix_hash_ids=ids)
        out.append(r)
    return out, first_id + len(renamed)


def assign_priorities(trace: Any, classes: Sequence[PriorityClass], *, seed: int,
                      origin: str = "the trace's own (its priority column)") -> Any:
    """Give each request the priority of a class drawn by share (seeded). A trace whose
    requests have priorities already keeps them: recorded traffic wins over the scenario's
    mix, and a note says so and where they came from (``origin``); the report then gives the
    classes no scenario names."""
    if not classes:
        return trace
    if any(r.priority is not None for r in trace.requests):
        from harness.traces import CLASSES_NOT_DRAWN

        note = f"{CLASSES_NOT_DRAWN}: the requests' priorities are {origin}"
        return dataclasses.replace(trace, notes=(*trace.notes, note))
    import numpy as np

    rng = np.random.default_rng(seed)
    shares = np.array([p.share for p in classes], dtype=np.float64)
    picks = rng.choice(len(classes), size=len(trace.requests), p=shares / shares.sum())
    requests = tuple(
        dataclasses.replace(r, priority=classes[int(k)].priority)
        for r, k in zip(trace.requests, picks, strict=True)
    )
    mix = ", ".join(f"{p.name}={p.share:g}" for p in classes)
    from harness.traces.records import requests_digest

    # the digest covers priorities: another seed or mix draws other requests
    return dataclasses.replace(
        trace, requests=requests, notes=(*trace.notes, f"priority classes assigned ({mix})"),
        digest=requests_digest(requests),
    )
