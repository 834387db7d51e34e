"""The scenario records (frozen, built once by ``load_scenario``) and ``ScenarioError``."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from adapters.base import Knobs
from adapters.catalog import ENGINES
from harness.manifest import batchlab_version, jsonable
from harness.metrics import Slo
from harness.scenario._text import display_path, safe_name, value_text

ENGINE_KINDS = ("reference", *(e for e in ENGINES if e != "reference"))
SCENARIO_FILE = "scenario.json"  # a sweep's record, beside its cells (harness.scenario.runner)
MODES = ("simulated", "live")

LoadKind = Literal["trace", "rate", "time_scale", "concurrency"]
_LOAD_LABEL = {"rate": "rate", "time_scale": "x", "concurrency": "conc"}


class ScenarioError(ValueError):
    """A problem in a scenario file: names the file, the line and the key."""

    def __init__(self, file: str | Path, line: int | None, key: str, message: str) -> None:
        self.file = str(file)
        self.line = line
        self.key = key
        self.message = message
        where = f"{self.file}:{line}" if line is not None else self.file
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """A share of the traffic sent with one priority (lower is served first)."""

    name: str
    share: float  # fraction of requests, the shares sum to 1
    priority: int


@dataclass(frozen=True, slots=True)
class TraceSpec:
    """Where the trace is and the options to load it with (``TraceOptions`` fields).

    ``mix`` lists more traces replayed at the same time (merged by arrival), e.g. long
    Mooncake prompts over chat traffic. ``priority`` gives every request of this trace that
    priority, and ``label`` names it in the report (a traffic class).
    """

    # a trace file, or the text "synthetic[:<arrival>]": requests generated from the options
    # (num_requests, rate, lengths), no file read but a lengths_from one
    path: Path | str
    options: dict[str, Any] = field(default_factory=dict)
    priority: int | None = None
    label: str | None = None
    mix: tuple[TraceSpec, ...] = ()
    line: int | None = None

    @property
    def file(self) -> Path | None:
        """The trace file read; None for a synthetic trace."""
        return self.path if isinstance(self.path, Path) else None

    def components(self) -> tuple[TraceSpec, ...]:
        return (self, *self.mix)

    def as_dict(self) -> dict[str, Any]:
        path = display_path(self.file) if self.file is not None else str(self.path)
        out: dict[str, Any] = {"path": path, "options": jsonable(self.options)}
        if self.priority is not None:
            out["priority"] = self.priority
        if self.label is not None:
            out["label"] = self.label
        if self.mix:
            out["mix"] = [m.as_dict() for m in self.mix]
        return out


@dataclass(frozen=True, slots=True)
class LoadPoint:
    """One load level: the trace as recorded, or rescaled (rate, time scale), or closed loop."""

    kind: LoadKind = "trace"
    value: float | None = None

    @property
    def label(self) -> str:
        """Filesystem-safe, e.g. ``rate-2``, ``x0.5``, ``conc-8``; ``trace`` when unchanged."""
        if self.kind == "trace" or self.value is None:
            return "trace"
        sep = "" if self.kind == "time_scale" else "-"
        return f"{_LOAD_LABEL[self.kind]}{sep}{value_text(self.value)}"

    def describe(self) -> str:
        if self.kind == "trace" or self.value is None:
            return "trace timing"
        if self.kind == "rate":
            return f"{value_text(self.value)} req/s"
        if self.kind == "time_scale":
            return f"time scale {value_text(self.value)}"
        return f"{value_text(self.value)} concurrent users"

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self.value}


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One engine entry of a scenario: which engine, how it runs, its uniform knobs."""

    name: str
    engine: str  # one of ENGINE_KINDS
    mode: str  # "simulated" (reference only) or "live"
    knobs: dict[str, Any] = field(default_factory=dict)  # raw knob values, validated
    url: str | None = None  # live: attach to a running server instead of launching
    launch: bool = True  # live: start the engine (False needs url)
    allow_approximate: bool = False  # live: record knobs an engine cannot honour
    admission: str | None = None  # reference: "optimistic" | "reserve"
    num_gpu_blocks: int | None = None  # reference: override the KV block count
    block_size: int | None = None  # reference: tokens per KV block (None: its profile's or 16)
    profile: str | None = None  # reference: an engine profile (name or file) to predict with
    replay: dict[str, Any] = field(default_factory=dict)  # live: replay client options
    model: str | None = None  # what this engine loads, when not the scenario's model
    executable: str | None = None  # live: the engine's command, when not the default
    runtime: str | None = None  # live: container runtime (docker, podman) where supported
    served_model_name: str | None = None  # live: the model name requests carry
    port: int | None = None  # live: port to serve on
    ready_timeout_s: float | None = None  # live: how long to wait for the engine to be ready
    env: dict[str, str] = field(default_factory=dict)  # live: extra environment for the engine
    line: int | None = None

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("line")
        return out


@dataclass(frozen=True, slots=True)
class Cell:
    """One point of the sweep: an engine with its knobs (grid applied) at one load point."""

    name: str  # filesystem-safe, stable for the same scenario
    engine: EngineSpec
    knobs: Knobs
    grid: dict[str, Any] = field(default_factory=dict)  # the grid values of this cell
    load: LoadPoint = LoadPoint()

    @property
    def gpus(self) -> int:
        """GPUs a live cell needs (its tensor-parallel degree); a simulated cell needs none."""
        return self.knobs.tensor_parallel_size if self.engine.mode == "live" else 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "engine": self.engine.as_dict(),
            # what the scenario asked for: an unset knob is its engine's default (the run's
            # manifest.json records what it ran with), never batchlab's fallback
            "knobs": jsonable(self.knobs.asked()),
            "grid": jsonable(self.grid),
            "load": self.load.as_dict(),
        }


@dataclass(frozen=True, slots=True)
class Scenario:
    """A validated scenario file."""

    name: str
    question: str
    source: Path  # the scenario file
    trace: TraceSpec
    loads: tuple[LoadPoint, ...]
    model: str
    gpu: str
    engines: tuple[EngineSpec, ...]
    slo: Slo | None = None
    priority_classes: tuple[PriorityClass, ...] = ()
    grid: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    baseline: str | None = None  # a cell name or an engine name
    seed: int = 0
    # ``batchlab run --trace PATH``: the trace file that replaced the file's own, as typed (the
    # command that reproduces the sweep gives it again)
    trace_override: str | None = None
    # the line of each key of the file, by key path (``engines[0].knobs.max_model_len``): for
    # the errors found after loading (a trace read, a live plan) to name the key they are about
    lines: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def line_of(self, *keys: str) -> int | None:
        """The line of the first of ``keys`` the file has."""
        return next((self.lines[k] for k in keys if k in self.lines), None)

    def engine_key(self, engine: EngineSpec) -> str:
        """The key path of an engine's entry, ``engines[i]``."""
        return f"engines[{self.engines.index(engine)}]"

    def cells(self) -> tuple[Cell, ...]:
        return expand(self)

    def baseline_cell(self) -> str:
        """The cell every other cell is compared with: the scenario's choice, else the first."""
        cells = self.cells()
        if self.baseline is None:
            return cells[0].name
        for cell in cells:
            if self.baseline in (cell.name, cell.engine.name):
                return cell.name
        raise ScenarioError(self.source, None, "baseline", f"no cell named {self.baseline!r}")

    def class_names(self) -> dict[int, str]:
        """Priority value -> traffic class name, from priority classes and trace labels."""
        names = {p.priority: p.name for p in self.priority_classes}
        for t in self.trace.components():
            if t.priority is not None and t.label is not None:
                names[t.priority] = t.label
        return names

    def cell_digest(self, cell: Cell) -> str:
        """What determines a cell's results: resume redoes a finished cell whose digest changed.
        Besides the definition, the bytes of every file it reads (traces, a lengths file, a
        profile, the model's config.json) and the batchlab version: a trace rewritten in place,
        a recalibrated profile, a model config edited or an upgrade is run again, not served
        from the last run."""
        payload = {
            "cell": cell.as_dict(),
            "trace": self.trace.as_dict(),
            "model": self.model,
            "gpu": self.gpu,
            "slo": self.slo.as_dict() if self.slo else None,
            "priority_classes": [dataclasses.asdict(p) for p in self.priority_classes],
            "seed": self.seed,
            "files": {display_path(path): file_sha256(path) for path in self._files(cell)},
            "batchlab": batchlab_version(),
        }
        text = json.dumps(payload, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def _files(self, cell: Cell) -> list[Path]:
        """The files a cell's results are made from: its traces and their lengths files, its
        engine's profile file, and the config.json of its model (the engine's own, else the
        scenario's) where that is a path."""
        files = [t.file for t in self.trace.components() if t.file is not None]
        files += [Path(t.options["lengths_from"]) for t in self.trace.components()
                  if t.options.get("lengths_from")]
        config = model_config_file(cell.engine.model or self.model)
        if config is not None:
            files.append(config)
        if cell.engine.profile:
            from adapters.reference.cost_model import ProfileError, resolve_profile

            with contextlib.suppress(ProfileError):  # refused where it is read, and why
                files.append(resolve_profile(cell.engine.profile))
        return files

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "question": self.question,
            "source": display_path(self.source),
            "trace": self.trace.as_dict(),
            "loads": [lp.as_dict() for lp in self.loads],
            "model": self.model,
            "gpu": self.gpu,
            "slo": self.slo.as_dict() if self.slo else None,
            "priority_classes": [dataclasses.asdict(p) for p in self.priority_classes],
            "class_names": {str(k): v for k, v in self.class_names().items()},
            "grid": {k: list(jsonable(list(v))) for k, v in self.grid.items()},
            "baseline": self.baseline_cell(),
            "seed": self.seed,
            "cells": [c.name for c in self.cells()],
        }


def expand(scenario: Scenario) -> tuple[Cell, ...]:
    """Engines × grid × load, in that nesting order; names are stable and folder-safe.

    A cell is named ``<engine>[__<knob>-<value>...][__<load>]``, e.g.
    ``static__max_num_seqs-8__rate-2`` (the load only when there are several).
    """
    cells = []
    grid_names = list(scenario.grid)
    combos = list(itertools.product(*(scenario.grid[k] for k in grid_names)))
    for engine in scenario.engines:
        for combo in combos:
            grid_values = dict(zip(grid_names, combo, strict=True))
            knobs = Knobs.from_mapping({**engine.knobs, **grid_values},
                                       where=f"{scenario.source}: engine {engine.name}")
            for load in scenario.loads:
                parts = [engine.name]
                parts += [f"{k}-{safe_name(value_text(v))}" for k, v in grid_values.items()]
                if len(scenario.loads) > 1:
                    parts.append(load.label)
                cells.append(Cell(name="__".join(parts), engine=engine, knobs=knobs,
                                  grid=grid_values, load=load))
    return tuple(cells)


def model_config_file(model: str | None) -> Path | None:
    """The config.json a model given as a path stands for (a folder's own, or a JSON file
    itself), as the reference engine reads its shape from it (``adapters.reference.models.
    lookup_model``) and a launched engine loads it; None for a name (a catalog model, a hub
    id) that is no file or folder here, and for a weights file (a GGUF: large, and no
    config). A folder without one gives its config.json still: a file written there later
    changes what a cell digests."""
    if not model:
        return None
    path = Path(model)
    if path.is_dir():
        return path / "config.json"
    return path if path.is_file() and path.suffix.lower() == ".json" else None


@functools.lru_cache(maxsize=64)
def _sha256_of(path: str, mtime_ns: int, size: int) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_sha256(path: Path) -> str | None:
    """The sha256 of a file's bytes (read once per size and modification time); None when it
    cannot be read (the cell that reads it says why)."""
    try:
        stat = path.stat()
        return _sha256_of(str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    except OSError:
        return None
