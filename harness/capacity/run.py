"""Capacity searches for several engine × knob settings, recorded so a report can read them.

    OUT/scenario.json               the probes as the cells of one sweep (for ``batchlab report``)
    OUT/capacity.json               one row per setting: capacity, bracket, status
    OUT/report.md                   curves, capacity table, findings, every probe
    OUT/<setting>/search.json       spec, bracket, result, precision and every probe, in order
    OUT/<setting>/<probe>/          one recorded run per probe (harness.capacity.probe)

``search.json`` is rewritten after every probe, so an interrupted search shows how far it got;
``resume`` reuses every finished probe whose digest matches (what the outcome depends on: the
engine, knobs, trace, SLO and target) and runs only the rest. A server batchlab attached to
(``--url``) may have been restarted with another configuration since: a resume whose probes it
answered reporting other settings than it reports now (its knobs, model, version) is refused,
naming what changed (``check_same_server``), as one with another SLO or trace is.

A folder holds one search. Another one there (another scenario's, or, without a scenario,
another engine, knobs, trace, SLO or target: ``other_search``) is refused unless the command
line says ``--overwrite``; then its setting folders are removed first (``check_same_search``).
The same search again starts over, or, with ``resume``, goes on; a scenario edited since is
the same scenario's search, each setting whose definition changed searched again (as
``batchlab run`` runs an edited scenario again in its folder).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast, get_args

from adapters.reference.cost_model import PROFILES_DIR
from harness.capacity.probe import (
    ProbePlan,
    cut_off_fields,
    cut_off_text,
    probe_label,
    read_probe,
    run_probe,
)
from harness.capacity.search import (
    LOAD_UNITS,
    LoadCap,
    LoadKind,
    ProbeOutcome,
    SearchResult,
    SearchSpec,
    Status,
    load_text,
    search,
)
from harness.manifest import jsonable, read_manifest
from harness.metrics import SHORTEST_STEADY_E2ES, attainment_text, num_cut_off
from harness.prediction import CAPACITY_CAVEAT, summary_prediction
from harness.redact import redact_argv, redact_tree
from harness.results import (
    REPORT_FILE,
    REPORT_PLOTS,
    SEARCH_FILE,
    SUMMARY_FILE,
    failure_reason,
    read_json_object,
    write_json_atomic,
)
from harness.runfolder import (
    LOCK_FILE,
    RunDirError,
    check_each,
    check_removable,
    holding_dir,
    refuse_results_folder,
    remove_run_dir,
    writer_of,
)
from harness.scenario.attached import changed_since, identity_now, is_attached
from harness.scenario.status import CELL_FILE

CAPACITY_FILE = "capacity.json"
SCENARIO_FILE = "scenario.json"  # read by harness.report as a sweep's metadata

Log = Callable[[str], None]


@dataclass(frozen=True)
class Setting:
    """One engine × knob setting whose capacity is searched."""

    name: str  # its folder, e.g. ``fcfs__max_num_seqs-64``
    plan: ProbePlan
    scenario: str | None = None  # the scenario it is a setting of; None: the command line's


@dataclass(frozen=True)
class SettingResult:
    setting: Setting
    result: SearchResult | None  # None: the search failed or was interrupted
    error: str | None = None
    interrupted: tuple[ProbeOutcome, ...] | None = None  # probes done before Ctrl-C
    earlier: bool = False  # read back from an earlier search (not searched this time)
    running: bool = False  # being searched, or waiting its turn (``interrupted``: done so far)


# a setting's ``error`` in capacity.json when the search was interrupted before it began
NOT_STARTED = "not searched: interrupted before it started"
# search.json of a failed search: the folder of the probe it failed in, whose status.json
# says why; the report lists that probe as a failed cell of the setting
FAILED_PROBE = "failed_probe"


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during a search, with the probes it finished before."""

    def __init__(self, probes: tuple[ProbeOutcome, ...]) -> None:
        super().__init__()
        self.probes = probes


def digest_of(payload: Mapping[str, Any]) -> str:
    text = json.dumps(jsonable(dict(payload)), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _what_changed(before: Any, now: Mapping[str, Any] | None) -> str:
    """Which of a search's settings differ from those ``search.json`` was made with, in
    words; the usual suspects when the file does not say (an older batchlab)."""
    if not isinstance(before, Mapping) or not now:
        return ("engine, knobs, trace, SLO, target or early stop changed, or an older "
                "batchlab judged its probes")
    names = {"cell": "the scenario cell (engine, knobs, trace or the files it reads)",
             "spec": "engine or knobs", "engine": "engine or knobs",
             "files": "the bytes of the trace, lengths, profile "
             "or model config file", "batchlab": "the batchlab version",
             "options": "trace options",
             "think_time_s": "think time", "target": "target attainment",
             "kind": "search kind (rate or concurrency)", "slo": "SLO"}
    # the bytes of a file first: a rewritten profile changes the engine's coefficients too
    changed = [k for k in sorted(set(before) | set(now), key=lambda k: (k != "files", k))
               if json.dumps(jsonable(before.get(k)), sort_keys=True, default=str)
               != json.dumps(jsonable(now.get(k)), sort_keys=True, default=str)]
    parts = []
    for k in changed:
        what = names.get(k, k.replace("_", " "))
        old, new = before.get(k), now.get(k)
        if k == "files" and isinstance(old, Mapping) and isinstance(new, Mapping):
            paths = sorted(p for p in set(old) & set(new) if old[p] != new[p])
            read_now = sorted(set(new) - set(old))
            said = (["the bytes of " + ", ".join(paths)] if paths else []) + (
                ["now also read: " + ", ".join(read_now) + " (not among the files the "
                 "probes were made from: an older batchlab, or another setting)"]
                if read_now else [])
            what = "; ".join(said) if said else what
        if k == "engine" and isinstance(old, Mapping) and isinstance(new, Mapping):
            what += ": " + "; ".join(_engine_changes(old, new))
        if k in ("options", "cell") and isinstance(old, Mapping) and isinstance(new, Mapping):
            fields = _field_changes(old, new)
            what = f"{what}: {'; '.join(fields)}" if fields else what
        if k in ("target", "kind", "slo", "early_stop", "think_time_s", "trace"):
            what += f": {before.get(k)!r} then, {now.get(k)!r} now"
        parts.append(what)
    return "changed: " + "; ".join(parts) if parts else "an older batchlab judged its probes"


def _field_changes(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = ""
                   ) -> list[str]:
    """Each field that differs between two records (nested ones by their dotted path), in
    words: ``limit: 600 then, 500 now``; a field one of them lacks is "unset" there."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += _field_changes(a, b, f"{prefix}{key}.")
        elif (json.dumps(jsonable(a), sort_keys=True, default=str)
              != json.dumps(jsonable(b), sort_keys=True, default=str)):
            then = "unset" if key not in old else json.dumps(jsonable(a), default=str)
            now = "unset" if key not in new else json.dumps(jsonable(b), default=str)
            out.append(f"{prefix}{key}: {then} then, {now} now")
    return out


# The flags of the engine settings ``settings.engine_settings`` records that are not knobs
# (``adapters.knobs.SPECS``, whose flags are their names) or are named otherwise there.
_ENGINE_FLAGS = {"engine": "--engine", "mode": "--launch/--url", "model": "--model",
                 "gpu": "--gpu", "tp": "--tensor-parallel-size", "profile": "--profile",
                 "cost_model": "--profile", "cost_model_digest": "--profile (its coefficients)",
                 "served_model_name": "--model", "url": "--url", "url_credentials": "--url",
                 "executable": "--engine-executable", "runtime": "--container-runtime",
                 "metric_map": "--metric-map", "port": "--port",
                 "engine_env": "--engine-env", "allow_approximate": "--allow-approximate",
                 "ready_timeout_s": "--ready-timeout-s",
                 "telemetry_interval_s": "--telemetry-interval-s"}
_DIGESTED = ("engine_env", "url_credentials", "cost_model_digest")  # their values say nothing
# resolved from the others where not given (the KV blocks from the GPU, model and memory
# knobs): said after them, by what they are
_DERIVED = {"num_gpu_blocks": "KV blocks (--num-gpu-blocks, or what the GPU and knobs leave)",
            "admission": "admission (--admission, or what --preemption implies)"}


def _engine_changes(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The engine settings that differ, by flag and value: "--max-num-seqs 256 then, 64
    now" (a setting not a flag, such as a profile's ``oversized_prompts``, by its name)."""
    from adapters.knobs import SPECS

    def text(value: Any) -> str:
        return "unset" if value is None else json.dumps(jsonable(value), default=str).strip('"')

    out = []
    for key in sorted(set(before) | set(now), key=lambda k: (k in _DERIVED, k)):
        old, new = before.get(key), now.get(key)
        if json.dumps(jsonable(old), default=str) == json.dumps(jsonable(new), default=str):
            continue
        flag = (_DERIVED.get(key) or _ENGINE_FLAGS.get(key)
                or (SPECS[key].flag if key in SPECS else key))
        out.append(f"{flag} changed" if key in _DIGESTED
                   else f"{flag} {text(old)} then, {text(new)} now")
    return out


def known_probes(search_dir: Path, digest: str, *, full: bool = False,
                 made_from: Mapping[str, Any] | None = None,
                 instead: str = "drop --resume to start over") -> dict[float, ProbeOutcome]:
    """Finished probes of this search (same digest) in ``search_dir``, by load (``full``:
    the runs that confirmed a probe stopped early, instead). Refuses a ``search.json`` made
    with other settings rather than mixing two searches (``instead``: what to do)."""
    recorded = read_json_object(search_dir / SEARCH_FILE)
    if recorded and recorded.get("digest") != digest:
        raise ValueError(f"{search_dir / SEARCH_FILE}: made with other settings ("
                         f"{_what_changed(recorded.get('made_from'), made_from)}); {instead}, "
                         "or choose another --out")
    known: dict[float, ProbeOutcome] = {}
    if not search_dir.is_dir():
        return known
    for sub in sorted(search_dir.iterdir()):
        outcome = read_probe(sub, digest) if sub.is_dir() else None
        if outcome is not None and outcome.full == full:
            known[outcome.load] = outcome
    return known


def run_search(setting: Setting, spec: SearchSpec, out_dir: Path, *, resume: bool = False,
               log: Log | None = None,
               on_probe: Callable[[tuple[ProbeOutcome, ...]], None] | None = None
               ) -> SearchResult:
    """Search one setting's capacity into ``out_dir`` (its probes are subfolders). A
    concurrency search stops at one user per SHORTEST_STEADY_E2ES requests of the trace:
    with fewer each, the users' first requests, all sent at once, are most of the run, a
    burst rather than the steady load of N users (as a rate probe too short to show a steady
    state fails)."""
    spec.validate()
    plan = setting.plan
    load_cap = None
    if spec.kind == "concurrency":
        num_requests = len(plan.trace_at(spec.kind, spec.start).requests)
        most = max(1, num_requests // SHORTEST_STEADY_E2ES)
        if num_requests >= 1 and most < spec.highest:
            lowered = [f"--{name} {value:g}" for name, value in
                       (("start", spec.start), ("min-load", spec.lowest)) if value > most]
            spec = replace(spec, max_load=float(most), start=min(spec.start, float(most)),
                           min_load=min(spec.lowest, float(most)))
            users = load_text("concurrency", most)
            load_cap = LoadCap(float(most), (
                f"one user per {SHORTEST_STEADY_E2ES} requests of the trace "
                f"({num_requests} requests: {users}); with fewer requests each, the users' "
                "first requests, sent at once, are most of the run"))
            if lowered and log is not None:  # the user's own bounds: said, not silently moved
                log(f"{setting.name}: {' and '.join(lowered)} lowered to {users}, the "
                    f"most this trace can judge: {load_cap.why}")
    out_dir.mkdir(parents=True, exist_ok=True)
    known = known_probes(out_dir, plan.digest, made_from=plan.made_from) if resume else {}
    known_full = known_probes(out_dir, plan.digest, full=True) if resume else {}
    if resume:
        check_same_server(setting, out_dir)
    else:
        _clear_earlier_probes(out_dir, setting.name, log, plan=plan)
    done: list[ProbeOutcome] = []
    running: list[str] = []  # the probe under way: the one that failed, if the search does

    def write(status: str, result: SearchResult | None = None, error: str | None = None) -> None:
        probes = result.probes if result is not None else tuple(done)
        record = _search_record(setting, spec, status, probes, result, error, load_cap,
                                out_dir)
        if status == "failed" and running:  # its folder says why (status.json)
            record[FAILED_PROBE] = running[0]
        write_json_atomic(redact_tree(record), out_dir / SEARCH_FILE)

    def probe(load: float) -> ProbeOutcome:
        if log is not None:
            log(f"{setting.name}: probe {load_text(spec.kind, load)}")
        running[:] = [probe_label(spec.kind, load)]
        outcome = run_probe(plan, load, out_dir / running[0])
        running.clear()
        return outcome

    def confirm(load: float) -> ProbeOutcome:
        if log is not None:
            log(f"{setting.name}: probe {load_text(spec.kind, load)} again, to its end: it "
                "was stopped early as over-saturated, and the answer must not rest on that")
        running[:] = [probe_label(spec.kind, load, full=True)]
        outcome = run_probe(plan, load, out_dir / running[0], full=True)
        running.clear()
        return outcome

    def recorded(outcome: ProbeOutcome) -> None:
        done.append(outcome)
        write("running")
        if on_probe is not None:
            on_probe(tuple(done))
        if log is not None:
            log(f"{setting.name}: {load_text(spec.kind, outcome.load)}: "
                f"{probe_verdict(outcome, plan.target, out_dir)}")

    write("running")
    try:
        result = search(spec, probe, known=known, on_probe=recorded,
                        confirm=confirm if plan.early_stop else None, known_full=known_full)
    except KeyboardInterrupt:
        write("interrupted")
        raise SearchInterrupted(tuple(done)) from None
    except Exception as exc:
        write("failed", error=f"{type(exc).__name__}: {exc}")
        raise
    result = replace(_trace_bound(result, plan.target), load_cap=load_cap)
    write(result.status, result)
    answer = result_answer(result, plan, spec.kind, out_dir)
    if answer is not None and log is not None:
        log(f"{setting.name}: {answer}")
    return result


def probe_verdict(outcome: ProbeOutcome, target: float, search_dir: Path) -> str:
    """A probe's outcome in words, the reason it failed first: "SLO attainment 50.3%, failed:
    below the 99.0% target; also too short to show a steady state: ...". A probe stopped early
    failed as over-saturated whatever its attainment, and its requests cut off by the stop
    are said to be that (``not_finished`` in its summary), not failures of the engine, and
    its latencies to be of the requests that finished only: a lower bound."""
    att = "–" if outcome.attainment is None else attainment_text(outcome.attainment)
    if outcome.num_warm_up:
        first = ("the first request, sent at the start" if outcome.num_warm_up == 1 else
                 f"their first {outcome.num_warm_up} requests, sent together at the start")
        att += f" once its users were under way ({first}, not counted)"
    failed, sent = outcome.num_failed or 0, outcome.num_requests or 0
    cut = _num_cut_off(outcome, search_dir) if outcome.stopped else 0
    if failed and sent:  # refused, errors, or cut off by the early stop: say which
        parts = ([f"{cut} of {sent} requests not finished when the probe was stopped early"]
                 if cut else []) + ([f"{failed - cut} of {sent} requests failed"]
                                    if failed > cut else [])
        att += f" ({'; '.join(parts)})"
    how = ((" (run to its end)" if outcome.full else "")
           + (" (resumed)" if outcome.resumed else ""))
    if outcome.passed:
        return f"SLO attainment {att}, passed{how}"
    if outcome.stopped:
        lower = cut_off_text(outcome, cut)
        why = f"; stopped early: {outcome.stopped}" + (
            f"; its latencies are {lower}" if lower else "")
    elif outcome.attainment is not None and outcome.attainment < target:
        why = f": below the {target:.1%} target" + (f"; also {outcome.behind}"
                                                     if outcome.behind else "")
    else:
        why = f"; {outcome.behind}" if outcome.behind else ""
    return f"SLO attainment {att}, failed{how}{why}"


def _num_cut_off(outcome: ProbeOutcome, search_dir: Path) -> int:
    """How many of a stopped probe's failed requests the stop cut off (its summary's
    ``not_finished`` failures); 0 when its folder does not say."""
    if outcome.run_dir is None:
        return 0
    cut = num_cut_off(read_json_object(search_dir / outcome.run_dir / SUMMARY_FILE))
    return min(cut, outcome.num_failed or 0)


def _earlier_probes(search_dir: Path) -> list[Path]:
    """The probe folders (``rate-*``, ``conc-*``, with their ``cell.json``; confirming runs
    ``*-full`` too) an earlier search left in ``search_dir``."""
    if not search_dir.is_dir():
        return []
    return [sub for sub in sorted(search_dir.iterdir())
            if sub.is_dir() and sub.name.startswith(("rate-", "conc-"))
            and (sub / CELL_FILE).exists()]


def _clear_earlier_probes(out_dir: Path, name: str, log: Log | None, *,
                          plan: ProbePlan) -> None:
    """A search started over (no --resume) removes the probe folders an earlier search left
    in ``out_dir``: kept, they would sit beside the new ones as if this search had run them.
    Only folders of batchlab's files that no other process writes (``remove_run_dir``:
    RunDirError naming the folder otherwise). ``plan``: this search's; the log says --resume
    would have reused them only when the earlier search was this one, with the same digest
    (``known_probes``)."""
    earlier = _earlier_probes(out_dir)
    same = read_json_object(out_dir / SEARCH_FILE).get("digest") == plan.digest
    # every one first: a refusal leaves them all as they were
    check_each(earlier, lambda sub: check_removable(sub, "probe folder"))
    for sub in earlier:
        remove_run_dir(sub, "probe folder")
    if earlier and log is not None:
        log(f"{name}: started over: removed {len(earlier)} probe folder(s) of an earlier search "
            + ("(--resume reuses them)" if same else
               "(made with other settings or another batchlab: --resume would not reuse them)"))


def _deciding_failure(result: SearchResult) -> ProbeOutcome | None:
    """The run that decided the bracket's failing load: its confirming run, else its probe."""
    at = [p for p in result.probes if p.load == result.failing]
    return next((p for p in at if p.full), at[-1] if at else None)


def _trace_bound(result: SearchResult, target: float) -> SearchResult:
    """A search whose lowest failing load met the SLO and failed only because the trace was
    too short to show a steady state there found what the trace can show, not the engine's
    capacity: status ``trace_too_short``. A lower bound when a load passed below it; not
    known when that load was the lowest (a ``below_min`` the trace, not the engine, set)."""
    if result.status not in ("found", "below_min") or result.failing is None:
        return result
    failing = _deciding_failure(result)
    if (failing is not None and failing.attainment is not None and failing.attainment >= target
            and not failing.stopped and (failing.behind or "").startswith("too short")):
        return replace(result, status="trace_too_short")
    return result


def result_answer(result: SearchResult, plan: ProbePlan, kind: LoadKind,
                  search_dir: Path) -> str | None:
    """The answer in words where a capacity and its bound would mislead (``answer`` in
    search.json and capacity.json; the report and the console say it): every load tried
    failed, down to the lowest, on SLO attainment (no load meets the SLO: "< 0.01 req/s"
    would suggest a lower one does), or only as too short a trace there (not known). None
    otherwise."""
    if result.capacity is not None or result.failing is None:
        return None
    failing = _deciding_failure(result)
    if failing is None or failing.attainment is None:
        return None
    lowest = ("by a single user" if kind == "concurrency" and failing.load == 1
              else f"at the lowest load tried, {load_text(kind, failing.load)}")
    if result.status == "trace_too_short":
        return (f"not known: the engine met the SLO {lowest} (SLO attainment "
                f"{attainment_text(failing.attainment)}), but the trace was too short to show "
                "a steady state; a trace with more requests may show the capacity")
    if (result.status != "below_min" or failing.stopped
            or failing.attainment >= plan.target):
        return None  # failed as over-saturated, or by falling behind: "<" is the answer
    from harness.report.format import fmt_seconds

    summary = (read_json_object(search_dir / failing.run_dir / SUMMARY_FILE)
               if failing.run_dir else {})
    names = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}
    medians = []
    for key, limit in plan.slo.as_dict().items():
        p50 = (summary.get(key) or {}).get("p50") if isinstance(summary, dict) else None
        if isinstance(p50, int | float):
            medians.append(f"{names.get(key, key)} p50 {fmt_seconds(p50)} against "
                           f"{fmt_seconds(limit)}")
    return (f"the SLO is not met even {lowest}: SLO attainment "
            f"{attainment_text(failing.attainment)}, under the "
            f"{attainment_text(plan.target)} target"
            + (f" ({'; '.join(medians)})" if medians else ""))


def _search_record(setting: Setting, spec: SearchSpec, status: str,
                   probes: Sequence[ProbeOutcome], result: SearchResult | None,
                   error: str | None, load_cap: LoadCap | None, search_dir: Path
                   ) -> dict[str, Any]:
    """``search.json``; ``search_dir``: where the probes' folders are, for how many
    requests each one stopped early cut off (``cut_off_fields``)."""
    plan = setting.plan
    cell = dict(plan.cell)
    return {
        "setting": setting.name,
        "engine": cell.get("engine"),
        "knobs": cell.get("knobs"),
        "grid": cell.get("grid") or {},
        "kind": spec.kind,
        "unit": LOAD_UNITS[spec.kind],
        "slo": plan.slo.as_dict(),
        "target_attainment": plan.target,
        "spec": spec.as_dict(),
        "precision": spec.precision,
        "precision_text": spec.precision_text(),
        "digest": plan.digest,
        "made_from": jsonable(dict(plan.made_from)),
        "status": status,
        "error": error,
        "capacity": result.capacity if result is not None else None,
        # the answer in words, where the capacity and its bound would mislead
        "answer": (result_answer(result, plan, spec.kind, search_dir)
                   if result is not None else None),
        "bracket": ({"passing": result.passing, "failing": result.failing}
                    if result is not None else _bracket_so_far(probes)),
        "probes": [{**p.as_dict(), **cut_off_fields(
                        p, _num_cut_off(p, search_dir) if p.stopped else 0),
                    "label": probe_label(spec.kind, p.load, full=p.full)} for p in probes],
        "command": redact_argv(plan.command) if plan.command else None,
        # why the highest load is below --max-load (the report quotes it), and that load
        **({"load_cap": load_cap.why, "load_cap_max": load_cap.max_load}
           if load_cap is not None else {}),
    }


def check_resumable(settings: Sequence[Setting], out_dir: Path, *,
                    name: str | None = None) -> None:
    """Raises ValueError (``known_probes``, ``check_same_server``) when a search in
    ``out_dir`` was made with other settings, or against an attached server that reports
    another configuration now: checked before anything is written, so a refused --resume
    changes nothing. ``name``: this search's, to say when starting over takes --overwrite
    (another search: ``other_search``)."""
    other = name is not None and other_search(settings, out_dir, name=name) is not None
    instead = "drop --resume and pass --overwrite to start over" if other else \
        "drop --resume to start over"
    for setting in settings:
        known_probes(out_dir / setting.name, setting.plan.digest,
                     made_from=setting.plan.made_from, instead=instead)
        check_same_server(setting, out_dir / setting.name)


def check_same_server(setting: Setting, search_dir: Path) -> None:
    """Raises ValueError naming what changed when a probe a resumed search would reuse was
    measured against the attached server of ``setting`` while it reported another
    configuration (knobs, model, engine version: ``harness.scenario.attached``) than it reports
    now: restarted with other settings, the same URL answers another question. Nothing is
    checked when the server does not answer now (the probes still to run fail then) or the
    probe recorded no answer."""
    spec = setting.plan.spec
    if not is_attached(spec):
        return
    reused = [sub for sub in _earlier_probes(search_dir)
              if read_probe(sub, setting.plan.digest) is not None]
    if not reused:
        return
    now = identity_now(spec)
    for sub in reused:
        changes = changed_since(sub, now)
        if changes:
            raise ValueError(
                f"{search_dir}: probe {sub.name} was measured against the server at {spec.url}, "
                f"which reports another configuration now (changed: {'; '.join(changes)}); "
                "its probes answer another question: drop --resume to start over, or choose "
                "another --out")


def _bracket_so_far(probes: Sequence[ProbeOutcome]) -> dict[str, float | None]:
    """An unfinished search's bracket: the highest load that passed (the capacity is at least
    that) and the lowest above it that failed."""
    passing = max((p.load for p in probes if p.passed), default=None)
    failing = min((p.load for p in probes if not p.passed
                   and (passing is None or p.load > passing)), default=None)
    return {"passing": passing, "failing": failing}


def recorded_result(setting: Setting, out_dir: Path) -> SettingResult | None:
    """What an earlier search of ``setting`` left in ``out_dir/<setting>``: its result, or
    how far it got; None when there is none, or it was made with other settings (digest)."""
    search_dir = out_dir / setting.name
    record = read_json_object(search_dir / SEARCH_FILE)
    if not record or record.get("digest") != setting.plan.digest:
        return None
    by_load = {False: known_probes(search_dir, setting.plan.digest),
               True: known_probes(search_dir, setting.plan.digest, full=True)}
    order = [(p.get("load"), bool(p.get("full"))) for p in record.get("probes") or []
             if isinstance(p, dict)]
    probes = tuple(by_load[full][load] for load, full in order if load in by_load[full])
    status = record.get("status")
    if status in get_args(Status):
        bracket = record.get("bracket") or {}
        cap_max = record.get("load_cap_max", (record.get("spec") or {}).get("max_load"))
        load_cap = (LoadCap(float(cap_max), str(record["load_cap"]))
                    if record.get("load_cap") and isinstance(cap_max, int | float) else None)
        return SettingResult(setting, SearchResult(
            status=cast(Status, status), capacity=record.get("capacity"),
            passing=bracket.get("passing"), failing=bracket.get("failing"), probes=probes,
            load_cap=load_cap), earlier=True)
    if status == "failed":
        return SettingResult(setting, None, str(record.get("error") or "the search failed"),
                             earlier=True)
    return SettingResult(setting, None, "interrupted", interrupted=probes, earlier=True)


def check_out_folders(settings: Sequence[Setting], out_dir: Path) -> None:
    """RunDirError unless the search may write ``out_dir``: none there, a folder of no run,
    or an earlier capacity search's, not inside a run's folder; each setting's folder in it
    none there or an earlier search of that setting; each probe folder in one a probe's
    (``runfolder.refuse_results_folder``, naming what each is instead: another run's folder
    written into, a scenario sweep's). Looks only, before anything is written or deleted."""
    refuse_results_folder(out_dir, allow=("capacity",))
    folders = [out_dir / setting.name for setting in settings]
    instead = "move it, or choose another --out"
    check_each(folders, lambda folder: refuse_results_folder(
        folder, "setting folder", allow=("search",), instead=instead))
    probes = [sub for folder in folders if folder.is_dir() for sub in sorted(folder.iterdir())
              if sub.is_dir() and sub.name.startswith(("rate-", "conc-"))]
    check_each(probes, lambda folder: refuse_results_folder(
        folder, "probe folder", allow=("cell",), instead=instead))


# What a search's ``made_from`` records that batchlab chose, not the user: its version and its
# rules for judging a probe. The same command under another batchlab is the same search
# (started over: its digest, and so its probes, differ).
_CHOSEN_BY_BATCHLAB = frozenset({"batchlab", "pace_sigmas", "pace_tolerance", "steady_e2es",
                                 "pace_rule"})


def other_search(settings: Sequence[Setting], out_dir: Path, *, name: str) -> str | None:
    """What of another capacity search ``out_dir`` holds, in words ("reference-capacity of
    setting reference, changed: SLO: ..."); None when it holds none, or this one (``name``,
    of ``settings``): the same scenario's, however edited since (a setting whose definition
    changed is searched again), or, without a scenario, the same setting (engine, knobs,
    trace and the bytes of the files it reads, SLO, target; the batchlab version aside)."""
    recorded = read_json_object(out_dir / SCENARIO_FILE).get("name")
    if isinstance(recorded, str) and recorded != name:
        return f"{recorded} of {_settings_text(out_dir)}; this is {name}"
    for setting in settings:
        record = read_json_object(out_dir / setting.name / SEARCH_FILE)
        if setting.scenario is not None or not record or _same_setting(record, setting.plan):
            continue
        changed = _what_changed(record.get("made_from"), setting.plan.made_from)
        return f"{recorded or name} of setting {setting.name}, {changed}"
    return None


def _same_setting(record: Mapping[str, Any], plan: ProbePlan) -> bool:
    """Whether ``search.json`` (``record``) is a search of the setting ``plan`` searches, by
    what the user chose (``_CHOSEN_BY_BATCHLAB`` aside); by its digest when it records no
    ``made_from`` (an older batchlab)."""
    before = record.get("made_from")
    if not isinstance(before, Mapping):
        return bool(record.get("digest") == plan.digest)

    def chosen(made_from: Mapping[str, Any]) -> str:
        kept = {k: v for k, v in made_from.items() if k not in _CHOSEN_BY_BATCHLAB}
        return json.dumps(redact_tree(jsonable(_without_shipped_coefficients(kept))),
                          sort_keys=True, default=str)

    return chosen(before) == chosen(plan.made_from)


def _without_shipped_coefficients(made_from: Mapping[str, Any]) -> dict[str, Any]:
    """``made_from`` without the coefficients batchlab ships: a shipped profile's file, and
    the resolved coefficients' name and digest (a shipped profile's, the catalog's, or a
    file's, which the file's own digest in ``files`` stands for): a profile refitted by a
    newer batchlab leaves the user's search the same search; a profile file of the user's
    own still tells two searches apart by its bytes."""
    out = dict(made_from)
    files = out.get("files")
    if isinstance(files, Mapping):
        shipped = str(PROFILES_DIR.resolve()) + os.sep
        out["files"] = {path: digest for path, digest in files.items()
                        if not str(path).startswith(shipped)}
    engine = out.get("engine")
    if isinstance(engine, Mapping):
        out["engine"] = {k: v for k, v in engine.items()
                         if k not in ("cost_model", "cost_model_digest")}
    return out


def _settings_text(out_dir: Path) -> str:
    """The settings a search in ``out_dir`` searched, as a refusal names them: "setting
    reference", "settings a, b"."""
    rows = read_json_object(out_dir / CAPACITY_FILE).get("settings")
    names = ([str(r["setting"]) for r in rows if isinstance(r, dict) and "setting" in r]
             if isinstance(rows, list) else [f.name for f in _search_dirs(out_dir)])
    if not names:
        return "no setting yet"
    return f"setting{'s' if len(names) > 1 else ''} {', '.join(names)}"


def _search_dirs(out_dir: Path) -> list[Path]:
    """The setting folders (each with its ``search.json``) in ``out_dir``."""
    if not out_dir.is_dir():
        return []
    return [sub for sub in sorted(out_dir.iterdir())
            if sub.is_dir() and not sub.is_symlink() and (sub / SEARCH_FILE).is_file()]


def check_same_search(settings: Sequence[Setting], out_dir: Path, *, name: str,
                      overwrite: bool, resume: bool = False) -> list[Path]:
    """The setting folders of another search in ``out_dir`` (``other_search``) that this one
    replaces: none when it holds none; with ``overwrite``, each of its setting folders this
    search does not write (those it does, it starts over), every one checked removable
    (``check_search_removable``); RunDirError naming the other search otherwise. Looks
    only."""
    said = other_search(settings, out_dir, name=name)
    if said is None:
        return []
    if not overwrite:
        how = "drop --resume and pass --overwrite" if resume else "pass --overwrite"
        raise RunDirError(f"--out {out_dir}: holds another capacity search ({said}); {how} to "
                          "replace it, or choose another --out")
    searched = {setting.name for setting in settings}
    folders = [sub for sub in _search_dirs(out_dir) if sub.name not in searched]
    check_each(folders, check_search_removable)
    return folders


def _search_names(folder: Path) -> tuple[list[Path], list[Path], list[str]]:
    """A setting folder's probe folders (each with its ``cell.json``), its empty folders (a
    probe's, interrupted before its ``cell.json``: they hold nothing), and what else in it is
    not batchlab's: anything but those, ``search.json`` and the lock."""
    probes, empty, foreign = [], [], []
    for sub in sorted(folder.iterdir()):
        if sub.is_dir() and not sub.is_symlink() and (sub / CELL_FILE).is_file():
            probes.append(sub)
        elif sub.is_dir() and not sub.is_symlink() and not any(sub.iterdir()):
            empty.append(sub)
        elif sub.is_symlink() or sub.is_dir():
            foreign.append(sub.name + ("/" if sub.is_dir() else ""))
        elif sub.name not in (SEARCH_FILE, SEARCH_FILE + ".tmp", LOCK_FILE):
            foreign.append(sub.name)
    return probes, empty, foreign


def check_search_removable(folder: Path, what: str = "setting folder") -> None:
    """RunDirError unless ``remove_search_dir`` may remove ``folder`` now: it holds nothing
    batchlab did not write, and no other process writes a probe in it."""
    probes, _, foreign = _search_names(folder)
    writer = writer_of(folder)
    if writer is not None:
        raise RunDirError(f"{what} {folder}: is being written by {writer}; wait for it or "
                          "choose another --out")
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise RunDirError(f"{what} {folder}: holds files batchlab did not write ({shown}); "
                          "move them, or choose another --out")
    check_each(probes, lambda sub: check_removable(sub, "probe folder"))


def remove_search_dir(folder: Path, what: str = "setting folder") -> None:
    """Delete a setting folder of a search replaced (``--overwrite``): its probe folders
    (``remove_run_dir``), its ``search.json``, then the folder; RunDirError, and nothing
    more deleted, when something batchlab did not write is found there."""
    check_search_removable(folder, what)
    probes, empty, _ = _search_names(folder)
    for sub in probes:
        remove_run_dir(sub, "probe folder")
    for sub in empty:
        with contextlib.suppress(OSError):  # written into meanwhile: rmdir below says so
            sub.rmdir()
    for name in (SEARCH_FILE, SEARCH_FILE + ".tmp", LOCK_FILE):  # a lock nobody holds
        (folder / name).unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError as exc:  # written into meanwhile: what is there now stays
        raise RunDirError(f"{what} {folder}: could not be removed ({exc.strerror or exc}); "
                          "choose another --out") from None


def run_capacity(settings: Sequence[Setting], spec: SearchSpec, out_dir: Path, *,
                 name: str, resume: bool = False, baseline: str | None = None,
                 command: Sequence[str] | None = None, log: Log | None = None,
                 write_report: bool = True, every: Sequence[Setting] = (),
                 overwrite: bool | None = None) -> list[SettingResult]:
    """Search every setting (each into ``out_dir/<setting>``), then write ``capacity.json``,
    the sweep metadata and the report. A setting whose probe cannot run (an engine that does
    not start) is recorded as failed and the others go on.

    ``every``: all the scenario's settings, when ``--only`` chose ``settings`` among them; what
    an earlier search of one not chosen left in ``out_dir`` (with the same digest) stays
    listed and reported, in the scenario's order, as ``batchlab run --only`` keeps the cells
    it did not run.

    ``overwrite``: another search in ``out_dir`` (``check_same_search``) is refused (False) or
    replaced, its setting folders removed (True); None searches over whatever is there, for
    a caller that has judged the folder itself."""
    spec.validate()
    # one search writes ``out_dir`` at a time (harness.runfolder.holding_dir): one there is
    # held before anything in it is read, a new one as soon as it is made
    with contextlib.ExitStack() as holding:
        check_out_folders(settings, out_dir)  # before anything in it is locked or read
        if out_dir.is_dir():
            holding.enter_context(holding_dir(out_dir))
        if resume:
            check_resumable(settings, out_dir, name=name)
        else:  # probe folders it will remove hold nothing but batchlab's: refused now
            check_each((sub for setting in settings
                        for sub in _earlier_probes(out_dir / setting.name)),
                       lambda sub: check_removable(sub, "probe folder"))
        replaced = ([] if overwrite is None else check_same_search(
            settings, out_dir, name=name, overwrite=overwrite, resume=resume))
        holding.enter_context(holding_dir(out_dir))
        for folder in replaced:  # another search's, replaced (--overwrite): checked above
            remove_search_dir(folder)
        # the last search's report no longer describes the folder (its SLO, answers and
        # probes): gone until this one's is written, as a scenario sweep does
        for left in (REPORT_FILE, *REPORT_PLOTS):  # and its figures
            (out_dir / left).unlink(missing_ok=True)
        return _search_settings(settings, spec, out_dir, name=name, resume=resume,
                                baseline=baseline, command=command, log=log,
                                write_report=write_report, every=every)


def _search_settings(settings: Sequence[Setting], spec: SearchSpec, out_dir: Path, *,
                     name: str, resume: bool, baseline: str | None,
                     command: Sequence[str] | None, log: Log | None, write_report: bool,
                     every: Sequence[Setting]) -> list[SettingResult]:
    """``run_capacity``'s searches and summary, its folder held and checked."""
    chosen = {s.name for s in settings}
    others = [s for s in every if s.name not in chosen]
    kept = [r for r in (recorded_result(s, out_dir) for s in others) if r is not None]
    kept_names = {r.setting.name for r in kept}
    # an earlier search of a setting whose definition has changed since answers another
    # question: not listed as this one's, and said so rather than dropped without a word
    # each says what changed (the SLO or target of this search, or the setting itself)
    left_out = {s.name: "its search in this folder was made with other settings ("
                + _what_changed(read_json_object(out_dir / s.name / SEARCH_FILE)
                                .get("made_from"), s.plan.made_from)
                + "; run it with --only, or without, to search it again)"
                for s in others if s.name not in kept_names
                and (out_dir / s.name / SEARCH_FILE).exists()}
    # a setting folder of an earlier search of this one that is no setting of it now (a
    # grid shrunk, an engine renamed): kept in the folder, and said to be no answer of it
    named = {s.name for s in every}
    left_out.update({sub.name: "not a setting of this search now (an earlier search's, kept "
                     "in the folder: remove it, or search it again where it is a setting)"
                     for sub in _search_dirs(out_dir) if sub.name not in named})
    if left_out and log is not None:
        for setting_name, why in left_out.items():
            log(f"not listed: {setting_name}: {why}")
    order: dict[str, int] = {}
    for s in (*every, *settings):
        order.setdefault(s.name, len(order))
    if kept and log is not None:
        log(f"kept from an earlier search (not selected by --only): "
            f"{', '.join(r.setting.name for r in kept)}")
    results: list[SettingResult] = list(kept)

    def so_far(current: Setting | None = None, done: tuple[ProbeOutcome, ...] = ()) -> None:
        """capacity.json and scenario.json as the search stands: a search killed outright
        leaves them saying so, never an earlier search's answer as this one's."""
        searched = {r.setting.name for r in results}
        pending = [SettingResult(s, None, "running", interrupted=done if s is current else (),
                                 running=True) for s in settings if s.name not in searched]
        _write_summary(sorted([*results, *pending], key=lambda r: order[r.setting.name]), spec,
                       out_dir, name=name, baseline=baseline, command=command,
                       left_out=left_out, status="running")

    so_far()
    for setting in settings:
        try:
            result = run_search(setting, spec, out_dir / setting.name, resume=resume, log=log,
                                on_probe=functools.partial(so_far, setting))
            results.append(SettingResult(setting, result))
        except KeyboardInterrupt as exc:  # what was measured stays listed, and reportable
            done = exc.probes if isinstance(exc, SearchInterrupted) else ()
            results.append(SettingResult(setting, None, "interrupted", interrupted=done))
            # those not started yet stay listed, as while the search ran: not searched
            searched = {r.setting.name for r in results}
            results += [SettingResult(s, None, NOT_STARTED, interrupted=())
                        for s in settings if s.name not in searched]
            results.sort(key=lambda r: order[r.setting.name])
            _write_summary(results, spec, out_dir, name=name, baseline=baseline,
                           command=command, left_out=left_out, status="interrupted")
            raise
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if log is not None:
                log(f"{setting.name}: search failed: {failure_reason(reason)}")
            results.append(SettingResult(setting, None, reason))
    results.sort(key=lambda r: order[r.setting.name])
    _write_summary(results, spec, out_dir, name=name, baseline=baseline, command=command,
                   left_out=left_out)
    if write_report:
        from harness.report import render_scenario_report

        render_scenario_report(out_dir)
    return results


def _what_answers(r: SettingResult, prediction: Mapping[str, Any] | None,
                  out_dir: Path) -> dict[str, Any]:
    """Whose capacity a row gives: the engine, simulated or live, and whether its capacity is
    a prediction: simulated, or what its probes recorded says so (``prediction``: the
    reference engine served over HTTP, launched or attached, whatever ``--engine`` named).
    The GPU is the one that took effect, as the probes' manifests record it (a default when
    --gpu was not given), else the one asked for."""
    spec = r.setting.plan.spec
    return {"engine": spec.engine, "mode": "simulated" if spec.simulated else "live",
            "predicted": spec.simulated or prediction is not None,
            "model": spec.model, "gpu": _probed_gpu(r, out_dir) or spec.gpu,
            "profile": spec.profile}


def _probed_gpu(r: SettingResult, out_dir: Path) -> str | None:
    """The GPU the first probe folder that records one ran on (its engine's config)."""
    for probe in setting_probes(r):
        if probe.run_dir is None:
            continue
        engine = read_manifest(out_dir / r.setting.name / probe.run_dir).get("engine")
        config = engine.get("config") if isinstance(engine, Mapping) else None
        gpu = config.get("gpu") if isinstance(config, Mapping) else None
        if isinstance(gpu, str) and gpu:
            return gpu
    return None


def setting_probes(r: SettingResult) -> tuple[ProbeOutcome, ...]:
    """The probes a row lists: its search's, or those done before it stopped."""
    if r.result is not None:
        return r.result.probes
    return r.interrupted or ()


def _failed_probe(r: SettingResult, out_dir: Path) -> str | None:
    """The folder of the probe a failed search failed in (``FAILED_PROBE`` of its
    search.json), when it is there; None for any other search."""
    if r.result is not None or r.interrupted is not None or r.earlier:
        return None
    label = read_json_object(out_dir / r.setting.name / SEARCH_FILE).get(FAILED_PROBE)
    if not isinstance(label, str) or not (out_dir / r.setting.name / label).is_dir():
        return None
    return label


def setting_prediction(r: SettingResult, out_dir: Path) -> dict[str, Any] | None:
    """What predicted a setting's capacity, as its probes recorded it (the first probe folder
    that did: ``harness.prediction.summary_prediction`` of its manifest, as a replay's summary
    says it), with why a capacity has no measured error: the simulated reference, or a live
    server that answered as the reference engine served over HTTP. None when no probe folder
    says so (a real engine, or no probe yet)."""
    setting_dir = out_dir / r.setting.name
    for probe in setting_probes(r):
        if probe.run_dir is None:
            continue
        found = summary_prediction(read_manifest(setting_dir / probe.run_dir).get("engine"))
        if found is not None:
            return {**found, "capacity_caveat": CAPACITY_CAVEAT}
    return None


def _precision_text(r: SettingResult, spec: SearchSpec, out_dir: Path) -> str | None:
    """The precision a row's search was made to: this search's, or, for a search kept from
    an earlier run, the one its search.json records."""
    if not r.earlier:
        return spec.precision_text()
    text = read_json_object(out_dir / r.setting.name / SEARCH_FILE).get("precision_text")
    return str(text) if text else None


def _write_summary(results: Sequence[SettingResult], spec: SearchSpec, out_dir: Path, *,
                   name: str, baseline: str | None, command: Sequence[str] | None,
                   left_out: Mapping[str, str] | None = None,
                   status: str = "finished") -> None:
    """``capacity.json`` and ``scenario.json``; ``status``: running (rewritten after every
    probe), interrupted or finished."""
    rows = []
    cells: list[str] = []
    failed_cells: list[str] = []  # never the baseline unless asked for: it has no figures
    for r in results:
        prediction = setting_prediction(r, out_dir)
        row: dict[str, Any] = {"setting": r.setting.name, "search": f"{r.setting.name}/"
                               f"{SEARCH_FILE}", "error": r.error,
                               **_what_answers(r, prediction, out_dir),
                               "precision_text": _precision_text(r, spec, out_dir)}
        if r.result is not None:
            row.update(status=r.result.status, capacity=r.result.capacity,
                       answer=result_answer(r.result, r.setting.plan, spec.kind,
                                            out_dir / r.setting.name),
                       bracket={"passing": r.result.passing, "failing": r.result.failing},
                       num_probes=len(r.result.probes))
            if r.result.load_cap is not None:  # the highest load tried, and why not --max-load
                row["load_cap"] = r.result.load_cap.as_dict()
        elif r.interrupted is not None:
            row.update(status="running" if r.running else "interrupted",
                       num_probes=len(r.interrupted), bracket=_bracket_so_far(r.interrupted))
        else:
            row["status"] = "failed"
        probes = setting_probes(r)
        # one cell per load: the run that decided it (a confirming run over the probe it
        # confirmed), so that a load's curve has one point
        deciding = {p.load: p for p in probes if not p.full}
        deciding.update({p.load: p for p in probes if p.full})
        if row["predicted"]:
            row["prediction"] = prediction
        cells += [f"{r.setting.name}/{probe_label(spec.kind, load, full=deciding[load].full)}"
                  for load in sorted(deciding)]
        failed_in = _failed_probe(r, out_dir)
        if failed_in is not None:  # a failed search is in the report, with why, as its probe
            failed_cells.append(f"{r.setting.name}/{failed_in}")
            cells.append(failed_cells[-1])
        rows.append(row)
    slo = results[0].setting.plan.slo.as_dict() if results else None
    target = results[0].setting.plan.target if results else spec.target
    write_json_atomic({"status": status, "kind": spec.kind, "unit": LOAD_UNITS[spec.kind],
                       "slo": slo,
                       "target_attainment": target, "spec": spec.as_dict(), "settings": rows,
                       # settings of the scenario whose earlier search here is not listed
                       "left_out": [{"setting": k, "why": v}
                                    for k, v in (left_out or {}).items()]},
                      out_dir / CAPACITY_FILE)
    measured = [c for c in cells if c not in failed_cells]
    base = next((c for c in cells if baseline and c.startswith(baseline + "/")),
                measured[0] if measured else None)
    what = "request rate" if spec.kind == "rate" else "number of concurrent users"
    write_json_atomic({
        "name": name,
        "question": f"What is the highest {what} each engine and knob setting serves with at "
                    f"least {target * 100:.6g}% of requests within the SLO?",
        "slo": slo, "baseline": base, "cells": cells,
        "command": redact_argv(command) if command else None,
        "capacity": CAPACITY_FILE,
    }, out_dir / SCENARIO_FILE)


