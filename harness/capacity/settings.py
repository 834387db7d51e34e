"""The settings a capacity search covers: a scenario's engines × knob grid, or one target.

A scenario's load points are replaced by the search; everything else (trace and its options,
priority classes, model, GPU, engines, grid, SLO) is the scenario's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.capacity.probe import ProbePlan, trace_file_at
from harness.capacity.run import Setting, digest_of
from harness.capacity.search import LoadKind
from harness.manifest import batchlab_version
from harness.metrics import PACE_SIGMAS, PACE_TOLERANCE, SHORTEST_STEADY_E2ES, Slo
from harness.redact import redact_url, url_secrets
from harness.scenario import Scenario, ScenarioError, select
from harness.scenario.cell import target_spec
from harness.scenario.expand import load_cell_trace
from harness.scenario.schema import Cell, LoadPoint, file_sha256, model_config_file
from harness.target import TargetSpec
from harness.traces import Trace


def scenario_settings(scenario: Scenario, *, kind: LoadKind, target: float, slo: Slo | None,
                      think_time_s: float = 0.0, only: str | None = None,
                      command: Sequence[str] | None = None,
                      early_stop: bool = True,
                      warn: Callable[[str], None] | None = None) -> list[Setting]:
    """One setting per engine × grid combination of ``scenario`` (``only``: name patterns).
    ``warn``: told of the scenario's settings the search does not use (its trace's
    ``time_scale`` and ``rate``, in a rate search)."""
    slo = slo or scenario.slo
    if slo is None or not slo.as_dict():
        raise ScenarioError(scenario.source, None, "slo",
                            "a capacity search needs an SLO: give one in the scenario or --slo")
    if kind == "rate" and scenario.trace.mix:
        raise ScenarioError(scenario.source, scenario.trace.line, "trace.mix",
                            "a mixed trace keeps each part's timing: a rate search cannot "
                            "rescale it (search concurrency instead)")
    timing = [k for k in ("time_scale", "rate") if scenario.trace.options.get(k) is not None]
    if kind == "rate" and timing:
        # each probe's rate replaces the scenario's time scale or rate (both rescale time):
        # said, as the command line refuses --time-scale and --rate, not dropped silently
        if warn is not None:
            for key in timing:
                line = scenario.line_of(f"trace.{key}")
                warn(f"{scenario.source}{f':{line}' if line else ''}: trace.{key} "
                     f"{scenario.trace.options[key]:g} is not used: a rate search sets the "
                     "arrival rate of each probe itself (the trace rescaled to it)")
        options = {k: v for k, v in scenario.trace.options.items() if k != "time_scale"}
        scenario = dataclasses.replace(
            scenario, trace=dataclasses.replace(scenario.trace, options=options))
    one_load = dataclasses.replace(scenario, loads=(LoadPoint(),))
    settings = []
    for cell in select(one_load.cells(), only):
        if think_time_s and cell.engine.mode != "simulated":
            raise ScenarioError(scenario.source, cell.engine.line, cell.engine.name,
                                "think time is simulated only (the live closed loop has none)")
        spec = target_spec(cell, scenario.model, scenario.gpu)
        payload = {"cell": scenario.cell_digest(cell), "kind": kind, "target": target,
                   "slo": slo.as_dict(), "think_time_s": think_time_s,
                   **_rules(early_stop)}
        settings.append(Setting(cell.name, ProbePlan(
            spec=spec, trace_at=_scenario_trace(scenario), slo=slo, kind=kind,
            target=target, cell=_cell_record(cell, scenario.name), digest=digest_of(payload),
            made_from=payload,
            think_time_s=think_time_s, replay=dict(cell.engine.replay), command=command,
            early_stop=early_stop,
        ), scenario=scenario.name))
    return settings


def _rules(early_stop: bool) -> dict[str, Any]:
    """What else decides whether a probe passes: a resumed search reuses only probes judged
    by the same rules."""
    return {"early_stop": early_stop, "pace_sigmas": PACE_SIGMAS, "pace_tolerance": PACE_TOLERANCE,
            "steady_e2es": SHORTEST_STEADY_E2ES,
            # 2: windows shifted by the decode time, successful requests only, too short first
            "pace_rule": 2}


def _scenario_trace(scenario: Scenario) -> Any:
    def at(kind: LoadKind, load: float) -> Trace:
        point = LoadPoint("rate", load) if kind == "rate" else LoadPoint("concurrency", load)
        trace: Trace = load_cell_trace(scenario, point)
        return trace
    return at


def _cell_record(cell: Cell, scenario: str) -> dict[str, Any]:
    """``cell.json`` of the setting's probes, as a scenario cell's (the load is the probe's)."""
    record = cell.as_dict()
    record.pop("load", None)
    return {**record, "scenario": scenario}


def single_setting(spec: TargetSpec, *, name: str, trace_path: str,
                   trace_options: Mapping[str, Any], kind: LoadKind, target: float, slo: Slo,
                   knobs: Mapping[str, Any], think_time_s: float = 0.0,
                   replay: Mapping[str, Any] | None = None,
                   command: Sequence[str] | None = None, early_stop: bool = True) -> Setting:
    """The one target the command line describes (``batchlab capacity --trace ...``)."""
    mode = "simulated" if spec.simulated else "live"
    # the engine and the trace as they take effect, not as typed: --gpu h100-sxm, the default,
    # is the same engine as no --gpu, ./t.csv the same trace as t.csv (a --resume with either
    # reuses the probes; one that differs names what changed, ``run._what_changed``)
    options = dict(trace_options)
    if options.get("lengths_from"):
        options["lengths_from"] = str(Path(str(options["lengths_from"])).resolve())
    payload = {"engine": engine_settings(spec), "trace": _trace_identity(trace_path),
               "options": options,
               "kind": kind, "target": target, "slo": slo.as_dict(),
               "think_time_s": think_time_s, "replay": dict(replay or {}),
               "files": _files_read(spec, trace_path, trace_options),
               "batchlab": batchlab_version(), **_rules(early_stop)}
    cell = {"name": name, "engine": {"name": name, "engine": spec.engine, "mode": mode},
            "knobs": dict(knobs), "grid": {}}
    return Setting(name, ProbePlan(
        spec=spec, trace_at=trace_file_at(trace_path, trace_options), slo=slo, kind=kind,
        target=target, cell=cell, digest=digest_of(payload), made_from=payload,
        think_time_s=think_time_s,
        replay=dict(replay or {}), command=command, early_stop=early_stop,
    ))


def engine_settings(spec: TargetSpec) -> dict[str, Any]:
    """What the probes run on, as it takes effect, for ``made_from``: the simulated reference
    engine's resolved configuration (``ReferenceConfig.as_dict``: its defaults filled in, its
    profile by its coefficients' digest); a live engine's options as given (whose defaults are
    the engine's own, not known here). Secrets (the engine's environment, a URL's
    credentials) are digested, never spelled out: search.json records this."""
    if spec.simulated:
        from harness.sim.target import SimulatedTarget

        config = SimulatedTarget(spec).config().as_dict()
        if config.get("reserve_last_token") is False:
            # the behaviour of every engine before the setting existed: searches made then
            # (which record no such key) resume
            del config["reserve_last_token"]
        model_file = model_config_file(spec.model)
        if model_file is not None:  # a config.json by its path, however it was typed
            config["model"] = str(model_file.resolve())
        return {"engine": spec.engine, "mode": spec.mode, **config}
    knobs = {name: getattr(spec.knobs, name) for name in spec.knobs.given_names()}
    reference = {f.name: getattr(spec.reference, f.name)
                 for f in dataclasses.fields(spec.reference)
                 if getattr(spec.reference, f.name) is not None}
    out: dict[str, Any] = {
        "engine": spec.engine, "mode": spec.mode, "model": spec.model,
        "served_model_name": spec.served_model_name or spec.model, "gpu": spec.gpu,
        "profile": spec.profile, **knobs, **reference,
        "url": redact_url(spec.url) if spec.url else None,
        "allow_approximate": spec.allow_approximate, "executable": spec.executable,
        "runtime": spec.runtime, "metric_map": spec.metric_map, "port": spec.port,
        "ready_timeout_s": spec.ready_timeout_s,
        "telemetry_interval_s": spec.telemetry_interval_s}
    secrets = {"engine_env": dict(spec.engine_env) or None,
               "url_credentials": sorted(url_secrets(spec.url)) if spec.url else None}
    out.update({key: _secret_digest(value) for key, value in secrets.items() if value})
    return out


def _secret_digest(value: object) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _trace_identity(trace_path: str) -> str:
    """A trace file by its resolved path (its bytes: ``_files_read``); "synthetic" as is."""
    if str(trace_path).startswith("synthetic"):
        return str(trace_path)
    return str(Path(trace_path).resolve())


def _files_read(spec: TargetSpec, trace_path: str, options: Mapping[str, Any]
                ) -> dict[str, str | None]:
    """The bytes of every file the probes read (the trace, a lengths file, a profile, the
    model's config.json where the model is a path), by path: a trace rewritten in place, a
    recalibrated profile or an edited model config is searched again, not served from the
    last search, as a scenario cell's digest (``Scenario.cell_digest``)."""
    paths = [] if str(trace_path).startswith("synthetic") else [Path(trace_path)]
    if options.get("lengths_from"):
        paths.append(Path(str(options["lengths_from"])))
    config = model_config_file(spec.model)
    if config is not None:
        paths.append(config)
    if spec.profile:
        from adapters.reference.cost_model import ProfileError, resolve_profile

        with contextlib.suppress(ProfileError):  # refused where it is read, and why
            paths.append(resolve_profile(spec.profile))
    return {str(p.resolve()): file_sha256(p) for p in paths}
