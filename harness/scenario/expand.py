"""Expansion into cells (engines × grid × load) with stable names, ``select``, each load's trace."""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.scenario._text import as_keys
from harness.scenario.schema import (
    Cell,
    LoadPoint,
    PriorityClass,
    Scenario,
    ScenarioError,
    TraceSpec,
)


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
    point."""
    options = dict((spec or scenario.trace).options)
    if load.kind == "rate":
        options["rate"] = load.value
    elif load.kind == "time_scale":
        options["time_scale"] = load.value
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
        if spec.priority is not None:
            trace = dataclasses.replace(trace, requests=tuple(
                dataclasses.replace(r, priority=spec.priority) for r in trace.requests))
        parts.append(trace)
    trace = parts[0] if len(parts) == 1 else merge_traces(parts)
    return assign_priorities(trace, scenario.priority_classes, seed=scenario.seed)


def merge_traces(parts: Sequence[Any]) -> Any:
    """Replay several traces at once: requests merged by arrival (stable), ids made unique by
    a ``m<i>-`` prefix for the i-th added trace, digest over the parts' digests."""
    requests = list(parts[0].requests)
    for i, part in enumerate(parts[1:], start=1):
        requests += [dataclasses.replace(r, request_id=f"m{i}-{r.request_id}")
                     for r in part.requests]
    requests.sort(key=lambda r: r.arrival_s)
    digest = hashlib.sha256("+".join(p.digest for p in parts).encode()).hexdigest()
    counts: dict[str, int] = {}
    for part in parts:
        for key, value in part.counts.items():
            counts[key] = counts.get(key, 0) + value
    notes = tuple(f"{Path(p.source).name}: {n}" for p in parts for n in p.notes)
    return dataclasses.replace(
        parts[0], requests=tuple(requests), source=" + ".join(str(p.source) for p in parts),
        format="+".join(p.format for p in parts), digest=digest,
        notes=(*notes, f"mix of {len(parts)} traces merged by arrival"), counts=counts,
    )


def assign_priorities(trace: Any, classes: Sequence[PriorityClass], *, seed: int) -> Any:
    """Give each request the priority of a class drawn by share (seeded). A trace that carries
    its own priorities keeps them: recorded traffic wins over the scenario's mix."""
    if not classes or any(r.priority is not None for r in trace.requests):
        return trace
    import numpy as np

    rng = np.random.default_rng(seed)
    shares = np.array([p.share for p in classes], dtype=np.float64)
    picks = rng.choice(len(classes), size=len(trace.requests), p=shares / shares.sum())
    requests = tuple(
        dataclasses.replace(r, priority=classes[int(k)].priority)
        for r, k in zip(trace.requests, picks, strict=True)
    )
    mix = ", ".join(f"{p.name}={p.share:g}" for p in classes)
    return dataclasses.replace(
        trace, requests=requests, notes=(*trace.notes, f"priority classes assigned ({mix})")
    )
