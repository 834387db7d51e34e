"""``load_scenario``: a scenario YAML file validated once into a ``Scenario`` or a ScenarioError."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from adapters.base import KnobError, Knobs
from adapters.knobs import ADMISSIONS, check_positive_int
from harness.metrics import SLO_KEYS, Slo, slo_problem
from harness.scenario._text import REPO_ROOT, as_keys, did_you_mean, value_text
from harness.scenario._yaml import Checker, Node, compose, plain
from harness.scenario.cell import reference_config
from harness.scenario.expand import trace_options
from harness.scenario.schema import (
    ENGINE_KINDS,
    MODES,
    Cell,
    EngineSpec,
    LoadKind,
    LoadPoint,
    PriorityClass,
    Scenario,
    ScenarioError,
    TraceSpec,
    expand,
)
from harness.traces.bounds import (
    check_concurrency,
    check_count,
    check_rate,
    check_time_scale,
    check_timestamp_s,
    check_tokens,
)

BUNDLED_DATA = Path(__file__).resolve().parents[1] / "data"  # harness/data: bundled excerpts

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

# The bounds the command line and trace files apply to the same options
# (``harness.traces.bounds``), and the least value of each integer option (as TraceOptions).
TRACE_OPTION_BOUNDS: dict[str, Callable[[Any, str], object]] = {
    "limit": check_count,
    "num_requests": check_count,
    "prompt_tokens": check_tokens,
    "output_tokens": check_tokens,
    "max_model_len": check_tokens,
    "rate": check_rate,
    "time_scale": check_time_scale,
    "start_s": check_timestamp_s,
    "end_s": check_timestamp_s,
}
TRACE_OPTION_MINIMUM = {"limit": 1, "num_requests": 1, "prompt_tokens": 1, "output_tokens": 1,
                        "max_model_len": 2, "seed": 0}

LOAD_KEYS: dict[str, LoadKind] = {
    "rates": "rate",
    "time_scales": "time_scale",
    "concurrencies": "concurrency",
}

SCENARIO_KEYS = (
    "name", "question", "trace", "load", "slo", "priority_classes", "model", "gpu",
    "engines", "grid", "baseline", "seed",
)
ENGINE_KEYS = (
    "name", "engine", "mode", "model", "knobs", "url", "launch", "allow_approximate",
    "admission", "num_gpu_blocks", "block_size", "replay", "executable", "runtime",
    "served_model_name", "port", "ready_timeout_s", "env", "profile",
)
_LIVE_ONLY = ("url", "launch", "allow_approximate", "replay", "executable", "runtime",
              "served_model_name", "port", "ready_timeout_s", "env")

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def load_scenario(path: str | Path, *, trace_path: str | Path | None = None) -> Scenario:
    """Read and validate a scenario file. ``trace_path`` replaces the scenario's trace file
    (keeping its options), e.g. to run a scenario on a full trace instead of its excerpt."""
    path = Path(path)
    file = str(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScenarioError(file, None, "", f"cannot read: {exc.strerror or exc}") from None
    root = compose(text, file)
    c = Checker(file)
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

    scenario = Scenario(
        name=name, question=question, source=path, trace=trace, loads=loads, model=model,
        gpu=gpu, engines=engines, slo=slo, priority_classes=classes, grid=grid,
        baseline=baseline, seed=seed,
    )
    _check_trace_at_loads(c, scenario, top)
    cells = _expand_checked(c, scenario, top)
    if baseline is not None:
        names = [cell.name for cell in cells] + [e.name for e in engines]
        if baseline not in names:
            raise c.fail(top["baseline"], "baseline",
                         f"no cell or engine named {baseline!r}{did_you_mean(baseline, names)}")
    return scenario


def _parse_trace(c: Checker, y: Node, base: Path, override: str | Path | None,
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
            options[name] = c.integer(value, where, minimum=TRACE_OPTION_MINIMUM.get(name, 0))
        elif kind == "float":
            options[name] = c.number(value, where)
        elif kind == "bool":
            options[name] = c.boolean(value, where)
        elif kind == "path":
            options[name] = str(resolve_trace_path(c.string(value, where), base, c, value, where))
        else:
            options[name] = c.string(value, where)
        if name in TRACE_OPTION_BOUNDS:
            c.bounded(value, where, TRACE_OPTION_BOUNDS[name], options[name])
    check_trace_options(c, options, items, y, key)
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


def check_trace_options(c: Checker, options: dict[str, Any], items: dict[str, Node], y: Node,
                        key: str) -> None:
    """Build the ``TraceOptions`` now, so that what it refuses (a negative start, rate and
    time_scale together, ...) stops the file at load, at the key its message names."""
    from harness.traces import TraceError, TraceOptions

    try:
        TraceOptions(**options)
    except TraceError as exc:
        message = str(exc)
        flag, sep, rest = message.partition(": ")
        name = flag.removeprefix("--").replace("-", "_")
        if sep and flag.startswith("--") and name in items:  # "--start-s: expected ..."
            raise c.fail(items[name], f"{key}.{name}", as_keys(rest)) from None
        raise c.fail(y, key, as_keys(message)) from None


def resolve_trace_path(text: str, base: Path, c: Checker, y: Node, where: str) -> Path:
    """A trace path: absolute, relative to the scenario file, relative to the repository, or
    the name of a bundled excerpt (``harness/data``). ``$VARS`` and ``~`` are expanded."""
    raw = Path(os.path.expanduser(os.path.expandvars(text)))
    candidates = [raw] if raw.is_absolute() else [base / raw, REPO_ROOT / raw, BUNDLED_DATA / raw]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    folder = next((p for p in candidates if p.is_dir()), None)
    if folder is not None:
        raise c.fail(y, where, f"{text!r} is a folder ({folder}), not a trace file")
    bundled = sorted(p.name for p in BUNDLED_DATA.glob("*")
                     if p.is_file() and p.name.endswith((".csv", ".jsonl", ".json", ".gz")))
    hint = did_you_mean(raw.name, bundled)
    listing = f" Bundled excerpts: {', '.join(bundled)}." if bundled else ""
    raise c.fail(y, where, f"no trace file {text!r} (looked in "
                 f"{', '.join(str(p.parent) for p in candidates)}){hint}"
                 f"{'' if hint else '.'}{listing}")


def _check_trace_at_loads(c: Checker, scenario: Scenario, top: dict[str, Node]) -> None:
    """Each load point's trace options (a rate from ``load.rates`` and a time_scale in
    ``trace``, say) are the options one cell runs with: refused now, not in the sweep."""
    if "load" not in top:
        return
    from harness.traces import TraceError, TraceOptions

    for load in scenario.loads:
        for spec in scenario.trace.components():
            try:
                TraceOptions(**trace_options(scenario, load, spec))
            except TraceError as exc:
                raise c.fail(top["load"], "load", f"{load.label}: {exc}") from None


def _parse_load(c: Checker, y: Node) -> tuple[LoadPoint, ...]:
    items = c.mapping(y, "load", tuple(LOAD_KEYS))
    if len(items) != 1:
        raise c.fail(y, "load", "give exactly one of rates, time_scales or concurrencies")
    (key, value), = items.items()
    points = []
    for i, item in enumerate(c.seq(value, f"load.{key}")):
        where = f"load.{key}[{i}]"
        number = (c.integer(item, where, minimum=1) if key == "concurrencies"
                  else c.number(item, where, positive=True))
        checks: dict[str, Callable[[Any, str], object]] = {
            "concurrencies": check_concurrency, "rates": check_rate,
            "time_scales": check_time_scale}
        check = checks[key]
        c.bounded(item, where, check, number)
        points.append(LoadPoint(LOAD_KEYS[key], float(number)))
    labels = [p.label for p in points]
    if len(set(labels)) != len(labels):
        raise c.fail(value, f"load.{key}", "values repeat")
    return tuple(points)


def _parse_slo(c: Checker, y: Node) -> Slo:
    """The same rule as ``--slo`` (``slo_problem``), reported at the value's line."""
    items = c.mapping(y, "slo", SLO_KEYS)
    values: dict[str, float] = {}
    for key, value in items.items():
        problem = (slo_problem(value.value) if value.kind == "scalar"
                   else "must be a number of seconds, got "
                   + ("a list" if value.kind == "seq" else "a mapping"))
        if problem:
            raise c.fail(value, f"slo.{key}", problem)
        values[key] = float(value.value)
    return Slo(**values)


def _parse_priority_classes(c: Checker, y: Node) -> tuple[PriorityClass, ...]:
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


def _knob_int(c: Checker, y: Node, where: str) -> int:
    """A positive integer, bounded as every integer knob is (``check_positive_int``)."""
    value = c.integer(y, where, minimum=1)
    c.bounded(y, where, check_positive_int, value)
    return value


def _port(c: Checker, y: Node, where: str) -> int:
    value = c.integer(y, where, minimum=1)
    if value > 65535:
        raise c.fail(y, where, f"must be a TCP port (1 to 65535), got {value}")
    return value


def _check_knob(c: Checker, name: str, value: Any, y: Node, where: str) -> None:
    """Validate one knob as ``Knobs.from_mapping`` does; its error at ``y``'s line, or at the
    offending item's for a list (``extra_args`` items must be text, never nested lists)."""
    if y.kind == "seq":
        for i, item in enumerate(y.value):
            if item.kind != "scalar":
                raise c.fail(item, f"{where}[{i}]", "every item must be one argv item (text), "
                             f"got {'a list' if item.kind == 'seq' else 'a mapping'}")
    try:
        Knobs.from_mapping({name: value}, where="knobs")
    except (KnobError, TypeError) as exc:
        message = str(exc).removeprefix(f"knobs.{name}: ").removeprefix("knobs: ")
        raise c.fail(y, where, message) from None


def _knob_value(y: Node) -> Any:
    value = plain(y)
    return tuple(value) if isinstance(value, list) else value


def _parse_knobs(c: Checker, y: Node, where: str) -> dict[str, Any]:
    names = Knobs.names()
    if y.kind == "map" and where.startswith("engines["):
        for name, (key_y, _) in y.value.items():
            if name in ENGINE_KEYS and name not in names:  # an engine's key, one level down
                raise c.fail(key_y, f"{where}.{name}", f"{name} is a key of the engine, not "
                             f"of its knobs: write it beside knobs, as {where[:-6]}.{name}")
    items = c.mapping(y, where, names)
    out = {}
    for name, value in items.items():
        _check_knob(c, name, _knob_value(value), value, f"{where}.{name}")
        out[name] = _knob_value(value)
    return out


def _parse_engines(c: Checker, y: Node) -> tuple[EngineSpec, ...]:
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
        reference_only = ("admission", "num_gpu_blocks", "block_size", "profile")
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
            replay = plain(f["replay"])
        env: dict[str, str] = {}
        if "env" in f:
            if f["env"].kind != "map":
                raise c.fail(f["env"], f"{where}.env", "must be a mapping of NAME: value")
            env = {k: str(v) for k, v in plain(f["env"]).items()}

        def text(key: str, f: dict[str, Node] = f, where: str = where) -> str | None:
            return c.string(f[key], f"{where}.{key}") if key in f else None

        out.append(EngineSpec(
            name=name, engine=engine, mode=mode, knobs=knobs, url=url, launch=launch,
            allow_approximate=(c.boolean(f["allow_approximate"], f"{where}.allow_approximate")
                               if "allow_approximate" in f else False),
            admission=(c.choice(f["admission"], f"{where}.admission", ADMISSIONS)
                       if "admission" in f else None),
            num_gpu_blocks=(_knob_int(c, f["num_gpu_blocks"], f"{where}.num_gpu_blocks")
                            if "num_gpu_blocks" in f else None),
            block_size=(_knob_int(c, f["block_size"], f"{where}.block_size")
                        if "block_size" in f else None),
            replay=replay,
            profile=_profile(c, f["profile"], f"{where}.profile") if "profile" in f else None,
            model=text("model"),
            executable=text("executable"),
            runtime=text("runtime"),
            served_model_name=text("served_model_name"),
            port=_port(c, f["port"], f"{where}.port") if "port" in f else None,
            ready_timeout_s=(c.number(f["ready_timeout_s"], f"{where}.ready_timeout_s",
                                      positive=True) if "ready_timeout_s" in f else None),
            env=env,
            line=item.line,
        ))
    return tuple(out)


def _parse_grid(c: Checker, y: Node, engines: Sequence[EngineSpec]
                ) -> dict[str, tuple[Any, ...]]:
    items = c.mapping(y, "grid", Knobs.names())
    grid: dict[str, tuple[Any, ...]] = {}
    for name, value in items.items():
        where = f"grid.{name}"
        values = []
        for i, item in enumerate(c.seq(value, where)):
            v = _knob_value(item)
            _check_knob(c, name, v, item, f"{where}[{i}]")
            values.append(v)
        if len({value_text(v) for v in values}) != len(values):
            raise c.fail(value, where, "values repeat")
        for e in engines:
            if name in e.knobs:
                raise c.fail(value, where, f"engine {e.name!r} also sets {name} in its knobs; "
                             "set it in one place")
        grid[name] = tuple(values)
    return grid


def _expand_checked(c: Checker, scenario: Scenario, top: dict[str, Node]) -> tuple[Cell, ...]:
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


def _check_simulated_configs(c: Checker, scenario: Scenario, cells: Sequence[Cell],
                             top: dict[str, Node]) -> None:
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
            config = reference_config(cell, scenario.model, scenario.gpu)
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
            raise c.fail(y, where, f"cell {cell.name}: {as_keys(str(exc))}") from None
        _check_trace_fits(c, scenario, cell, config.resolved_max_model_len, top)


def _check_trace_fits(c: Checker, scenario: Scenario, cell: Cell, engine_len: int,
                      top: dict[str, Node]) -> None:
    """The trace's ``max_model_len`` (what it keeps, drops or clips) must not pass the
    engine's: the requests between would be rejected in the run, however ``on_too_long`` asked
    for them to be handled."""
    for spec in scenario.trace.components():
        trace_len = spec.options.get("max_model_len")
        if trace_len is None or trace_len <= engine_len:
            continue
        trace_y = top["trace"]
        node = _child(trace_y, "max_model_len") or trace_y
        raise c.fail(node, "trace.max_model_len",
                     f"{trace_len} passes cell {cell.name}'s engine max_model_len ({engine_len}: "
                     "its knobs' max_model_len, else the model's): requests between the two "
                     "would be rejected rather than handled as on_too_long says; give the "
                     "trace the engine's max_model_len or less")


def _child(y: Node, key: str) -> Node | None:
    """The value node of ``key`` in a mapping node, if there is one."""
    if y.kind == "map" and key in y.value:
        node: Node = y.value[key][1]
        return node
    return None


def _profile(c: Checker, node: Node, where: str) -> str:
    """A shipped engine profile's name (``batchlab profiles``) or a profile file."""
    from adapters.reference.cost_model import ProfileError, resolve_profile

    name = c.string(node, where)
    try:
        resolve_profile(name)
    except ProfileError as exc:
        raise c.fail(node, where, str(exc)) from None
    return name
