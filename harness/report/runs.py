"""Run folders read back into ``CellResult`` records, their parquet columns and engine state."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from harness.columns import numbers
from harness.manifest import MANIFEST_FILE
from harness.metrics import Pace
from harness.report.format import load_text, value_text
from harness.report.plots import EngineState, envelope, tokens_binned
from harness.results import (
    RECORDS_FILE,
    REQUESTS_FILE,
    STEPS_FILE,
    SUMMARY_FILE,
    read_json_object,
    read_summary,
    run_pace,
)
from harness.runfolder import writer_of
from harness.traces import CLASSES_NOT_DRAWN

TELEMETRY_FILE = "telemetry.parquet"
CELL_FILE = "cell.json"
STATUS_FILE = "status.json"
SCENARIO_FILE = "scenario.json"

ENGINE_STATE_COLUMNS = 1000  # time slices of the engine-state plot (about its width in pixels)


@dataclass(frozen=True)
class CellResult:
    """One column of the comparison: a run folder and what is known about it."""

    name: str
    run_dir: Path
    state: str  # "done", "failed", "interrupted", "running" (or killed), "not_run"
    reason: str = ""
    summary: Mapping[str, Any] | None = None
    manifest: Mapping[str, Any] = field(default_factory=dict)
    cell: Mapping[str, Any] = field(default_factory=dict)  # cell.json of a scenario sweep
    # a scenario cell whose results were made from an earlier definition of it (knobs, trace,
    # files) than the scenario's last sweep recorded: left as it was by --only or --resume
    stale: bool = False
    # fields of its manifest.json and cell.json of another type than the report reads there,
    # read as absent (an edit, another tool's file): ``check_fields``
    unread: tuple[WrongType, ...] = ()

    @property
    def ok(self) -> bool:
        return self.state == "done" and self.summary is not None

    def unread_in(self, *fields: str) -> bool:
        """Whether anything of these top-level fields of its manifest.json or cell.json was
        read as absent, being of the wrong type (``unread``)."""
        return any(w.keys[0] in fields for w in self.unread)

    @property
    def served_nothing(self) -> bool:
        """It sent requests, had none back, and its manifest says it failed: a failure, not
        a run cut short (``harness.manifest.record_failed``)."""
        return ((get(self.summary, "num_requests") or 0) > 0
                and not get(self.summary, "num_completed")
                and self.manifest.get("status") == "failed")

    @property
    def ended_early(self) -> str | None:
        """How a run with results did not run to its end, from its manifest (an engine that
        exited, Ctrl-C, a run killed outright and summarized afterwards); None when it did."""
        record = self.manifest
        if not record.get("status") and self.summary is not None:
            record = self.summary  # no manifest (deleted): the summary says how it ended
        status = record.get("status")
        if not self.ok or status not in ("failed", "interrupted", "running"):
            return None
        if status == "running":
            said = "killed while it ran (its manifest still says running)"
            if self.in_flight_lost:
                said += "; the requests in flight then are not among its figures"
            else:
                in_flight = get(self.summary, "failures.not_finished") or 0
                said += (f", with {in_flight} request{'' if in_flight == 1 else 's'} in flight "
                         "(rows as not_finished)")
        else:
            said = str(record.get("error") or record.get("stopped_early")
                       or ("interrupted (Ctrl-C or SIGTERM)" if status == "interrupted"
                           else status))
        if self.reason == RESUME_HINT:  # a sweep's cell: --resume runs it again
            said += f" ({RESUME_HINT})"
        not_sent = record.get("num_not_sent")
        if isinstance(not_sent, int) and not_sent and "never sent" not in said:
            said += (f"; {not_sent} request of the trace was never sent" if not_sent == 1
                     else f"; {not_sent} requests of the trace were never sent")
        return said

    @property
    def stopped_early(self) -> str | None:
        """Why an early-stop check stopped the run (a capacity probe that found its engine
        over-saturated: the summary's ``stopped_early``); None when none did."""
        stopped = get(self.summary, "stopped_early")
        return str(stopped) if stopped else None

    @property
    def partial(self) -> bool:
        """Its figures are of part of its trace: it ended early (``ended_early``) or was
        stopped early (``stopped_early``). The report compares them with nothing, and
        nothing with them."""
        return bool(self.ended_early or self.stopped_early)

    @property
    def in_flight_lost(self) -> bool:
        """Killed outright, summarized from a record of an older batchlab that wrote no
        request down until it ended: the requests in flight then are not among its figures
        (a newer one records each send, and they are rows as not_finished)."""
        return (self.manifest.get("status") == "running" and self.summary is not None
                and "num_sent_unrecorded" not in self.summary)

    @cached_property
    def pace(self) -> Pace | None:
        """Whether the engine kept pace with the run's arrivals (``harness.results.run_pace``:
        open-loop runs that ran to their end), read from ``requests.parquet`` once."""
        if self.summary is None or not self.ok:
            return None
        return run_pace(self.run_dir, self.summary, self.manifest)

    @property
    def pace_unread(self) -> str | None:
        """Why the pace check (``pace``) was not made of a run it applies to (an open loop
        that ran to its end, as ``run_pace`` decides): its requests.parquet is there but
        cannot be read (a truncated file), pyarrow's words; None when it was made, does not
        apply, or the file is missing."""
        path = self.run_dir / REQUESTS_FILE
        if (not self.ok or self.ended_early or get(self.summary, "stopped_early")
                or self.run_load_point.get("kind") == "concurrency"  # a closed loop
                or not path.exists() or self.pace is not None):
            return None
        try:
            pq.ParquetFile(path).close()
        except (OSError, ValueError) as exc:  # (pyarrow's ArrowInvalid is a ValueError)
            return str(exc)
        return None

    @property
    def knobs(self) -> Mapping[str, Any]:
        """The knobs that took effect (``manifest.json``: a profile's engine defaults
        included); a cell that never ran has only those its scenario asked for."""
        return self.manifest.get("knobs") or self.cell.get("knobs") or {}

    @property
    def asked_knobs(self) -> Mapping[str, Any]:
        """The knobs its scenario asked for (``cell.json``), before any profile's or engine's
        defaults; a run of its own (no cell.json): those it ran with."""
        if "knobs" in self.cell:
            return self.cell.get("knobs") or {}
        return self.manifest.get("knobs") or {}

    @property
    def engine(self) -> str:
        engine = self.cell.get("engine")
        if isinstance(engine, Mapping) and engine.get("engine"):
            return str(engine["engine"])
        return _manifest_engine(self.manifest)[0] or "–"

    @property
    def engine_version(self) -> str | None:
        return _manifest_engine(self.manifest)[1]

    @property
    def attached(self) -> bool:
        """Run on a server started outside batchlab: no knob reached it."""
        engine = self.manifest.get("engine")
        return isinstance(engine, Mapping) and engine.get("mode") == "attach"

    @property
    def load_point(self) -> Mapping[str, Any]:
        """The load it ran at, ``{"kind": ..., "value": ...}``: its scenario cell's, else what
        its manifest says (a closed loop's users, a trace rescaled to a rate or time scale);
        ``{}`` for the trace's own timing."""
        return _first_load(self.cell.get("load"), *self._recorded_loads)

    @property
    def run_load_point(self) -> Mapping[str, Any]:
        """The load its manifest records it ran at, as ``load_point`` reads it; its scenario
        cell's only when the manifest records none (a cell that never ran). A scenario's
        trace-level ``time_scale`` rescales the trace of every cell and leaves each cell.json
        at the trace's timing, which is the report's load point of the cell (one trace, one
        load), not the load it ran at: ``batchlab compare`` holds this one fixed."""
        return _first_load(*self._recorded_loads, self.cell.get("load"))

    @property
    def _recorded_loads(self) -> tuple[Any, Any]:
        """What its manifest says of its load: its ``load`` (a closed loop's users, a rescaled
        trace) and its trace's ``timing``."""
        run = self.manifest.get("load")
        if isinstance(run, Mapping) and run.get("mode") == "closed" and "kind" not in run:
            run = {"kind": "concurrency", "value": run.get("concurrency")}  # older folders
        replay = self.manifest.get("replay")
        if run is None and isinstance(replay, Mapping) and replay.get("mode") == "closed":
            # a live closed loop (`replay --mode closed`): its users, as a simulated one's
            run = {"kind": "concurrency", "value": replay.get("concurrency")}
        return run, (self.manifest.get("trace") or {}).get("timing")

    @property
    def load(self) -> str:
        """The load it ran at, as the report writes it ("2 req/s"; "trace timing" if none)."""
        return load_text(self.load_point)

    @property
    def run_load(self) -> str:
        """``run_load_point`` as the report writes a load."""
        return load_text(self.run_load_point)

    @property
    def at_load(self) -> bool:
        """Whether it ran at a load of its own (a rate, a time scale or a number of users),
        not at the trace's timing."""
        return self.load_point.get("kind") not in (None, "trace")

    @property
    def mode(self) -> str:
        engine = self.cell.get("engine")
        if isinstance(engine, Mapping) and engine.get("mode"):
            return str(engine["mode"])
        return str(self.manifest.get("kind") or "–")


def _first_load(*loads: Any) -> Mapping[str, Any]:
    """The first of ``loads`` that is a load point (an object with a ``kind``); ``{}``."""
    for load in loads:
        if isinstance(load, Mapping) and load.get("kind") is not None:
            return load
    return {}


def get(summary: Mapping[str, Any] | None, dotted: str) -> Any:
    """``get(s, "ttft_s.p90")``; None when any part is missing."""
    node: Any = summary
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


# ---------------------------------------------------------------- what is read of the JSON


@dataclass(frozen=True, slots=True)
class JsonType:
    """A type a field of a run folder's JSON file must have to be read as the report reads
    it; ``name`` as an error says it ("a number")."""

    name: str
    test: Callable[[Any], bool]


NUMBER = JsonType("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool))
OBJECT = JsonType("an object", lambda v: isinstance(v, Mapping))
LIST = JsonType("a list", lambda v: isinstance(v, list))
STRING = JsonType("a string", lambda v: isinstance(v, str))
STRINGS = JsonType("a list of strings",
                   lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))
# a load's value: "inf" is a rate of every request at once (JSON has no infinity)
LOAD_VALUE = JsonType('a number or "inf"', lambda v: NUMBER.test(v) or v == "inf")


def _under(name: str, fields: Mapping[str, JsonType]) -> dict[str, JsonType]:
    """The object ``name`` and ``fields`` of it (``*``: any of its keys)."""
    return {name: OBJECT, **{f"{name}.{k}": kind for k, kind in fields.items()}}


def _numbers(*names: str) -> dict[str, JsonType]:
    return dict.fromkeys(names, NUMBER)


_DISTRIBUTION = _numbers("mean", "p50", "p90", "p95", "p99", "max", "count")  # a latency's
_SLO = _numbers("ttft_s", "tpot_s", "e2e_s")  # metrics.Slo.as_dict
_LOAD = {"value": LOAD_VALUE, "think_time_s": NUMBER}  # format.load_text
# The figures of a run, and of each of its priority classes (``by_priority.*``)
_FIGURES: dict[str, JsonType] = {
    **_numbers("num_requests", "num_completed", "num_failed", "num_preemptions", "duration_s"),
    **_under("failures", {"*": NUMBER}),  # requests by error kind
    **_under("throughput", _numbers("requests_per_s", "input_tokens_per_s",
                                    "output_tokens_per_s", "total_tokens_per_s")),
    **_under("ttft_s", _DISTRIBUTION), **_under("tpot_s", _DISTRIBUTION),
    **_under("itl_s", _DISTRIBUTION), **_under("e2e_s", _DISTRIBUTION),
    **_under("send_lag_s", _DISTRIBUTION),
    **_under("slo", _SLO),
    **_under("goodput", _numbers("num_good", "requests_per_s", "slo_attainment")),
    **_under("output_length_fidelity", _numbers("num_reached_target",
                                                "fraction_reached_target", "num_over_target",
                                                "num_over_target_client_counted")),
}
# The fields of summary.json the report and ``batchlab compare`` read, by ``get``'s dotted
# name (``*``: any key of an object), and the type each must have (harness.metrics.summarize
# writes them). null is "not recorded"; a field not listed is not checked. A summary with
# another type in any of them is not read (``load_run``): ``batchlab summarize`` rebuilds it.
SUMMARY_FIELDS: dict[str, JsonType] = {
    **_FIGURES,
    **_numbers("num_not_sent", "num_swap_fallbacks"),
    **_under("prefix_cache", _numbers("queries_tokens", "hits_tokens", "hit_rate",
                                      "preempted_hit_rate", "num_requests_with_prefix_ids")),
    **_under("by_priority", _under("*", _FIGURES)),
}
# A prediction record (adapters.reference.prediction_record), as harness.prediction reads it
_ERRORS = _numbers("median_abs_error", "worst_abs_error", "num_rows", "num_over")
_PREDICTION: dict[str, JsonType] = _under("accuracy", {
    **{f"{of}{k}": kind for of in ("", "held_out_", "held_out_published_")
       for k, kind in _ERRORS.items()},
    **_under("by_kind", _under("*", _ERRORS)),
    **_under("held_out_by_kind", _under("*", _ERRORS)),
})
# The fields of manifest.json (harness/manifest.py) the report and ``compare`` read, as
# ``SUMMARY_FIELDS``; one of another type is read as absent (``CellResult.unread``).
MANIFEST_FIELDS: dict[str, JsonType] = {
    **_under("engine", {
        "config": OBJECT,
        **_under("prediction", _PREDICTION),  # simulated
        # served: the reference engine's /version answer
        **_under("version_probe", _under("body", {"reference": OBJECT,
                                                  **_under("prediction", _PREDICTION)})),
    }),
    **_under("knobs", {"policy": STRING}),
    "knob_sources": OBJECT, "mapping": LIST, "approximations": LIST,
    **_under("trace", {**_under("timing", _LOAD), "notes": LIST, **_under("stats", _numbers(
        "num_requests", "span_s", "prompt_tokens_mean", "output_tokens_mean"))}),
    **_under("load", {**_LOAD, "concurrency": NUMBER}),
    **_under("replay", {"concurrency": NUMBER}),
    **_under("slo", _SLO),
    **_under("roofline", _numbers("context_len", "ridge_flop_per_byte",
                                  "datasheet_ridge_flop_per_byte", "turn_batch_size",
                                  "max_batch", "max_batch_in_kv", "max_num_seqs",
                                  "intensity_at_max_batch")),
    "num_not_sent": NUMBER, "command": STRINGS,
}
# The fields of a sweep's cell.json (harness/scenario) the report and ``compare`` read, as
# ``MANIFEST_FIELDS``.
CELL_FIELDS: dict[str, JsonType] = {
    "engine": OBJECT, **_under("knobs", {"policy": STRING}), "grid": OBJECT,
    **_under("load", _LOAD),
}


@dataclass(frozen=True, slots=True)
class WrongType:
    """A field of a run folder's JSON file whose value is not of the type read there."""

    file: str  # "summary.json", "manifest.json", "cell.json"
    keys: tuple[str, ...]  # the path to it: ("by_priority", "0", "failures")
    expected: str  # a ``JsonType``'s name
    got: str  # "a string", "a list", ...

    @property
    def field(self) -> str:
        """Dotted, as ``get`` spells it: "by_priority.0.failures"."""
        return ".".join(self.keys)

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: expected {self.expected}, got {self.got}"


def check_fields(record: Mapping[str, Any], fields: Mapping[str, JsonType], file: str
                 ) -> list[WrongType]:
    """The fields of ``record`` (the JSON object of ``file``) that ``fields`` lists and whose
    value has another type; null passes (not recorded)."""
    return [WrongType(file, keys, kind.name, _type_name(value, kind))
            for name, kind in fields.items()
            for keys, value in _values(record, name.split("."), ())
            if value is not None and not kind.test(value)]


def _values(node: Any, parts: Sequence[str], keys: tuple[str, ...]
            ) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(path, value) of each field ``parts`` names under ``node`` (``*``: any key); none
    under a value that is not an object."""
    if not parts:
        yield keys, node
        return
    if not isinstance(node, Mapping):
        return
    names = list(node) if parts[0] == "*" else [parts[0]] if parts[0] in node else []
    for name in names:
        yield from _values(node[name], parts[1:], (*keys, str(name)))


def _type_name(value: Any, expected: JsonType | None = None) -> str:
    """"a string", "a list", "true", ...; "a list holding a number" where a list of strings
    was expected."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        other = next((x for x in value if not isinstance(x, str)), None)
        return (f"a list holding {_type_name(other)}" if expected is STRINGS and value
                else "a list")
    return ("a number" if isinstance(value, int | float) else "a string"
            if isinstance(value, str) else "an object" if isinstance(value, Mapping)
            else type(value).__name__)


def without(record: Mapping[str, Any], wrong: Sequence[WrongType]) -> dict[str, Any]:
    """``record`` with the ``wrong`` fields taken out (read as absent): the objects on their
    path are copied, ``record`` is left as it was."""
    out = dict(record)
    for w in wrong:
        *parents, last = w.keys
        node = out
        for key in parents:
            node[key] = node = dict(node[key])
        node.pop(last, None)
    return out


def wrong_text(wrong: Sequence[WrongType], *, file: bool = True) -> str:
    """"manifest.json: engine: expected an object, got a list; knobs: ...", each file named
    once (``file``: named at all)."""
    parts, named = [], None
    for w in wrong:
        text = f"{w.field}: expected {w.expected}, got {w.got}"
        parts.append(text if w.file == named or not file else f"{w.file}: {text}")
        named = w.file
    return "; ".join(parts)


def _manifest_engine(manifest: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(engine name, version) from the manifest's ``engine`` record (harness/manifest.py)."""
    engine = manifest.get("engine")
    if not isinstance(engine, Mapping):
        return None, None
    version = engine.get("version")
    return (str(engine["name"]) if engine.get("name") else None,
            str(version) if version else None)


# ---------------------------------------------------------------- run folders


# What a sweep's cell that did not finish is told, wherever its state is said
RESUME_HINT = "--resume runs it again"
_COMMAND_OF_KIND = {"simulated": "batchlab simulate", "live": "batchlab replay"}


def _running_text(run_dir: Path) -> str:
    """A run whose files say it is running: still running when a process holds its folder's
    lock, or its sweep's or search's (``harness.runfolder.writer_of``), else killed before it
    could say how it ended (SIGKILL, a power cut)."""
    who = writer_of(run_dir) or writer_of(run_dir.parent)
    if who is not None:
        return f"still running ({who} writes it)"
    return "killed before it could say so (no process writes it now)"


def _again_hint(run_dir: Path, manifest: Mapping[str, Any]) -> str:
    """How a run that did not finish is run again: a sweep's cell or a capacity probe (its
    ``status.json`` or ``cell.json``) by its sweep's or search's ``--resume``; a single
    ``simulate`` or ``replay`` run, which has none, by the command its manifest recorded (the
    report's Reproduce section shows it): the same run again replaces its folder
    (``harness.runfolder.claim_run_dir``). Short: a reason is cut to one line of a table."""
    if (run_dir / STATUS_FILE).exists() or (run_dir / CELL_FILE).exists():
        return RESUME_HINT
    kind = manifest.get("kind")
    made_by = _COMMAND_OF_KIND.get(kind) if isinstance(kind, str) else None
    command = f"the `{made_by}` command" if made_by else "the command"
    recorded = f"its {MANIFEST_FILE} records" if manifest.get("command") else "that made it"
    return f"{command} {recorded} runs it again"



def engine_config(c: CellResult) -> Mapping[str, Any]:
    """A reference run's resolved engine settings as the run recorded them: a simulation's
    manifest ``engine.config``, or what a served reference published at ``/version`` (a live
    run's manifest keeps the answer, ``engine.version_probe.body.reference``); {} when not
    recorded."""
    engine = c.manifest.get("engine")
    if not isinstance(engine, Mapping):
        return {}
    config = engine.get("config")
    if not isinstance(config, Mapping):
        probe = engine.get("version_probe")
        body = probe.get("body") if isinstance(probe, Mapping) else None
        config = body.get("reference") if isinstance(body, Mapping) else None
    return config if isinstance(config, Mapping) else {}


def load_run(run_dir: Path, name: str | None = None) -> CellResult:
    """A run folder (a scenario cell or a single ``simulate``/``replay`` run)."""
    run_dir = Path(run_dir)
    status = read_json_object(run_dir / STATUS_FILE)
    summary = read_summary(run_dir / SUMMARY_FILE) or None
    if status:
        state = str(status.get("state", "running"))
    elif summary is not None:
        state = "done"
    else:
        state = "not_run"
    reason = str(status.get("reason", ""))
    unreadable = summary is None and (run_dir / SUMMARY_FILE).exists()
    # a field the report reads, of another type (an edit, another tool's file): not read
    wrong = check_fields(summary, SUMMARY_FIELDS, SUMMARY_FILE) if summary else []
    if unreadable:  # damaged (a full disk, an edit): the run's own files may still be whole
        state, reason = "failed", (
            f"{run_dir / SUMMARY_FILE} cannot be read as a summary; `batchlab summarize "
            f"{run_dir}` rebuilds it from the run's requests")
    elif wrong:
        summary = None
        more = f" (and {len(wrong) - 2} more fields)" if len(wrong) > 2 else ""
        state, reason = "failed", (
            f"{SUMMARY_FILE}: {wrong_text(wrong[:2], file=False)}{more}; `batchlab summarize "
            f"{run_dir}` rebuilds it from the run's requests")
    elif state == "done" and summary is None:
        state, reason = "failed", f"no {SUMMARY_FILE} in {run_dir}"
    manifest = read_json_object(run_dir / MANIFEST_FILE)
    cell = read_json_object(run_dir / CELL_FILE)
    # a manifest's or cell's field of another type: read as absent, and said (``unread``)
    unread = (check_fields(manifest, MANIFEST_FIELDS, MANIFEST_FILE)
              + check_fields(cell, CELL_FIELDS, CELL_FILE))
    manifest = without(manifest, [w for w in unread if w.file == MANIFEST_FILE])
    cell = without(cell, [w for w in unread if w.file == CELL_FILE])
    if (state in ("failed", "interrupted") and summary is not None
            and manifest.get("status") == state):
        # a sweep's cell that measured part of its trace before it ended (an engine that
        # exited, Ctrl-C): its figures are shown as a single run's would be, as having ended
        # early (``ended_early``), and never compared as a whole run's
        state, reason = "done", RESUME_HINT
    if state == "not_run" and manifest.get("status") in ("failed", "interrupted"):
        # a run that ended before it measured anything (an engine that did not start)
        state = str(manifest["status"])
        reason = str(manifest.get("error") or "")
    elif state == "not_run" and manifest.get("status") in ("running", "starting"):
        # killed outright (SIGKILL, a power cut): its manifest never said how it ended
        state = "running"
        if (run_dir / RECORDS_FILE).exists() or any(
                (run_dir / "workers").glob(f"w*/{RECORDS_FILE}")):  # replay --workers
            reason = (f"killed while it ran: its manifest still says {manifest['status']}; "
                      f"`batchlab summarize {run_dir}` rebuilds its summary from the requests "
                      f"{RECORDS_FILE} recorded")
    if state == "running":  # nothing said how it ended
        reason = reason or (_running_text(run_dir)
                            + (f" ({RESUME_HINT})" if status else ""))  # a sweep's cell
    elif state == "interrupted":
        reason = f"{reason or 'stopped by Ctrl-C or SIGTERM'} ({_again_hint(run_dir, manifest)})"
    return CellResult(
        name=name or run_dir.name, run_dir=run_dir, state=state, reason=reason,
        summary=summary if state == "done" else None,
        manifest=manifest, cell=cell, unread=tuple(unread),
    )


class ScenarioFileError(ValueError):
    """A scenario folder's ``scenario.json`` with a field of another type than batchlab
    writes there (an edit, another tool's file): bad input, naming the file and the field."""


def load_scenario_dir(scenario_dir: Path) -> tuple[dict[str, Any], list[CellResult]]:
    """``scenario.json`` and every cell of the scenario, in scenario order.
    ``ScenarioFileError`` when its ``cells`` is not a list of the cells' names."""
    meta = read_json_object(scenario_dir / SCENARIO_FILE)
    recorded_names = meta.get("cells")
    if recorded_names is not None and not STRINGS.test(recorded_names):
        raise ScenarioFileError(
            f"{scenario_dir / SCENARIO_FILE}: cells: expected {STRINGS.name} (the cells' "
            f"names), got {_type_name(recorded_names, STRINGS)}: not a {SCENARIO_FILE} as "
            "batchlab writes it")
    names = list(recorded_names or [])
    if not names:
        names = sorted(p.name for p in scenario_dir.iterdir() if p.is_dir() and (
            (p / STATUS_FILE).exists() or (p / SUMMARY_FILE).exists()))
    recorded = meta.get("digests")
    digests: Mapping[str, Any] = recorded if isinstance(recorded, Mapping) else {}
    defined = meta.get("definitions")  # each cell's definition (a cell not run yet has none)
    definitions: Mapping[str, Any] = defined if isinstance(defined, Mapping) else {}
    cells = []
    for name in names:
        cell_dir = scenario_dir / name
        if cell_dir.is_dir():
            cell = load_run(cell_dir, name)
            made_from = read_json_object(cell_dir / STATUS_FILE).get("digest")
            if cell.ok and name in digests and made_from and made_from != digests[name]:
                cell = replace(cell, stale=True)
            cells.append(cell)
        else:
            definition = definitions.get(name)
            cells.append(CellResult(name=name, run_dir=cell_dir, state="not_run",
                                    reason="not run yet (or excluded by --only)",
                                    cell=dict(definition) if isinstance(definition, Mapping)
                                    else {}))
    return meta, cells


def collect(dirs: Sequence[Path]) -> tuple[list[CellResult], list[dict[str, Any]]]:
    """Run folders from the given directories: a scenario folder gives all its cells, a run
    folder gives itself. A name two of them share is made unique with the folder given
    (``nights/n1/quickstart/continuous``, ``reports/a/sim``): two nights of one scenario share
    its name, so the parent folder's name would not tell them apart."""
    cells: list[CellResult] = []
    given: list[Path] = []  # each cell's folder, as the folder argument spells it
    metas: list[dict[str, Any]] = []
    for d in dirs:
        d = Path(d)
        if (d / SCENARIO_FILE).exists():
            meta, found = load_scenario_dir(d)
            metas.append(meta)
            cells += found
            given += [d / c.name for c in found]
        elif any((d / f).exists() for f in (SUMMARY_FILE, STATUS_FILE, REQUESTS_FILE,
                                           MANIFEST_FILE)):
            # (a manifest alone: a run killed before its summary, said as such)
            cells.append(load_run(d))
            given.append(d)
        else:
            raise FileNotFoundError(f"{d}: not a run folder or scenario folder (no "
                                    f"{SUMMARY_FILE}, {STATUS_FILE}, {MANIFEST_FILE} or "
                                    f"{SCENARIO_FILE})")
    seen: dict[str, int] = {}
    for c in cells:
        seen[c.name] = seen.get(c.name, 0) + 1
    unique = []
    for c, path in zip(cells, given, strict=True):
        if seen[c.name] > 1:
            c = replace(c, name=path.as_posix())
        unique.append(c)
    return unique, metas


# ---------------------------------------------------------------- parquet files


# Files are read with ``pq.ParquetFile``, one file and nothing else: ``pq.read_table`` also
# reads folders of files, through ``pyarrow.dataset``, which imports pandas (0.4 s of every
# report process's start).


def read_table(path: Path) -> pa.Table | None:
    """The whole parquet file, or None when it is missing or unreadable."""
    if not path.exists():
        return None
    try:
        with pq.ParquetFile(path) as file:
            return file.read()
    except (OSError, ValueError):
        return None


def read_columns(path: Path, columns: Sequence[str]) -> dict[str, np.ndarray] | None:
    """Those of ``columns`` the parquet file has; None when it is missing or unreadable."""
    if not path.exists():
        return None
    try:
        with pq.ParquetFile(path) as file:
            wanted = [c for c in columns if c in file.schema_arrow.names]
            tab = file.read(columns=wanted)
    except (OSError, ValueError):
        return None
    out = {}
    for c in wanted:
        try:
            out[c] = numbers(tab.column(c))
        except TypeError as exc:  # damaged, or written by something else: bad input, said so
            raise ValueError(_not_numbers(path, c, exc)) from None
    return out


# chunk rows read at a time (``chunk_tokens_binned``): a row group as pyarrow writes one. In a
# process forked from the report renderer, smaller batches cost more: the memory of each is
# handed back and mapped in again for the next (65,536 rows: 52,000 page faults and 0.33-0.57 s
# for the whole Azure trace's throughput figure, against 13,000 and 0.23-0.28 s)
CHUNK_BATCH_ROWS = 1 << 20
_NUMBER_TYPES = ("DOUBLE", "FLOAT", "INT64", "INT32")  # Parquet's, whose statistics are numbers


def last_chunk_s(path: Path) -> float | None:
    """The latest chunk instant (``t_s``) of a ``chunks.parquet``, on its run's clock: from
    the row groups' statistics where every one has them (a file batchlab wrote), else read.
    None when the file is missing or unreadable, has no chunks, or lacks ``t_s`` or
    ``num_tokens`` (the throughput figure reads both: ``chunk_tokens_binned``)."""
    if not path.exists():
        return None
    try:
        with pq.ParquetFile(path) as file:
            meta = file.metadata
            names = [meta.schema.column(i).path for i in range(meta.num_columns)]
            if not {"t_s", "num_tokens"} <= set(names):
                return None
            column = names.index("t_s")
            stats = [meta.row_group(g).column(column).statistics
                     for g in range(meta.num_row_groups)]
            if meta.schema.column(column).physical_type in _NUMBER_TYPES and all(
                    s is not None and s.has_min_max for s in stats):
                return max((float(s.max) for s in stats), default=None)
            last = -np.inf
            for batch in file.iter_batches(batch_size=CHUNK_BATCH_ROWS, columns=["t_s"]):
                t_s = _number_column(path, batch, "t_s")
                t_s = t_s[~np.isnan(t_s)]  # as statistics leave NaN out
                if t_s.size:
                    last = max(last, float(np.max(t_s)))
    except _NotNumbers:
        raise
    except (OSError, ValueError):
        return None
    return None if last == -np.inf else last


def chunk_tokens_binned(path: Path, origin_s: float, edges: np.ndarray) -> np.ndarray | None:
    """The output tokens a ``chunks.parquet`` delivered in each slice of ``edges``, on a clock
    that starts at ``origin_s`` of its run's (``plots.tokens_binned``), read a batch of rows
    at a time: a whole trace's millions of chunks never in memory at once. None when the file
    is missing or unreadable, or lacks ``t_s`` or ``num_tokens``."""
    if not path.exists():
        return None
    counts = np.zeros(edges.size - 1)
    try:
        with pq.ParquetFile(path) as file:
            if not {"t_s", "num_tokens"} <= set(file.schema_arrow.names):
                return None
            for batch in file.iter_batches(batch_size=CHUNK_BATCH_ROWS,
                                           columns=["t_s", "num_tokens"]):
                counts += tokens_binned(_number_column(path, batch, "t_s") - origin_s,
                                        _number_column(path, batch, "num_tokens"), edges)
    except _NotNumbers:
        raise
    except (OSError, ValueError):
        return None
    return counts


class _NotNumbers(ValueError):
    """A column of a results file that holds no numbers: bad input, said so."""


def _number_column(path: Path, batch: pa.RecordBatch, name: str) -> np.ndarray:
    try:
        return numbers(batch.column(name))
    except TypeError as exc:
        raise _NotNumbers(_not_numbers(path, name, exc)) from None


def _not_numbers(path: Path, column: str, exc: Exception) -> str:
    return (f"{path}: column {column}: {exc} (not a file batchlab wrote as it is; a live "
            "run's `batchlab summarize DIR` rebuilds it from its records.jsonl)")


def classes_not_drawn(manifest: Mapping[str, Any]) -> str | None:
    """Where the requests' priorities came from when a scenario's priority classes were not
    drawn (they had priorities already: a note of the scenario's trace loader); else None."""
    notes = (manifest.get("trace") or {}).get("notes") or ()
    for note in map(str, notes):
        if note.startswith(CLASSES_NOT_DRAWN):
            return note[len(CLASSES_NOT_DRAWN):].lstrip(": ")
    return None


def first_arrival_s(run_dir: Path) -> float:
    """The run's first arrival on its clock (``requests.parquet``), where the time axes of its
    figures start and ``duration_s`` is counted from (docs/metrics.md); 0, the clock's own
    start, when the file cannot say."""
    arrivals = (read_columns(run_dir / REQUESTS_FILE, ("arrival_s",)) or {}).get("arrival_s")
    if arrivals is None:
        return 0.0
    finite = arrivals[np.isfinite(arrivals)]
    return float(finite.min()) if finite.size else 0.0


def request_columns(run_dir: Path) -> dict[str, np.ndarray]:
    """Per-request latencies and preemption counts from ``requests.parquet``."""
    return read_columns(run_dir / REQUESTS_FILE,
                        ("ttft_s", "tpot_s", "e2e_s", "num_preemptions")) or {}


def preemptions(c: CellResult) -> int | None:
    """A cell's preemptions (``num_preemptions``): None when not known, as for a live run whose
    engine exported no counter, or one summarised before live runs counted the engine's (its
    zero was the requests', which a client cannot see)."""
    n = get(c.summary, "num_preemptions")
    if c.manifest.get("kind") == "live" and "preemptions_from" not in (c.summary or {}):
        return None
    return int(n) if isinstance(n, int | float) else None


def preempted_requests(ok: Sequence[CellResult]) -> dict[str, int | None]:
    """Requests preempted at least once, per cell (None without ``requests.parquet``, or for
    a live run: a client cannot see which requests an engine preempted)."""
    out: dict[str, int | None] = {}
    for c in ok:
        if c.manifest.get("kind") == "live":
            out[c.name] = None
            continue
        cols = request_columns(c.run_dir)
        n = cols.get("num_preemptions")
        out[c.name] = int(np.count_nonzero(np.asarray(n) > 0)) if n is not None else None
    return out


def _first(cols: Mapping[str, np.ndarray], names: Sequence[str]) -> np.ndarray | None:
    for name in names:
        if name in cols:
            return np.asarray(cols[name], dtype=np.float64)
    return None


@dataclass(frozen=True, slots=True)
class EngineSamples:
    """Every sample of a run's engine state, in time order, with how long each held: a
    simulated step its duration, a telemetry scrape until the next scrape (the last: 0)."""

    state: EngineState
    held_s: np.ndarray


def read_engine_samples(run_dir: Path) -> EngineSamples | None:
    """Running / waiting / KV usage at every step of ``steps.parquet`` (simulation) or every
    scrape of ``telemetry.parquet`` (live); None when the folder has neither."""
    steps = read_columns(run_dir / STEPS_FILE, ("t_s", "duration_s", "num_running",
                                                "num_waiting", "num_kv_blocks_used",
                                                "num_kv_blocks_total"))
    if steps and "t_s" in steps:
        t = np.asarray(steps["t_s"], dtype=np.float64)
        kv = None
        if "num_kv_blocks_used" in steps and "num_kv_blocks_total" in steps:
            total = np.asarray(steps["num_kv_blocks_total"], dtype=np.float64)
            with np.errstate(divide="ignore", invalid="ignore"):
                kv = np.where(total > 0, steps["num_kv_blocks_used"] / total, np.nan)
        held = _first(steps, ("duration_s",))
        return _in_time_order(
            EngineState(t_s=t, num_running=_first(steps, ("num_running",)),
                        num_waiting=_first(steps, ("num_waiting",)), kv_usage=kv),
            held if held is not None else _until_next(t))
    tele = read_columns(run_dir / TELEMETRY_FILE, (
        "t_s", "time_s", "num_running", "running", "num_waiting", "waiting",
        "kv_usage", "kv_cache_usage", "kv_usage_frac", "kv_cache_usage_perc",
    ))
    if not tele:
        return None
    t_raw = _first(tele, ("t_s", "time_s"))
    if t_raw is None:
        return None
    kv = _first(tele, ("kv_usage", "kv_cache_usage", "kv_usage_frac", "kv_cache_usage_perc"))
    if kv is not None and np.nanmax(kv, initial=0) > 1.0:  # a percentage
        kv = kv / 100.0
    state = _in_time_order(EngineState(
        t_s=t_raw, num_running=_first(tele, ("num_running", "running")),
        num_waiting=_first(tele, ("num_waiting", "waiting")), kv_usage=kv),
        np.zeros(t_raw.size)).state
    return EngineSamples(state, _until_next(state.t_s))


def _until_next(t: np.ndarray) -> np.ndarray:
    """How long each sample of sorted instants ``t`` held: until the next (the last: 0)."""
    return np.append(np.diff(t), 0.0) if t.size else t


def _in_time_order(state: EngineState, held_s: np.ndarray) -> EngineSamples:
    t = np.asarray(state.t_s, dtype=np.float64)
    if t.size < 2 or bool(np.all(t[1:] >= t[:-1])):  # steps are written in order: no sort
        return EngineSamples(EngineState(t_s=t, num_running=state.num_running,
                                         num_waiting=state.num_waiting,
                                         kv_usage=state.kv_usage),
                             np.asarray(held_s, dtype=np.float64))
    order = np.argsort(t, kind="stable")

    def ordered(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else np.asarray(a, dtype=np.float64)[order]

    return EngineSamples(
        EngineState(t_s=np.asarray(state.t_s, dtype=np.float64)[order],
                    num_running=ordered(state.num_running),
                    num_waiting=ordered(state.num_waiting), kv_usage=ordered(state.kv_usage)),
        np.asarray(held_s, dtype=np.float64)[order])


def read_engine_state(run_dir: Path) -> EngineState | None:
    """Running / waiting / KV usage over time (``read_engine_samples``), down-sampled to a
    fixed number of points for a plot."""
    samples = read_engine_samples(run_dir)
    return None if samples is None else _downsample(samples.state)


def _downsample(state: EngineState) -> EngineState:
    """The points the plot needs (``plots.envelope``) of samples in time order: a whole
    trace has hundreds of thousands of steps, and a spike of one step must still show."""
    keep = envelope(state.t_s, (state.num_running, state.num_waiting, state.kv_usage),
                    ENGINE_STATE_COLUMNS)

    def pick(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else a[keep]

    return EngineState(t_s=state.t_s[keep], num_running=pick(state.num_running),
                       num_waiting=pick(state.num_waiting), kv_usage=pick(state.kv_usage))


# ---------------------------------------------------------------- what tells cells apart


def knob(c: CellResult, name: str) -> Any:
    return c.knobs.get(name)


def trace_digest(c: CellResult) -> str | None:
    trace = c.manifest.get("trace") or {}
    digest = trace.get("digest")
    return str(digest) if digest else None


def varying_knobs(cells: Sequence[CellResult]) -> list[str]:
    """Knobs that differ between the cells that recorded them: a cell that never started has
    only those its definition asked for, and a knob it left to its engine's default is not
    known, not a difference."""
    known = [c for c in cells if c.knobs]
    names: list[str] = []
    for c in known:
        names += [k for k in c.knobs if k not in names]
    def text(name: str, value: Any) -> str:  # no extra argument, however a run recorded it
        empty = name == "extra_args" and (value is None or value == [] or value == ())
        return "[]" if empty else value_text(value)

    return [k for k in names if len({text(k, c.knobs[k]) for c in known if k in c.knobs}) > 1]


def sweep_cells(cells: Sequence[CellResult]) -> list[CellResult]:
    """Cells of a batch-size sweep: max_num_seqs takes several values and nothing else varies
    except the grid's other knobs (which split the sweep into series)."""
    with_bs = [c for c in cells if isinstance(knob(c, "max_num_seqs"), int)]
    if len({knob(c, "max_num_seqs") for c in with_bs}) < 2:
        return []
    return with_bs


def series_key(c: CellResult, varying: Sequence[str]) -> str:
    """What besides max_num_seqs tells this cell's line apart: engine, other knobs, load."""
    engine = c.cell.get("engine") or {}
    parts = [str(engine.get("name") or c.engine)]
    parts += [f"{k}={value_text(knob(c, k))}" for k in varying if k != "max_num_seqs"]
    if c.at_load:
        parts.append(c.load)
    return ", ".join(parts)


def client_limited(c: CellResult) -> bool:
    """Whether the replay client, not the engine, was the limit in this run."""
    value = c.manifest.get("client_limited")
    if value is None:
        value = get(c.summary, "client_limited")
    return bool(value)


def approximations(c: CellResult) -> list[str]:
    """Knobs the engine approximated or did not apply, one line each. An attached server got
    no knob at all: one line says so, and which knobs are known and how."""
    if c.attached:
        sources = c.manifest.get("knob_sources")
        known = ([f"{k}={value_text(c.knobs.get(k))} ({v})" for k, v in sources.items()
                  if v != "unknown"] if isinstance(sources, Mapping) else [])
        return ["attached to a server started outside batchlab: no knob reached it; "
                + ("known: " + ", ".join(known) + "; the rest unknown" if known
                   else "its knobs are unknown")]
    out = [str(a) if not isinstance(a, Mapping) else
           f"{a.get('knob', '?')}: {a.get('note') or a.get('status', '')}".strip()
           for a in c.manifest.get("approximations") or []]
    listed = set(out)
    for m in c.manifest.get("mapping") or []:
        # an unset knob left at the engine's own default is neither (manifest knobs say it)
        if not isinstance(m, Mapping) or m.get("status", "applied") in ("applied", "default"):
            continue
        status = str(m.get("status")).replace("_", " ")
        text = f"{m.get('knob')}={value_text(m.get('value'))} {status}"
        if m.get("note"):
            text += f" ({m['note']})"
        if text not in listed:
            out.append(text)
    return out
