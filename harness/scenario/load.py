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
from harness.results import REPORT_FILE, REPORT_PLOTS
from harness.scenario._text import REPO_ROOT, as_keys, did_you_mean, key_of, value_text
from harness.scenario._yaml import Checker, Node, compose, key_lines, plain
from harness.scenario.cell import reference_config
from harness.scenario.expand import trace_options
from harness.scenario.schema import (
    ENGINE_KINDS,
    MODES,
    SCENARIO_FILE,
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
from harness.target import unused_option
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
RUNTIMES = ("native", "docker", "podman")  # as `batchlab launch --container-runtime`

# Replay client options (``harness.live.config.ReplayConfig`` fields) an engine's ``replay``
# may set, with their YAML types; the minimum of each integer. The other fields are set for
# it: target_url, model, engine and server_policy by the engine's plan, slo by the scenario's,
# mode and concurrency by load.concurrencies.
REPLAY_OPTION_TYPES: dict[str, str] = {
    "protocol": "choice",
    "max_concurrency": "int",
    "timeout_s": "float",
    "tokenizer_path": "str",
    "client_lag_threshold_s": "float",
    "api_key_env": "str",
    "seed": "int",
    "prefix_block_num_tokens": "int",
    "fsync_interval_s": "float",
    "prebuild_max_prompt_tokens": "int",
    "http_client": "choice",
    "length_control": "choice",
    "spin_window_s": "float",
    "max_event_bytes": "int",
    "timings_per_token": "bool",
    "prompt_salt": "str",
}
REPLAY_OPTION_MINIMUM = {"seed": 0, "prebuild_max_prompt_tokens": 0}
REPLAY_SET_FOR_IT = {
    "target_url": "the engine's url, or the server it launches",
    "model": "served_model_name, or the model",
    "engine": "the engine", "server_policy": "its policy knob",
    "slo": "the scenario's slo",
    "mode": "load.concurrencies (a closed loop)", "concurrency": "load.concurrencies",
}

# Names a cell's folder cannot take: the files a sweep writes beside its cells (the scenario's
# record, its report and figures), and a capacity search's record (harness.capacity.run).
RESERVED_NAMES = (SCENARIO_FILE, REPORT_FILE, *REPORT_PLOTS, "capacity.json")

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def load_scenario(path: str | Path, *, trace_path: str | Path | None = None) -> Scenario:
    """Read and validate a scenario file. ``trace_path`` replaces the scenario's trace file
    (keeping its options), e.g. to run a scenario on a full trace instead of its excerpt."""
    path = Path(path)
    file = str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ScenarioError(file, None, "", f"cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ScenarioError(file, line, "", f"not UTF-8 text (byte 0x{data[exc.start]:02x}, "
                            f"column {column}): a scenario file is UTF-8 YAML") from None
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
    engines = _parse_engines(c, top["engines"], loads)
    grid = _parse_grid(c, top["grid"], engines) if "grid" in top else {}
    baseline = c.string(top["baseline"], "baseline") if "baseline" in top else None

    if trace.mix and any(lp.kind == "rate" for lp in loads):
        raise c.fail(top["load"], "load.rates",
                     "a mixed trace keeps each part's timing: use time_scales instead of rates")

    scenario = Scenario(
        name=name, question=question, source=path, trace=trace, loads=loads, model=model,
        gpu=gpu, engines=engines, slo=slo, priority_classes=classes, grid=grid,
        baseline=baseline, seed=seed, lines=key_lines(root),
        trace_override=None if trace_path is None else str(trace_path),
    )
    _check_trace_at_loads(c, scenario, top)
    cells = _expand_checked(c, scenario, top)
    if baseline is not None:
        names = [cell.name for cell in cells] + [e.name for e in engines]
        if baseline not in names:
            raise c.fail(top["baseline"], "baseline",
                         f"no cell or engine named {baseline!r}{did_you_mean(baseline, names)}")
    return scenario


def _typed(c: Checker, value: Node, key: str, kind: str, minimum: int) -> Any:
    """An option's value of its declared kind (``int``, ``float``, ``bool``, else text), as
    the trace and replay options declare them; an int at least ``minimum``."""
    if kind == "int":
        return c.integer(value, key, minimum=minimum)
    if kind == "float":
        return c.number(value, key)
    if kind == "bool":
        return c.boolean(value, key)
    return c.string(value, key)


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
        options[name] = (
            str(resolve_trace_path(c.string(value, where), base, c, value, where))
            if kind == "path" else
            _typed(c, value, where, kind, TRACE_OPTION_MINIMUM.get(name, 0)))
        if name in TRACE_OPTION_BOUNDS:
            c.bounded(value, where, TRACE_OPTION_BOUNDS[name], options[name])
    check_trace_options(c, options, items, y, key)
    path: Path | str
    if override is not None and is_synthetic(str(override)):
        path = str(override)
    elif override is not None:
        path = Path(override)
        if not path.exists():
            raise ScenarioError(str(override), None, "--trace", "no such file")
    else:
        text = c.string(items["path"], f"{key}.path")
        path = (text if is_synthetic(text)
                else resolve_trace_path(text, base, c, items["path"], f"{key}.path"))
    try:
        if isinstance(path, str) and (nested or "mix" in items):
            raise c.fail(items["path"] if nested else items["mix"], f"{key}.path" if nested
                         else "trace.mix", "a mix keeps each trace's own timestamps (rescaled "
                         "with time_scale); a synthetic trace has none, its arrivals are drawn "
                         "at a rate: it cannot be part of a mix")
        _check_source(c, path, options, items, y, key)
    except ScenarioError as exc:
        if override is None or not is_synthetic(str(override)):
            raise
        # the scenario's trace block was written for a file: say where "synthetic" came from
        raise ScenarioError(exc.file, exc.line, exc.key, (
            f"{exc.message} (--trace {override} replaced the scenario's trace file; its "
            "trace: block must give a synthetic trace's options: num_requests, a rate or "
            "load.rates, and prompt_tokens with output_tokens or lengths_from; no time_scale, "
            "start_s/end_s or mix)")) from None
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


def is_synthetic(text: str) -> bool:
    """``synthetic`` or ``synthetic:<arrival>``: requests generated from the trace options, no
    file (as ``--trace``, ``harness.traces.load_trace``, reads it)."""
    return text.split(":")[0] == "synthetic"


def _check_source(c: Checker, path: Path | str, options: dict[str, Any], items: dict[str, Node],
                  y: Node, key: str) -> None:
    """What ``load_trace`` would refuse of a trace file's options or a synthetic trace's (its
    rate excepted, which load points may give: ``_check_trace_at_loads``), at their keys."""
    from harness.traces import ARRIVALS

    def at(name: str) -> Node:
        return items.get(name, y)

    fmt = options.get("format")
    if isinstance(path, Path):
        if fmt == "synthetic":
            raise c.fail(at("format"), f"{key}.format",
                         f"synthetic reads no trace file ({path.name}): generate requests with "
                         "path: synthetic (and lengths_from to sample their lengths from a "
                         "trace file)")
        for name, why in (("num_requests", "limit: N keeps the first N requests of a trace "
                                           "file"),
                          ("lengths_from", "it samples their lengths")):
            if name in options:
                raise c.fail(at(name), f"{key}.{name}",
                             f"applies to synthetic traces (path: synthetic); {why}")
        return
    where = f"{key}.path"
    if fmt not in (None, "synthetic"):
        raise c.fail(at("format"), f"{key}.format",
                     f"{fmt} reads a trace file; path {path!r} generates requests: leave "
                     "format out, or give a trace file")
    arrival = path.partition(":")[2]
    if ":" in path and arrival not in ARRIVALS:
        raise c.fail(at("path"), where,
                     f"{path!r}: expected synthetic or synthetic:<{'|'.join(ARRIVALS)}>"
                     f"{did_you_mean(arrival, ARRIVALS)}")
    asked = options.get("arrival") or ("gamma" if "burstiness" in options else None)
    if arrival and asked is not None and asked != arrival:
        name = "arrival" if "arrival" in options else "burstiness"
        raise c.fail(at(name), f"{key}.{name}",
                     f"{name} {options[name]} asks for {asked} arrivals; path {path} draws "
                     f"{arrival} arrivals: give one of them")
    for name in ("start_s", "end_s"):
        if name in options:
            raise c.fail(at(name), f"{key}.{name}",
                         "a synthetic trace has no timestamps to take a window of")
    if "time_scale" in options:
        raise c.fail(at("time_scale"), f"{key}.time_scale",
                     "rescales a trace's timestamps; a synthetic trace's arrivals are drawn at "
                     "its rate: set rate (requests per second)")
    if "num_requests" not in options:
        raise c.fail(y, f"{key}.num_requests",
                     f"is required for a synthetic trace (path: {path}): the number of requests "
                     "to generate")
    if "lengths_from" not in options:
        for name in ("prompt_tokens", "output_tokens"):
            if name not in options:
                raise c.fail(y, f"{key}.{name}",
                             "a synthetic trace needs its lengths: prompt_tokens and "
                             "output_tokens, or lengths_from (a trace file to sample them "
                             "from)")


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
    the name of a bundled excerpt (``harness/data``). ``$VARS`` and ``~`` are expanded;
    ``$BATCHLAB_TRACES_DIR`` unset is its default (``harness.traces.data``), any other
    variable unset is an error naming it."""
    raw = Path(os.path.expanduser(_expand_vars(text, c, y, where)))
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


_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def _expand_vars(text: str, c: Checker, y: Node, where: str) -> str:
    """``$NAME`` and ``${NAME}`` in a path: os.path.expandvars leaves an unset one as it is,
    and the path then names a folder called ``$NAME``."""
    from harness.traces.data import TRACES_DIR_ENV, default_traces_dir

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if os.environ.get(name):
            return os.environ[name]
        if name == TRACES_DIR_ENV:  # the same default as the command line's
            return str(default_traces_dir())
        raise c.fail(y, where, f"{text!r} uses ${name}, which is not set in the environment")

    return _VAR.sub(value, text)


def _check_trace_at_loads(c: Checker, scenario: Scenario, top: dict[str, Node]) -> None:
    """Each load point's trace options (a rate from ``load.rates`` and a time_scale in
    ``trace``, say) are the options one cell runs with: refused now, not in the sweep. A
    synthetic trace needs a rate, its own or the load point's (N users need none)."""
    from harness.traces import TraceError, TraceOptions

    if "rate" in scenario.trace.options and any(load.kind == "rate" for load in scenario.loads):
        # load.rates gives each cell its rate: the trace's own would never be read
        rate = top["trace"].value.get("rate") if top["trace"].kind == "map" else None
        raise c.fail(rate[1] if rate else top["trace"], "trace.rate",
                     "load.rates gives each cell its rate, so this one would never be "
                     "used: remove it, or give the rates in load.rates only")
    for i, load in enumerate(scenario.loads):
        node, where = _load_point(c, top, i)
        for spec in scenario.trace.components():
            options = trace_options(scenario, load, spec)
            if spec.file is None and load.kind == "time_scale":
                raise c.fail(node, where, "a synthetic trace's arrivals are drawn at a rate, "
                             "not rescaled: give load.rates instead of time_scales")
            if spec.file is None and options.get("rate") is None and load.kind != "concurrency":
                raise c.fail(top["trace"], "trace.rate",
                             "is required for a synthetic trace (requests per second), in the "
                             "trace or as load.rates")
            if "load" not in top:
                continue
            try:
                TraceOptions(**options)
            except TraceError as exc:
                raise c.fail(node, where,
                             f"at load point {load.label}: {as_keys(str(exc))}") from None


def _load_point(c: Checker, top: dict[str, Node], index: int) -> tuple[Node, str]:
    """The node and key path of the ``index``-th load point (``load.rates[1]``); the trace's
    when the scenario gives no load (its own timing)."""
    if "load" not in top:
        return top["trace"], "trace"
    (name, (_, values)), = top["load"].value.items()  # _parse_load: exactly one key
    return c.seq(values, f"load.{name}")[index], f"load.{name}[{index}]"


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


def _parse_engines(c: Checker, y: Node, loads: Sequence[LoadPoint]) -> tuple[EngineSpec, ...]:
    out: list[EngineSpec] = []
    for i, item in enumerate(c.seq(y, "engines")):
        where = f"engines[{i}]"
        f = c.mapping(item, where, ENGINE_KEYS, required=("name", "engine"))
        name = c.string(f["name"], f"{where}.name")
        if not _SAFE_NAME.match(name):
            raise c.fail(f["name"], f"{where}.name",
                         f"{name!r} must be letters, digits, '.', '_' or '-' (it names a folder)")
        _check_not_reserved(c, name, f["name"], f"{where}.name")
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
        if url is not None:
            from harness.live.config import target_url_problem

            if why := target_url_problem(url, f"{where}.url"):  # "<key>: <why>"
                raise c.fail(f["url"], f"{where}.url", why.split(": ", 1)[1])
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
        replay = _parse_replay(c, f["replay"], f"{where}.replay", loads) if "replay" in f else {}
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
            runtime=(c.choice(f["runtime"], f"{where}.runtime", RUNTIMES)
                     if "runtime" in f else None),
            served_model_name=text("served_model_name"),
            port=_port(c, f["port"], f"{where}.port") if "port" in f else None,
            ready_timeout_s=(c.number(f["ready_timeout_s"], f"{where}.ready_timeout_s",
                                      positive=True) if "ready_timeout_s" in f else None),
            env=env,
            line=item.line,
        ))
        for key, option in (("runtime", "runtime"), ("executable", "executable"),
                            ("env", "engine_env"), ("port", "port")):
            if key not in f:
                continue
            value = out[-1].runtime if key == "runtime" else True  # (given: checked above)
            why = unused_option(option, engine, value, launch=launch)
            if why:
                raise c.fail(f[key], f"{where}.{key}", f"{why}: it would be ignored")
    return tuple(out)


def _check_not_reserved(c: Checker, name: str, y: Node, where: str) -> None:
    """A cell is a folder beside the files its sweep writes: it cannot take one's name (nor
    differ from one in case only, as the same file on macOS and Windows)."""
    taken = next((r for r in RESERVED_NAMES if r.lower() == name.lower()), None)
    if taken is not None:
        same = "" if taken == name else f" ({taken}, on a file system that ignores case)"
        raise c.fail(y, where, f"{name!r} is the name of a file the sweep writes in the "
                     f"scenario's folder{same}, where the cells' folders are: name the engine "
                     f"otherwise (reserved: {', '.join(RESERVED_NAMES)})")


def _parse_replay(c: Checker, y: Node, where: str, loads: Sequence[LoadPoint]
                  ) -> dict[str, Any]:
    """A live engine's replay client options, checked as ``ReplayConfig.validate`` checks
    them (with each load point's loop, open or closed), at their keys."""
    from harness.live.config import ReplayConfig
    from harness.live.protocols import LENGTH_CONTROLS, PROTOCOLS

    if y.kind != "map":
        raise c.fail(y, where, "must be a mapping of replay options")
    for name, (key_y, _) in y.value.items():
        if name in REPLAY_SET_FOR_IT:
            raise c.fail(key_y, f"{where}.{name}", f"is not a replay option of a scenario: "
                         f"{REPLAY_SET_FOR_IT[name]} sets it")
    items = c.mapping(y, where, tuple(REPLAY_OPTION_TYPES))
    choices: dict[str, Sequence[str]] = {
        "protocol": PROTOCOLS, "length_control": LENGTH_CONTROLS,
        "http_client": ("lean", "httpx")}
    out: dict[str, Any] = {}
    for name, value in items.items():
        key, kind = f"{where}.{name}", REPLAY_OPTION_TYPES[name]
        out[name] = (c.choice(value, key, choices[name]) if kind == "choice" else
                     _typed(c, value, key, kind, REPLAY_OPTION_MINIMUM.get(name, 1)))
    # the tokenizer and the key's variable are the machine's that runs the cell (a Ray
    # worker's, say): looked for there, when the replay starts
    fields = {k: v for k, v in out.items() if k not in ("tokenizer_path", "api_key_env")}
    for closed in sorted({lp.kind == "concurrency" for lp in loads}):
        loop: dict[str, Any] = {"mode": "closed", "concurrency": 1} if closed else {}
        try:
            ReplayConfig(target_url="http://127.0.0.1:8000", **{**fields, **loop}).validate()
        except ValueError as exc:
            name, sep, message = str(exc).partition(": ")
            if closed and name == "max_concurrency":
                message = ("caps the open loop's requests in flight; load.concurrencies runs a "
                           "closed loop, whose users are its values")
            if sep and name in items:
                raise c.fail(items[name], f"{where}.{name}", as_keys(message)) from None
            raise c.fail(y, where, as_keys(str(exc))) from None
    return out


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
    engines_y = c.seq(top["engines"], "engines")
    for cell in cells:  # an engine's name alone is checked; a cell's name holds it
        where = f"{scenario.engine_key(cell.engine)}.name"
        _check_not_reserved(c, cell.name, engines_y[scenario.engines.index(cell.engine)]
                            .value["name"][1], where)
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
            name, sep, message = str(exc).partition(": ")  # "tp: 3 must divide ..."
            if not sep:
                name, message = "", str(exc)
            name = key_of(name)  # the engine's "tp" is the key tensor_parallel_size
            y, where = _config_key(scenario, cell, name, engines_y, top)
            if name == "model" and message.startswith("unknown model"):
                message = _with_model_hint(message, cell.engine.model or scenario.model)
            said = f"{name}: {message}" if name else message
            raise c.fail(y, where, f"cell {cell.name}: {as_keys(said)}") from None
        _check_trace_fits(c, scenario, cell, config.resolved_max_model_len, top)


def _config_key(scenario: Scenario, cell: Cell, name: str, engines_y: Sequence[Node],
                top: dict[str, Node]) -> tuple[Node, str]:
    """Where the setting a simulated cell's engine refused (``name``) is written: the engine's
    own key (its model, profile, a knob), the grid's, the scenario's model or gpu, else the
    engine's entry (its knobs, when the refused knob is left to its default)."""
    where = scenario.engine_key(cell.engine)
    engine_y = engines_y[scenario.engines.index(cell.engine)]
    knobs_y = _child(engine_y, "knobs")
    if name in ("model", "profile", "admission", "num_gpu_blocks", "block_size"):
        own = _child(engine_y, name)
        if own is not None:
            return own, f"{where}.{name}"
    if name in ("model", "gpu"):
        return top[name], name
    if name in Knobs.names():
        if name in cell.grid:
            return _child(top["grid"], name) or top["grid"], f"grid.{name}"
        own = _child(knobs_y, name) if knobs_y is not None else None
        if own is not None:
            return own, f"{where}.knobs.{name}"
        if knobs_y is not None:
            return knobs_y, f"{where}.knobs"
    return engine_y, where


def _with_model_hint(message: str, model: str) -> str:
    """An unknown model's message, with the catalog's closest name (as an unknown GPU's has)."""
    from adapters.reference.models import known_models

    hint = did_you_mean(model.lower(), known_models())
    if not hint:
        return message
    head, sep, rest = message.partition("; ")
    return f"{head} ({hint.removeprefix('; ')}){sep}{rest}"


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
