"""Scenarios: one experiment in a YAML file, expanded into cells and run as a sweep.

A scenario names a trace, the load, SLOs, priority classes, the model and GPU, a list of
engines with uniform knobs, and an optional grid over knobs. It expands to cells::

    cells = engines × grid (Cartesian, in YAML order) × load points

Each cell runs into ``<out>/<scenario>/<cell>/`` (a run folder, the same files as ``batchlab
simulate`` or ``batchlab replay`` write), then ``<out>/<scenario>/report.md`` compares them.

A cell folder's ``status.json`` is its completion marker, written last and atomically::

    cell.json    what the cell is (engine, knobs, load) and its digest, written first
    status.json  {"state": "running"}  ──►  "done" (written after every result file)
                                      └──►  "failed" with the reason (the sweep goes on)

``--resume`` skips a cell whose status is "done" with the same digest and redoes the rest, so a
sweep killed mid-cell loses nothing that had finished.

The YAML is validated once, here, keeping line numbers (``yaml.compose`` nodes carry marks): an
error names the file, the line and the key, with a suggestion for a misspelled key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import fnmatch
import hashlib
import itertools
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

import yaml

from adapters.base import KnobError, Knobs
from harness.manifest import jsonable
from harness.metrics import Slo
from harness.results import write_json_atomic

REPO_ROOT = Path(__file__).resolve().parent.parent
BUNDLED_DATA = Path(__file__).resolve().parent / "data"

ENGINE_KINDS = ("reference", "vllm", "tgi", "trtllm", "openai")
MODES = ("simulated", "live")
ADMISSIONS = ("optimistic", "reserve")

CELL_FILE = "cell.json"
STATUS_FILE = "status.json"
ERROR_FILE = "error.txt"
SCENARIO_FILE = "scenario.json"
REPORT_FILE = "report.md"

# Trace options a scenario may set, with their YAML types. They are passed to
# ``harness.traces.TraceOptions`` unchanged (``lengths_from`` is resolved like ``path``).
TRACE_OPTION_TYPES: dict[str, str] = {
    "format": "str",
    "limit": "int",
    "start_s": "float",
    "end_s": "float",
    "time_scale": "float",
    "rate": "float",
    "arrival": "str",
    "burstiness": "float",
    "num_requests": "int",
    "lengths_from": "path",
    "prompt_tokens": "int",
    "output_tokens": "int",
    "max_model_len": "int",
    "on_too_long": "str",
    "priority_fraction": "float",
    "seed": "int",
    "skip_bad_rows": "bool",
}

LoadKind = Literal["trace", "rate", "time_scale", "concurrency"]
LOAD_KEYS: dict[str, LoadKind] = {
    "rates": "rate",
    "time_scales": "time_scale",
    "concurrencies": "concurrency",
}
_LOAD_LABEL = {"rate": "rate", "time_scale": "x", "concurrency": "conc"}

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


# ---------------------------------------------------------------- errors


class ScenarioError(ValueError):
    """A problem in a scenario file: names the file, the line and the key."""

    def __init__(self, file: str | Path, line: int | None, key: str, message: str) -> None:
        self.file = str(file)
        self.line = line
        self.key = key
        self.message = message
        where = f"{self.file}:{line}" if line is not None else self.file
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """``"; did you mean 'max_num_seqs'?"`` or ``""`` when nothing is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


# ---------------------------------------------------------------- records


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

    path: Path
    options: dict[str, Any] = field(default_factory=dict)
    priority: int | None = None
    label: str | None = None
    mix: tuple[TraceSpec, ...] = ()
    line: int | None = None

    def components(self) -> tuple[TraceSpec, ...]:
        return (self, *self.mix)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": _display_path(self.path), "options": jsonable(self.options)}
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
        return f"{_LOAD_LABEL[self.kind]}{sep}{_value_text(self.value)}"

    def describe(self) -> str:
        if self.kind == "trace" or self.value is None:
            return "trace timing"
        if self.kind == "rate":
            return f"{_value_text(self.value)} req/s"
        if self.kind == "time_scale":
            return f"time scale {_value_text(self.value)}"
        return f"{_value_text(self.value)} concurrent users"

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
    block_size: int = 16  # reference: tokens per KV block
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
            "knobs": jsonable(self.knobs.as_dict()),
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
        """What determines a cell's results: resume redoes a finished cell whose digest changed."""
        payload = {
            "cell": cell.as_dict(),
            "trace": self.trace.as_dict(),
            "model": self.model,
            "gpu": self.gpu,
            "slo": self.slo.as_dict() if self.slo else None,
            "priority_classes": [dataclasses.asdict(p) for p in self.priority_classes],
            "seed": self.seed,
        }
        text = json.dumps(payload, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "question": self.question,
            "source": _display_path(self.source),
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


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, tuple)):
        return "+".join(_value_text(v) for v in value)
    return str(value)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "_"



def _display_path(path: Path) -> str:
    """A path relative to the repository when it is inside it (stable across clones)."""
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------- YAML with line numbers


@dataclass(frozen=True, slots=True)
class _Y:
    """A YAML value with the (1-based) line it starts on. Maps hold ``{key: (_Y of key, _Y)}``."""

    value: Any
    line: int
    kind: Literal["map", "seq", "scalar"]


def _compose(text: str, file: str) -> _Y | None:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        return None if node is None else _convert(loader, node, file)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise ScenarioError(file, line, "", f"invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(file, None, "", f"invalid YAML: {exc}") from None
    finally:
        loader.dispose()


def _convert(loader: yaml.SafeLoader, node: yaml.Node, file: str) -> _Y:
    line = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)  # YAML merge keys (<<)
        out: dict[str, tuple[_Y, _Y]] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node)
            key_line = key_node.start_mark.line + 1
            if not isinstance(key, str):
                raise ScenarioError(file, key_line, str(key), "keys must be names (text)")
            if key in out:
                raise ScenarioError(
                    file, key_line, key, f"duplicate key (first on line {out[key][0].line})"
                )
            out[key] = (_Y(key, key_line, "scalar"), _convert(loader, value_node, file))
        return _Y(out, line, "map")
    if isinstance(node, yaml.SequenceNode):
        return _Y([_convert(loader, n, file) for n in node.value], line, "seq")
    return _Y(loader.construct_object(node), line, "scalar")


def _plain(y: _Y) -> Any:
    if y.kind == "map":
        return {k: _plain(v) for k, (_, v) in y.value.items()}
    if y.kind == "seq":
        return [_plain(v) for v in y.value]
    return y.value


class _Checker:
    """Type checks that raise ScenarioError naming the file, the line and the key path."""

    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, y: _Y | None, key: str, message: str) -> ScenarioError:
        return ScenarioError(self.file, y.line if y is not None else None, key, message)

    def mapping(
        self, y: _Y, key: str, known: Sequence[str], required: Sequence[str] = ()
    ) -> dict[str, _Y]:
        if y.kind != "map":
            raise self.fail(y, key or "scenario", f"must be a mapping of keys, got {_kind(y)}")
        items: dict[str, tuple[_Y, _Y]] = y.value
        for name, (key_y, _) in items.items():
            if name not in known:
                raise self.fail(
                    key_y, _join(key, name),
                    f"unknown key{did_you_mean(name, known)} (known keys: {', '.join(known)})",
                )
        for name in required:
            if name not in items:
                raise self.fail(y, _join(key, name), "is required")
        return {name: value for name, (_, value) in items.items()}

    def seq(self, y: _Y, key: str, *, nonempty: bool = True) -> list[_Y]:
        if y.kind != "seq":
            raise self.fail(y, key, f"must be a list, got {_kind(y)}")
        if nonempty and not y.value:
            raise self.fail(y, key, "must not be empty")
        return list(y.value)

    def string(self, y: _Y, key: str) -> str:
        if y.kind != "scalar" or not isinstance(y.value, str) or not y.value.strip():
            raise self.fail(y, key, f"must be text, got {_kind(y)}")
        return y.value

    def integer(self, y: _Y, key: str, *, minimum: int | None = None) -> int:
        v = y.value
        if y.kind != "scalar" or not isinstance(v, int) or isinstance(v, bool):
            raise self.fail(y, key, f"must be an integer, got {_kind(y)}")
        if minimum is not None and v < minimum:
            raise self.fail(y, key, f"must be at least {minimum}, got {v}")
        return v

    def number(self, y: _Y, key: str, *, positive: bool = False) -> float:
        v = y.value
        if y.kind != "scalar" or not isinstance(v, (int, float)) or isinstance(v, bool):
            raise self.fail(y, key, f"must be a number, got {_kind(y)}")
        if not math.isfinite(v) or (positive and v <= 0):
            raise self.fail(y, key, f"must be a {'positive ' if positive else ''}number, got {v}")
        return float(v)

    def boolean(self, y: _Y, key: str) -> bool:
        if y.kind != "scalar" or not isinstance(y.value, bool):
            raise self.fail(y, key, f"must be true or false, got {_kind(y)}")
        return y.value

    def choice(self, y: _Y, key: str, choices: Sequence[str]) -> str:
        v = self.string(y, key)
        if v not in choices:
            raise self.fail(
                y, key, f"{v!r} is not one of {', '.join(choices)}{did_you_mean(v, choices)}"
            )
        return v


def _kind(y: _Y) -> str:
    if y.kind == "map":
        return "a mapping"
    if y.kind == "seq":
        return "a list"
    v = y.value
    if v is None:
        return "nothing (null)"
    if isinstance(v, bool):
        return f"a boolean ({str(v).lower()})"
    if isinstance(v, (int, float)):
        return f"a number ({v})"
    return f"text ({v!r})"


def _join(prefix: str, name: str | int) -> str:
    if isinstance(name, int):
        return f"{prefix}[{name}]"
    return f"{prefix}.{name}" if prefix else name


# ---------------------------------------------------------------- loading


SCENARIO_KEYS = (
    "name", "question", "trace", "load", "slo", "priority_classes", "model", "gpu",
    "engines", "grid", "baseline", "seed",
)
ENGINE_KEYS = (
    "name", "engine", "mode", "model", "knobs", "url", "launch", "allow_approximate",
    "admission", "num_gpu_blocks", "block_size", "replay", "executable", "runtime",
    "served_model_name", "port", "ready_timeout_s", "env",
)
_LIVE_ONLY = ("url", "launch", "allow_approximate", "replay", "executable", "runtime",
              "served_model_name", "port", "ready_timeout_s", "env")


def load_scenario(path: str | Path, *, trace_path: str | Path | None = None) -> Scenario:
    """Read and validate a scenario file. ``trace_path`` replaces the scenario's trace file
    (keeping its options), e.g. to run a scenario on a full trace instead of its excerpt."""
    path = Path(path)
    file = str(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScenarioError(file, None, "", f"cannot read: {exc.strerror or exc}") from None
    root = _compose(text, file)
    c = _Checker(file)
    if root is None:
        raise ScenarioError(file, 1, "", "the file is empty")
    top = c.mapping(root, "", SCENARIO_KEYS,
                    required=("name", "question", "trace", "model", "gpu", "engines"))

    name = c.string(top["name"], "name")
    if not _SAFE_NAME.match(name):
        raise c.fail(top["name"], "name",
                     f"{name!r} must be letters, digits, '.', '_' or '-' (it names a folder)")
    question = c.string(top["question"], "question").strip()
    model = c.string(top["model"], "model")
    gpu = c.string(top["gpu"], "gpu")
    seed = c.integer(top["seed"], "seed", minimum=0) if "seed" in top else 0
    trace = _parse_trace(c, top["trace"], path.parent, trace_path)
    loads = _parse_load(c, top["load"]) if "load" in top else (LoadPoint(),)
    slo = _parse_slo(c, top["slo"]) if "slo" in top else None
    classes = (_parse_priority_classes(c, top["priority_classes"])
               if "priority_classes" in top else ())
    engines = _parse_engines(c, top["engines"])
    grid = _parse_grid(c, top["grid"], engines) if "grid" in top else {}
    baseline = c.string(top["baseline"], "baseline") if "baseline" in top else None

    if trace.mix and any(lp.kind == "rate" for lp in loads):
        raise c.fail(top["load"], "load.rates",
                     "a mixed trace keeps each part's timing: use time_scales instead of rates")
    if any(lp.kind == "concurrency" for lp in loads):
        for e in engines:
            if e.mode == "simulated":
                raise c.fail(
                    top["load"], "load.concurrencies",
                    f"closed-loop concurrency needs live engines; engine {e.name!r} is simulated "
                    "(use rates or time_scales)",
                )

    scenario = Scenario(
        name=name, question=question, source=path, trace=trace, loads=loads, model=model,
        gpu=gpu, engines=engines, slo=slo, priority_classes=classes, grid=grid,
        baseline=baseline, seed=seed,
    )
    cells = _expand_checked(c, scenario, top)
    if baseline is not None:
        names = [cell.name for cell in cells] + [e.name for e in engines]
        if baseline not in names:
            raise c.fail(top["baseline"], "baseline",
                         f"no cell or engine named {baseline!r}{did_you_mean(baseline, names)}")
    return scenario


def _parse_trace(c: _Checker, y: _Y, base: Path, override: str | Path | None,
                 *, key: str = "trace") -> TraceSpec:
    nested = key != "trace"
    known = ("path", "priority", "label", *TRACE_OPTION_TYPES, *(() if nested else ("mix",)))
    items = c.mapping(y, key, known, required=() if override else ("path",))
    options: dict[str, Any] = {}
    for name, value in items.items():
        if name in ("path", "priority", "label", "mix"):
            continue
        kind = TRACE_OPTION_TYPES[name]
        where = f"{key}.{name}"
        if kind == "int":
            options[name] = c.integer(value, where, minimum=0)
        elif kind == "float":
            options[name] = c.number(value, where)
        elif kind == "bool":
            options[name] = c.boolean(value, where)
        elif kind == "path":
            options[name] = str(resolve_trace_path(c.string(value, where), base, c, value, where))
        else:
            options[name] = c.string(value, where)
    if override is not None:
        path = Path(override)
        if not path.exists():
            raise ScenarioError(str(override), None, "--trace", "no such file")
    else:
        path = resolve_trace_path(c.string(items["path"], f"{key}.path"), base, c,
                                  items["path"], f"{key}.path")
    mix: list[TraceSpec] = []
    if "mix" in items:
        for i, part in enumerate(c.seq(items["mix"], "trace.mix")):
            mix.append(_parse_trace(c, part, base, None, key=f"trace.mix[{i}]"))
        if "rate" in options or any("rate" in m.options for m in mix):
            raise c.fail(items["mix"], "trace.mix",
                         "a mix keeps each trace's own timing: rescale with time_scale, not rate")
    return TraceSpec(
        path=path, options=options,
        priority=c.integer(items["priority"], f"{key}.priority") if "priority" in items else None,
        label=c.string(items["label"], f"{key}.label") if "label" in items else None,
        mix=tuple(mix), line=y.line,
    )


def resolve_trace_path(text: str, base: Path, c: _Checker, y: _Y, where: str) -> Path:
    """A trace path: absolute, relative to the scenario file, relative to the repository, or
    the name of a bundled excerpt (``harness/data``). ``$VARS`` and ``~`` are expanded."""
    raw = Path(os.path.expanduser(os.path.expandvars(text)))
    candidates = [raw] if raw.is_absolute() else [base / raw, REPO_ROOT / raw, BUNDLED_DATA / raw]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    bundled = sorted(p.name for p in BUNDLED_DATA.glob("*") if p.is_file())
    hint = did_you_mean(raw.name, bundled)
    listing = f" Bundled excerpts: {', '.join(bundled)}." if bundled else ""
    raise c.fail(y, where, f"no trace file {text!r} (looked in "
                 f"{', '.join(str(p.parent) for p in candidates)}){hint}.{listing}")


def _parse_load(c: _Checker, y: _Y) -> tuple[LoadPoint, ...]:
    items = c.mapping(y, "load", tuple(LOAD_KEYS))
    if len(items) != 1:
        raise c.fail(y, "load", "give exactly one of rates, time_scales or concurrencies")
    (key, value), = items.items()
    points = []
    for i, item in enumerate(c.seq(value, f"load.{key}")):
        where = f"load.{key}[{i}]"
        number = (c.integer(item, where, minimum=1) if key == "concurrencies"
                  else c.number(item, where, positive=True))
        points.append(LoadPoint(LOAD_KEYS[key], float(number)))
    labels = [p.label for p in points]
    if len(set(labels)) != len(labels):
        raise c.fail(value, f"load.{key}", "values repeat")
    return tuple(points)


def _parse_slo(c: _Checker, y: _Y) -> Slo:
    keys = ("ttft_s", "tpot_s", "e2e_s")
    items = c.mapping(y, "slo", keys)
    return Slo(**{k: c.number(v, f"slo.{k}", positive=True) for k, v in items.items()})


def _parse_priority_classes(c: _Checker, y: _Y) -> tuple[PriorityClass, ...]:
    out = []
    for i, item in enumerate(c.seq(y, "priority_classes")):
        where = f"priority_classes[{i}]"
        fields_ = c.mapping(item, where, ("name", "share", "priority"),
                            required=("name", "share", "priority"))
        share = c.number(fields_["share"], f"{where}.share", positive=True)
        if share > 1:
            raise c.fail(fields_["share"], f"{where}.share", f"must be at most 1, got {share}")
        out.append(PriorityClass(
            name=c.string(fields_["name"], f"{where}.name"),
            share=share,
            priority=c.integer(fields_["priority"], f"{where}.priority"),
        ))
    total = sum(p.share for p in out)
    if abs(total - 1) > 1e-6:
        raise c.fail(y, "priority_classes", f"shares must add up to 1, they add up to {total:g}")
    for attr in ("name", "priority"):
        values = [getattr(p, attr) for p in out]
        if len(set(values)) != len(values):
            raise c.fail(y, "priority_classes", f"each class needs its own {attr}")
    return tuple(out)


def _check_knob(c: _Checker, name: str, value: Any, y: _Y, where: str) -> None:
    try:
        Knobs.from_mapping({name: value}, where=where)
    except (KnobError, TypeError) as exc:
        message = str(exc)
        prefix = f"{where}."
        if message.startswith(prefix):
            message = message[len(prefix):]
        raise c.fail(y, where, message) from None


def _knob_value(y: _Y) -> Any:
    value = _plain(y)
    return tuple(value) if isinstance(value, list) else value


def _parse_knobs(c: _Checker, y: _Y, where: str) -> dict[str, Any]:
    names = Knobs.names()
    items = c.mapping(y, where, names)
    out = {}
    for name, value in items.items():
        _check_knob(c, name, _knob_value(value), value, f"{where}.{name}")
        out[name] = _knob_value(value)
    return out


def _parse_engines(c: _Checker, y: _Y) -> tuple[EngineSpec, ...]:
    out: list[EngineSpec] = []
    for i, item in enumerate(c.seq(y, "engines")):
        where = f"engines[{i}]"
        f = c.mapping(item, where, ENGINE_KEYS, required=("name", "engine"))
        name = c.string(f["name"], f"{where}.name")
        if not _SAFE_NAME.match(name):
            raise c.fail(f["name"], f"{where}.name",
                         f"{name!r} must be letters, digits, '.', '_' or '-' (it names a folder)")
        if any(e.name == name for e in out):
            raise c.fail(f["name"], f"{where}.name", f"another engine is already named {name!r}")
        engine = c.choice(f["engine"], f"{where}.engine", ENGINE_KINDS)
        default_mode = "simulated" if engine == "reference" else "live"
        mode = c.choice(f["mode"], f"{where}.mode", MODES) if "mode" in f else default_mode
        if mode == "simulated" and engine != "reference":
            raise c.fail(f["mode"], f"{where}.mode",
                         f"only the reference engine can be simulated; {engine} runs live")
        knobs = _parse_knobs(c, f["knobs"], f"{where}.knobs") if "knobs" in f else {}
        url = c.string(f["url"], f"{where}.url") if "url" in f else None
        launch = c.boolean(f["launch"], f"{where}.launch") if "launch" in f else url is None
        if mode == "live" and not launch and url is None:
            raise c.fail(item, f"{where}.url", "a live engine that is not launched needs a url")
        reference_only = ("admission", "num_gpu_blocks", "block_size")
        for key in reference_only:
            if key in f and engine != "reference":
                raise c.fail(f[key], f"{where}.{key}", "applies to the reference engine only")
        for key in _LIVE_ONLY:
            if key in f and mode != "live":
                raise c.fail(f[key], f"{where}.{key}", "applies to live engines only")
        replay: dict[str, Any] = {}
        if "replay" in f:
            if f["replay"].kind != "map":
                raise c.fail(f["replay"], f"{where}.replay", "must be a mapping of options")
            replay = _plain(f["replay"])
        env: dict[str, str] = {}
        if "env" in f:
            if f["env"].kind != "map":
                raise c.fail(f["env"], f"{where}.env", "must be a mapping of NAME: value")
            env = {k: str(v) for k, v in _plain(f["env"]).items()}

        def text(key: str, f: dict[str, _Y] = f, where: str = where) -> str | None:
            return c.string(f[key], f"{where}.{key}") if key in f else None

        out.append(EngineSpec(
            name=name, engine=engine, mode=mode, knobs=knobs, url=url, launch=launch,
            allow_approximate=(c.boolean(f["allow_approximate"], f"{where}.allow_approximate")
                               if "allow_approximate" in f else False),
            admission=(c.choice(f["admission"], f"{where}.admission", ADMISSIONS)
                       if "admission" in f else None),
            num_gpu_blocks=(c.integer(f["num_gpu_blocks"], f"{where}.num_gpu_blocks", minimum=1)
                            if "num_gpu_blocks" in f else None),
            block_size=(c.integer(f["block_size"], f"{where}.block_size", minimum=1)
                        if "block_size" in f else 16),
            replay=replay,
            model=text("model"),
            executable=text("executable"),
            runtime=text("runtime"),
            served_model_name=text("served_model_name"),
            port=c.integer(f["port"], f"{where}.port", minimum=1) if "port" in f else None,
            ready_timeout_s=(c.number(f["ready_timeout_s"], f"{where}.ready_timeout_s",
                                      positive=True) if "ready_timeout_s" in f else None),
            env=env,
            line=item.line,
        ))
    return tuple(out)


def _parse_grid(c: _Checker, y: _Y, engines: Sequence[EngineSpec]) -> dict[str, tuple[Any, ...]]:
    items = c.mapping(y, "grid", Knobs.names())
    grid: dict[str, tuple[Any, ...]] = {}
    for name, value in items.items():
        where = f"grid.{name}"
        values = []
        for i, item in enumerate(c.seq(value, where)):
            v = _knob_value(item)
            _check_knob(c, name, v, item, f"{where}[{i}]")
            values.append(v)
        if len({_value_text(v) for v in values}) != len(values):
            raise c.fail(value, where, "values repeat")
        for e in engines:
            if name in e.knobs:
                raise c.fail(value, where, f"engine {e.name!r} also sets {name} in its knobs; "
                             "set it in one place")
        grid[name] = tuple(values)
    return grid


# ---------------------------------------------------------------- cells


def expand(scenario: Scenario) -> tuple[Cell, ...]:
    """Engines × grid × load, in that nesting order; names are stable and folder-safe."""
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
                parts += [f"{k}-{_safe(_value_text(v))}" for k, v in grid_values.items()]
                if len(scenario.loads) > 1:
                    parts.append(load.label)
                cells.append(Cell(name="__".join(parts), engine=engine, knobs=knobs,
                                  grid=grid_values, load=load))
    return tuple(cells)


def _expand_checked(c: _Checker, scenario: Scenario, top: dict[str, _Y]) -> tuple[Cell, ...]:
    try:
        cells = expand(scenario)
    except (KnobError, TypeError) as exc:
        raise c.fail(top["engines"], "engines", str(exc)) from None
    names = [cell.name for cell in cells]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise c.fail(top["engines"], "engines", f"cells would share a name: {', '.join(dupes)}")
    _check_simulated_configs(c, scenario, cells, top)
    return cells


def _check_simulated_configs(c: _Checker, scenario: Scenario, cells: Sequence[Cell],
                             top: dict[str, _Y]) -> None:
    """Build each simulated cell's engine config now, so a bad combination (unknown model,
    prompts that cannot be prefilled whole, ...) stops the sweep before it starts."""
    if not any(cell.engine.mode == "simulated" for cell in cells):
        return
    from adapters.reference import ConfigError

    engines_y = c.seq(top["engines"], "engines")
    for cell in cells:
        if cell.engine.mode != "simulated":
            continue
        try:
            _reference_config(cell, scenario.model, scenario.gpu)
        except ConfigError as exc:
            index = scenario.engines.index(cell.engine)
            key = str(exc).split(":", 1)[0]
            where = f"engines[{index}]"
            y = engines_y[index]
            if key in ("model", "gpu"):
                where, y = key, top[key]
            elif key in Knobs.names():
                where = f"{where}.knobs"
                y = y.value["knobs"][1] if "knobs" in y.value else y
            raise c.fail(y, where, f"cell {cell.name}: {exc}") from None


def _reference_config(cell: Cell, model: str, gpu: str) -> Any:
    from adapters.reference import ReferenceConfig

    engine = cell.engine
    return ReferenceConfig.from_knobs(
        cell.knobs, model=engine.model or model, gpu=gpu, admission=engine.admission,
        num_gpu_blocks=engine.num_gpu_blocks, block_size=engine.block_size,
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
            options = traces.TraceOptions(**trace_options(scenario, load, spec))
            trace = traces.load_trace(spec.path, options)
        except (ValueError, OSError, TypeError) as exc:
            key = "trace" if i == 0 else f"trace.mix[{i - 1}]"
            raise ScenarioError(scenario.source, spec.line, key, str(exc)) from None
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


# ---------------------------------------------------------------- progress


class SweepProgress:
    """Cells done out of the total and, for the current cell, requests done, elapsed, ETA.

    On a terminal: two tqdm bars. Otherwise: plain lines, at most one every few seconds.
    """

    def __init__(self, num_cells: int, *, stream: TextIO | None = None,
                 tty: bool | None = None, interval_s: float = 5.0) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.num_cells = num_cells
        self.num_done = 0
        self.interval_s = interval_s
        self._cell = ""
        self._started = 0.0
        self._last_line = 0.0
        self._cells_bar: Any = None
        self._req_bar: Any = None
        if self.tty and num_cells:
            from tqdm import tqdm

            self._cells_bar = tqdm(total=num_cells, desc="cells", unit="cell", position=0,
                                   file=self.stream, leave=True)

    def start_cell(self, name: str, num_requests: int | None = None) -> None:
        self._cell = name
        self._started = self._last_line = time.monotonic()
        if self._cells_bar is not None:
            from tqdm import tqdm

            self._cells_bar.set_postfix_str(name)
            self._req_bar = tqdm(total=num_requests, desc=name, unit="req", position=1,
                                 file=self.stream, leave=False)
        else:
            self._line(f"{name}: started" + (f" ({num_requests} requests)"
                                              if num_requests else ""))

    def requests(self, done: int, total: int | None = None) -> None:
        """Called by the cell as requests finish (total may be given the first time)."""
        if self._req_bar is not None:
            if total is not None and self._req_bar.total != total:
                self._req_bar.total = total
            self._req_bar.n = done
            self._req_bar.refresh()
            return
        now = time.monotonic()
        if now - self._last_line < self.interval_s:
            return
        self._last_line = now
        elapsed = now - self._started
        text = f"{self._cell}: {done}" + (f"/{total}" if total else "") + " requests"
        text += f", {elapsed:.0f} s elapsed"
        if total and done:
            text += f", ETA {elapsed * (total - done) / done:.0f} s"
        self._line(text)

    def finish_cell(self, name: str, state: str, reason: str = "") -> None:
        self.num_done += 1
        elapsed = time.monotonic() - self._started if self._started else 0.0
        if self._req_bar is not None:
            self._req_bar.close()
            self._req_bar = None
        if self._cells_bar is not None:
            self._cells_bar.update(1)
            if state != "done":
                self._cells_bar.write(f"{name}: {state}: {reason}", file=self.stream)
            return
        suffix = f" in {elapsed:.1f} s" if state == "done" else f": {reason}"
        self._line(f"{name}: {state}{suffix}")

    def skip_cell(self, name: str, why: str) -> None:
        self.num_done += 1
        if self._cells_bar is not None:
            self._cells_bar.update(1)
        else:
            self._line(f"{name}: skipped ({why})")

    def message(self, text: str) -> None:
        if self._cells_bar is not None:
            self._cells_bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        for bar in (self._req_bar, self._cells_bar):
            if bar is not None:
                bar.close()
        self._req_bar = self._cells_bar = None

    def _line(self, text: str) -> None:
        print(f"[{self.num_done}/{self.num_cells}] {text}", file=self.stream, flush=True)


# ---------------------------------------------------------------- running cells


ProgressFn = Callable[[int, int | None], None]
CellRunner = Callable[["CellJob", Path, ProgressFn], Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class CellJob:
    """Everything one cell needs to run anywhere (this process or a Ray worker)."""

    cell: Cell
    trace: Any  # harness.traces.Trace at this cell's load point
    model: str
    gpu: str
    slo: Slo | None
    command: tuple[str, ...]  # the argv that reproduces this cell


@dataclass(frozen=True, slots=True)
class CellOutcome:
    name: str
    state: Literal["done", "failed", "skipped", "not_run"]
    reason: str = ""
    run_dir: Path | None = None


@dataclass(frozen=True, slots=True)
class SweepResult:
    scenario_dir: Path
    report: Path | None
    outcomes: tuple[CellOutcome, ...]

    @property
    def num_failed(self) -> int:
        return sum(1 for o in self.outcomes if o.state == "failed")


def run_cell(job: CellJob, out_dir: Path, progress: ProgressFn) -> Mapping[str, Any]:
    """Run one cell into ``out_dir`` with its engine; return the summary."""
    cell = job.cell
    engine = cell.engine
    if engine.mode == "simulated":
        from harness.simulate import run_simulation

        config = _reference_config(cell, job.model, job.gpu)
        # No per-cell report.md: the scenario's report covers every cell (and plotting each
        # cell would double the sweep's time on small runs).
        return run_simulation(job.trace, config, out_dir, slo=job.slo, progress=progress,
                              command=list(job.command), knobs=jsonable(cell.knobs.as_dict()),
                              write_report=False)
    from harness.live import run_live

    replay = dict(engine.replay)
    if cell.load.kind == "concurrency" and cell.load.value is not None:
        replay.setdefault("mode", "closed")
        replay["concurrency"] = int(cell.load.value)
    extra: dict[str, Any] = {}
    if engine.ready_timeout_s is not None:
        extra["ready_timeout_s"] = engine.ready_timeout_s
    return run_live(
        engine.engine, cell.knobs, job.trace, replay, out_dir,
        launch=engine.launch, url=engine.url, allow_approximate=engine.allow_approximate,
        dry_run=False, model=engine.model or job.model, gpu=job.gpu, slo=job.slo,
        progress=progress, command=list(job.command), served_model_name=engine.served_model_name,
        engine_env=engine.env or None, executable=engine.executable, runtime=engine.runtime,
        port=engine.port, **extra,
    )


def read_status(cell_dir: Path) -> dict[str, Any]:
    """The cell's status record, ``{}`` when it never started."""
    try:
        status = json.loads((cell_dir / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _prepare_cell_dir(cell_dir: Path, scenario: Scenario, cell: Cell, attempt: int) -> None:
    if cell_dir.exists() and any(cell_dir.iterdir()):
        if not ((cell_dir / CELL_FILE).exists() or (cell_dir / STATUS_FILE).exists()):
            raise ScenarioError(scenario.source, None, "",
                                f"{cell_dir} holds files batchlab did not write; "
                                "move them or choose another --out")
        shutil.rmtree(cell_dir)
    cell_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic({**cell.as_dict(), "scenario": scenario.name,
                       "digest": scenario.cell_digest(cell)}, cell_dir / CELL_FILE)
    write_json_atomic({"state": "running", "started_at": _now(), "attempt": attempt,
                       "digest": scenario.cell_digest(cell)}, cell_dir / STATUS_FILE)


def _finish_status(cell_dir: Path, state: str, reason: str, status: dict[str, Any]) -> None:
    record = {**status, "state": state, "finished_at": _now()}
    if reason:
        record["reason"] = reason
    write_json_atomic(record, cell_dir / STATUS_FILE)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def scenario_command(scenario: Scenario, out_root: Path, only: str | None = None) -> list[str]:
    argv = ["batchlab", "run", _display_path(scenario.source)]
    if Path(out_root).resolve() != (REPO_ROOT / "reports").resolve():
        argv += ["--out", str(out_root)]
    if only:
        argv += ["--only", only]
    return argv


def run_scenario(
    scenario: Scenario,
    out_root: str | Path = "reports",
    *,
    only: str | Sequence[str] | None = None,
    resume: bool = False,
    ray_address: str | None = None,
    use_ray: bool = False,
    runner: CellRunner | None = None,
    progress: SweepProgress | None = None,
    write_report: bool = True,
) -> SweepResult:
    """Run the scenario's cells (those matching ``only``) and write the comparative report.

    A cell that raises is recorded as failed with its reason and the sweep goes on; Ctrl-C
    (KeyboardInterrupt) stops the sweep and leaves the current cell "running", which
    ``resume=True`` redoes.
    """
    out_root = Path(out_root)
    scenario_dir = out_root / scenario.name
    scenario_dir.mkdir(parents=True, exist_ok=True)
    all_cells = scenario.cells()
    chosen = select(all_cells, only)
    if not chosen:
        names = ", ".join(c.name for c in all_cells)
        raise ScenarioError(scenario.source, None, "--only",
                            f"no cell matches {only!r}; cells: {names}")
    meta = scenario.as_dict()
    meta["command"] = scenario_command(scenario, out_root, None)
    write_json_atomic(meta, scenario_dir / SCENARIO_FILE)

    todo: list[Cell] = []
    outcomes: dict[str, CellOutcome] = {}
    progress = progress or SweepProgress(len(chosen))
    for cell in chosen:
        cell_dir = scenario_dir / cell.name
        status = read_status(cell_dir)
        if (resume and status.get("state") == "done"
                and status.get("digest") == scenario.cell_digest(cell)):
            progress.skip_cell(cell.name, "finished earlier")
            outcomes[cell.name] = CellOutcome(cell.name, "skipped", "finished earlier", cell_dir)
        else:
            todo.append(cell)

    traces: dict[LoadPoint, Any] = {}
    for cell in todo:
        if cell.load not in traces:
            traces[cell.load] = load_cell_trace(scenario, cell.load)

    def job_for(cell: Cell) -> CellJob:
        return CellJob(
            cell=cell, trace=traces[cell.load], model=scenario.model, gpu=scenario.gpu,
            slo=scenario.slo,
            command=tuple(scenario_command(scenario, out_root, cell.name)),
        )

    try:
        if use_ray:
            outcomes.update(_run_ray(scenario, scenario_dir, [job_for(c) for c in todo],
                                     ray_address, progress))
        else:
            for cell in todo:
                outcomes[cell.name] = _run_local(scenario, scenario_dir, job_for(cell),
                                                 runner or run_cell, progress)
    finally:
        progress.close()

    report = None
    if write_report:
        report = write_scenario_report(scenario_dir)
    ordered = tuple(
        outcomes.get(c.name, CellOutcome(c.name, "not_run", "not selected by --only"))
        for c in all_cells
    )
    return SweepResult(scenario_dir=scenario_dir, report=report, outcomes=ordered)


def _run_local(scenario: Scenario, scenario_dir: Path, job: CellJob, runner: CellRunner,
               progress: SweepProgress) -> CellOutcome:
    cell = job.cell
    cell_dir = scenario_dir / cell.name
    attempt = int(read_status(cell_dir).get("attempt", 0)) + 1
    _prepare_cell_dir(cell_dir, scenario, cell, attempt)
    status = read_status(cell_dir)
    progress.start_cell(cell.name, len(job.trace.requests))
    try:
        runner(job, cell_dir, progress.requests)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # a failed cell is data: record it and go on
        reason = _reason(exc)
        (cell_dir / ERROR_FILE).write_text(traceback.format_exc())
        _finish_status(cell_dir, "failed", reason, status)
        progress.finish_cell(cell.name, "failed", reason)
        return CellOutcome(cell.name, "failed", reason, cell_dir)
    _finish_status(cell_dir, "done", "", status)
    progress.finish_cell(cell.name, "done")
    return CellOutcome(cell.name, "done", "", cell_dir)


# ---------------------------------------------------------------- Ray


def _no_progress(done: int, total: int | None = None) -> None:
    """Progress of a cell on a Ray worker is not shown (the driver reports cells done)."""


def _ray_cell_task(job: CellJob) -> dict[str, Any]:
    """Run one cell on a Ray worker into a scratch folder; return its files to the driver."""
    with tempfile.TemporaryDirectory(prefix=f"batchlab-{job.cell.name}-") as tmp:
        out = Path(tmp)
        state, reason, tb = "done", "", ""
        try:
            run_cell(job, out, _no_progress)
        except Exception as exc:
            state, reason, tb = "failed", _reason(exc), traceback.format_exc()
        files = {p.relative_to(out).as_posix(): p.read_bytes()
                 for p in sorted(out.rglob("*")) if p.is_file()}
    return {"state": state, "reason": reason, "traceback": tb, "files": files}


@contextlib.contextmanager
def _ray_session(address: str | None) -> Iterator[Any]:
    try:
        import ray
    except ImportError:
        raise ScenarioError("--ray", None, "", "Ray is not installed: pip install 'batchlab[ray]'"
                            ) from None
    started = False
    if not ray.is_initialized():
        if address:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(include_dashboard=False, log_to_driver=False)
        started = True
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def _run_ray(scenario: Scenario, scenario_dir: Path, jobs: Sequence[CellJob],
             address: str | None, progress: SweepProgress) -> dict[str, CellOutcome]:
    """Run cells as Ray tasks (a live cell asks for its engine's GPUs) and gather each cell's
    files on the driver, so the run folders look exactly like a local sweep's."""
    outcomes: dict[str, CellOutcome] = {}
    if not jobs:
        return outcomes
    with _ray_session(address) as ray:
        task = ray.remote(_ray_cell_task)
        pending: dict[Any, CellJob] = {}
        for job in jobs:
            cell_dir = scenario_dir / job.cell.name
            attempt = int(read_status(cell_dir).get("attempt", 0)) + 1
            _prepare_cell_dir(cell_dir, scenario, job.cell, attempt)
            ref = task.options(num_cpus=1, num_gpus=job.cell.gpus).remote(job)
            pending[ref] = job
        progress.message(f"submitted {len(jobs)} cells to Ray")
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            job = pending.pop(ready[0])
            cell_dir = scenario_dir / job.cell.name
            status = read_status(cell_dir)
            try:
                result = ray.get(ready[0])
            except Exception as exc:  # the task itself died (worker lost, ...)
                result = {"state": "failed", "reason": _reason(exc),
                          "traceback": traceback.format_exc(), "files": {}}
            for rel, data in result["files"].items():
                target = cell_dir / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(target.name + ".tmp")
                tmp.write_bytes(data)
                os.replace(tmp, target)
            if result["state"] == "failed":
                (cell_dir / ERROR_FILE).write_text(result["traceback"])
            _finish_status(cell_dir, result["state"], result["reason"], status)
            progress.finish_cell(job.cell.name, result["state"], result["reason"])
            outcomes[job.cell.name] = CellOutcome(job.cell.name, result["state"],
                                                  result["reason"], cell_dir)
    return outcomes


# ---------------------------------------------------------------- report hook


def write_scenario_report(scenario_dir: Path) -> Path:
    """Render ``<scenario_dir>/report.md`` from what is on disk."""
    from harness.report import render_scenario_report

    return render_scenario_report(scenario_dir)
