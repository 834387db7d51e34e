"""One probe of a capacity search: the trace at one load, run on the target into its own folder.

A probe is an ordinary recorded run (``harness.targets.make_target(spec).run``), simulated or
live, plus three small files that make its folder a report cell and a resumable step::

    <search folder>/rate-4/        requests.parquet, summary.json, manifest.json, ... (the run)
                                   cell.json   engine, knobs, grid and load, as a scenario cell
                                   status.json done / running (as a scenario cell)
                                   probe.json  load, attainment, passed, stopped, digest,
                                               requests the early stop cut off

A probe passes when its SLO attainment (requests meeting every SLO / requests sent) is at
least the target. A probe the saturation check stopped fails, with the reason recorded; its
latency figures are of the requests that finished only (a lower bound), and its probe.json says
how many the stop cut off (``num_cut_off``).

A probe whose live server stopped answering is no verdict about the load: a launched engine that
exits ends it (``EngineExited``), and so does an attached server that no longer answers its
health route after the probe, with requests failed, or a probe that half its requests or more
could not reach (no connection, a stream cut: ``ServerStoppedAnswering``), or an attached server
that describes itself otherwise after the probe than before it, restarted under it with another
configuration (``ServerRestarted``: its figures are of two configurations). Either way the probe
fails, its folder says why (``status.json`` failed, no ``probe.json``), the search stops, and a
resumed search runs it again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.capacity.saturation import SaturationMonitor, interval_for
from harness.capacity.search import LOAD_UNITS, LoadKind, ProbeOutcome, load_text, normal_load
from harness.manifest import read_manifest, record_failed
from harness.metrics import Pace, Slo, num_cut_off
from harness.redact import redact_tree, redact_url
from harness.results import (
    PROBE_FILE,
    SUMMARY_FILE,
    NothingServed,
    attainment_after_warm_up,
    nothing_served,
    pace_of,
    read_summary,
    write_json_atomic,
)
from harness.scenario.attached import (
    ServerRestarted,
    ServerStoppedAnswering,
    connection_failures,
    fail_if_restarted,
    is_attached,
    not_answering,
)
from harness.scenario.status import CELL_FILE, STATUS_FILE, interrupted_reason
from harness.target import ClosedLoop, RunOptions, TargetSpec
from harness.targets import make_target
from harness.traces import Trace, TraceError, TraceOptions, load_trace

# A rate probe passes only if the engine kept pace with the arrivals. In a steady state
# requests finish as fast as they arrive, one E2E later; an engine that falls behind builds a
# backlog that a longer trace would turn into missed SLOs. The check (``pace_of``; the rule and
# its constants are defined with the metrics, harness.metrics.PACE_SIGMAS): over the second half
# of the arrival window, the engine completed the requests that were due there (each its own
# decode time after its arrival, had it waited no longer than the quickest), short of them by
# no more than chance explains; and the arrivals lasted long enough to show a steady state at
# all. Either failing fails the probe, however many requests met the SLO.


@dataclass(frozen=True)
class ProbePlan:
    """What every probe of one search shares: target, trace, SLO, load axis."""

    spec: TargetSpec
    trace_at: Callable[[LoadKind, float], Trace]  # the trace at a load (rate: rescaled)
    slo: Slo
    kind: LoadKind
    target: float
    cell: Mapping[str, Any]  # cell.json without the load: name, engine, knobs, grid
    digest: str  # what the outcome depends on: a resumed search reuses only equal digests
    think_time_s: float = 0.0  # simulated closed loop only
    replay: Mapping[str, Any] = field(default_factory=dict)  # live: ReplayConfig fields
    command: Sequence[str] | None = None
    early_stop: bool = True
    made_from: Mapping[str, Any] = field(default_factory=dict)  # what ``digest`` digests


def probe_label(kind: LoadKind, load: float, *, full: bool = False) -> str:
    """The probe's folder name, e.g. ``rate-4.5`` or ``conc-16`` (as scenario load points);
    ``rate-4.5-full`` for the run that confirms a probe stopped early (``search``)."""
    text = f"{load:g}" if kind == "rate" else f"{int(load)}"
    return (f"rate-{text}" if kind == "rate" else f"conc-{text}") + ("-full" if full else "")


def trace_file_at(path: str, options: Mapping[str, Any]) -> Callable[[LoadKind, float], Trace]:
    """A trace file (or "synthetic") with ``TraceOptions`` fields: at a rate probe's load it is
    rescaled to that mean rate (synthetic arrivals: drawn at it); for N users it is as given
    (a synthetic one needs no rate then)."""
    def at(kind: LoadKind, load: float) -> Trace:
        fields = dict(options)
        if kind == "rate":
            fields["rate"] = load
        elif fields.get("rate") is None and str(path).startswith("synthetic"):
            fields["rate"] = math.inf  # users send as they free up: arrival times unused
        elif fields.get("rate") is None:
            try:
                return load_trace(path, TraceOptions(**fields))
            except TraceError as exc:
                if "has no timestamps" not in str(exc):
                    raise
                # lengths only (ShareGPT): users need no arrival times, nor a rate for them
                fields["rate"] = math.inf
        return load_trace(path, TraceOptions(**fields))
    return at


def run_probe(plan: ProbePlan, load: float, out_dir: Path, *, full: bool = False
              ) -> ProbeOutcome:
    """Run one probe into ``out_dir``; its outcome (also written to ``probe.json``).
    ``full``: to its end, without the early stop (it confirms a probe that was stopped).

    Exceptions of the run (an engine that does not start) propagate: a probe that could not
    run says nothing about the SLO."""
    load = normal_load(plan.kind, load)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / PROBE_FILE).unlink(missing_ok=True)
    trace = plan.trace_at(plan.kind, load)
    write_json_atomic(redact_tree({**plan.cell, "name": f"{plan.cell.get('name')}/{out_dir.name}",
                                   "load": {"kind": plan.kind, "value": load}}),  # env: ***
                      out_dir / CELL_FILE)
    write_json_atomic({"state": "running"}, out_dir / STATUS_FILE)
    closed = plan.kind == "concurrency"
    replay = dict(plan.replay)
    if closed and not plan.spec.simulated:
        replay.update(mode="closed", concurrency=int(load))
    monitor = SaturationMonitor(interval_s=interval_for(_span_s(trace, plan.kind, load)))
    options = RunOptions(
        slo=plan.slo, command=list(plan.command) if plan.command else None, replay=replay,
        write_report=False,
        closed_loop=ClosedLoop(int(load), plan.think_time_s) if closed and plan.spec.simulated
        else None,
        early_stop=monitor if plan.early_stop and not full else None,
    )
    try:
        summary = make_target(plan.spec).run(trace, out_dir, options)
    except KeyboardInterrupt as exc:
        write_json_atomic({"state": "interrupted", "reason": interrupted_reason(exc)},
                          out_dir / STATUS_FILE)
        raise
    except BaseException as exc:
        write_json_atomic({"state": "failed", "reason": f"{type(exc).__name__}: {exc}"},
                          out_dir / STATUS_FILE)
        raise
    lost = server_lost(plan, load, summary, out_dir)
    if lost is not None:  # as a launched engine's exit (harness.live.run): a failed run
        record_failed(out_dir, summary, lost)
        write_json_atomic({"state": "failed", "reason": lost}, out_dir / STATUS_FILE)
        raise ServerStoppedAnswering(lost)
    restarted = (fail_if_restarted(out_dir, summary, plan.spec.url)
                 if is_attached(plan.spec) and plan.spec.url else None)
    if restarted is not None:  # figures of two configurations: no verdict about either
        write_json_atomic({"state": "failed", "reason": restarted}, out_dir / STATUS_FILE)
        raise ServerRestarted(restarted)
    why = nothing_served(summary, out_dir)
    if why is not None:  # its summary and manifest say so, as `batchlab simulate`'s do
        summary = record_failed(out_dir, summary, why)
    if why is not None and set(summary.get("failures") or {}) == {"rejected"}:
        # refused whatever the load (a prompt that cannot fit): no load would pass
        write_json_atomic({"state": "failed", "reason": why}, out_dir / STATUS_FILE)
        raise NothingServed(f"{why}: the engine refuses these requests at any load")
    refused = int((summary.get("failures") or {}).get("rejected") or 0)
    sent = int(summary.get("num_requests") or 0)
    if (plan.spec.simulated and sent and not summary.get("stopped_early")
            and refused / sent > 1 - plan.target):  # over the whole trace, not a stopped part
        # the reference refuses only what can never fit, whatever the load: halving the load
        # down to the lowest would find nothing (a live engine's refusals may be the load's)
        why = (f"{refused} of {_requests(sent)} {'is' if refused == 1 else 'are'} refused at "
               f"any load ({'it' if refused == 1 else 'they'} can never fit the KV cache): "
               f"SLO attainment cannot reach {plan.target:.1%}, whatever the load")
        write_json_atomic({"state": "failed", "reason": why}, out_dir / STATUS_FILE)
        raise NothingServed(why)
    # a stopped probe failed already; its requests cut off say nothing of the pace
    pace = None if closed or summary.get("stopped_early") else pace_of(out_dir)
    # a closed loop is judged once its users are under way, not on their first requests
    warm_up = attainment_after_warm_up(out_dir, plan.slo) if closed and plan.slo else None
    outcome = replace(outcome_from_summary(load, summary, plan.target, run_dir=out_dir.name,
                                           pace=pace, warm_up=warm_up), full=full)
    write_json_atomic({"kind": plan.kind, "unit": LOAD_UNITS[plan.kind], "digest": plan.digest,
                       "target": plan.target, **outcome.as_dict(),
                       **cut_off_fields(outcome, num_cut_off(summary) if outcome.stopped else 0)},
                      out_dir / PROBE_FILE)
    write_json_atomic({"state": "done"}, out_dir / STATUS_FILE)
    return outcome


def _requests(n: int) -> str:
    """``n`` requests, or 1 request."""
    return f"{n:,} request{'' if n == 1 else 's'}"


def server_lost(plan: ProbePlan, load: float, summary: Mapping[str, Any], out_dir: Path
                ) -> str | None:
    """Why a live probe's run is no measurement of the load, in words, or None when it is.

    An attached server that does not answer its health route after the probe, when requests
    of the probe failed (a server gone after the last request still measured them all); or,
    attached or launched, a probe that half its requests or more could not reach (no
    connection, a stream cut): a server killed and started again answers now, but did not
    answer them. Such failures are not the engine's answer to the load: counted as missed
    SLOs, they would fail the probe and send the search below the engine's capacity. A
    replay or a sweep's cell is a measurement of what happened, not a verdict about a load:
    it fails only when its server is gone after it (``harness.scenario.attached.
    gone_mid_run``) or describes itself differently after it than before
    (``fail_if_restarted``), and a server restarted as it was leaves failures to be counted."""
    if plan.spec.simulated:
        return None
    sent = int(summary.get("num_requests") or 0)
    failed = int(summary.get("num_failed") or 0)
    unreached = connection_failures(summary)
    num_unreached = sum(unreached.values())
    # (nothing failed: no question whether the server is gone, and no health request)
    down = not_answering(plan.spec) if is_attached(plan.spec) and failed else None
    many = sent > 0 and 2 * num_unreached >= sent
    if not ((down is not None and failed) or many):
        return None
    engine = read_manifest(out_dir).get("engine")
    url = plan.spec.url or (engine.get("base_url") if isinstance(engine, Mapping) else None)
    url = redact_url(str(url))  # said on the console and in the manifest
    who = (f"the server at {url}" if is_attached(plan.spec)
           else f"the {plan.spec.engine} engine at {url}")
    at = f"the probe at {load_text(plan.kind, load)}"
    kinds = ", ".join(f"{k} {v}" for k, v in unreached.items())
    reached = (f"{num_unreached} of {_requests(sent)} could not connect or "
               f"{'was' if num_unreached == 1 else 'were'} cut off ({kinds})" if num_unreached
               else f"{failed} of {_requests(sent)} failed")
    if down is not None:
        what = f"{who} stopped answering during {at} (after it, {down}); {reached}"
    else:  # restarted since (attached), or its connections lost (launched)
        what = f"{who} could not be reached during {at}: {reached}" + (
            "; it answers again now" if is_attached(plan.spec) else "")
    return (f"{what}. The probe says nothing about the load and is not kept: once the server "
            "answers again, the same command with --resume runs it again")


def _span_s(trace: Trace, kind: LoadKind, load: float) -> float:
    if kind == "rate":
        return trace.duration_s
    return math.inf  # a closed loop's length is not known before it runs


def outcome_from_summary(load: float, summary: Mapping[str, Any], target: float,
                         *, run_dir: str | None = None, pace: Pace | None = None,
                         warm_up: tuple[float, int] | None = None) -> ProbeOutcome:
    """A probe's outcome from its ``summary.json``: passed when attainment >= target, the run
    was not stopped early and the engine kept pace with the arrivals (``pace``, rate probes).
    ``warm_up``: a closed loop's attainment once its users were under way, and how many of
    its first requests that leaves out (``attainment_after_warm_up``), for the summary's."""
    goodput = summary.get("goodput") or {}
    attainment = goodput.get("slo_attainment") if warm_up is None else warm_up[0]
    stopped = summary.get("stopped_early")
    throughput = summary.get("throughput") or {}
    passed = (attainment is not None and attainment >= target and not stopped
              and (pace is None or pace.kept))
    num_failed = summary.get("num_failed")
    num_requests = summary.get("num_requests")
    return ProbeOutcome(
        load=load, attainment=attainment, passed=bool(passed),
        num_failed=int(num_failed) if isinstance(num_failed, int | float) else None,
        num_requests=int(num_requests) if isinstance(num_requests, int | float) else None,
        stopped=str(stopped) if stopped else None, run_dir=run_dir,
        output_tokens_per_s=throughput.get("output_tokens_per_s"),
        ttft_p90_s=(summary.get("ttft_s") or {}).get("p90"),
        tpot_p90_s=(summary.get("tpot_s") or {}).get("p90"),
        due_per_s=pace.due_per_s if pace else None,
        completed_per_s=pace.completed_per_s if pace else None,
        kept_pace=pace.kept if pace else None, behind=pace.why if pace else None,
        num_warm_up=warm_up[1] if warm_up else None,
    )


def cut_off_text(outcome: ProbeOutcome, num_cut: int) -> str | None:
    """What a probe's latency figures are of when its early stop cut requests off (None
    otherwise): of the requests that finished only, the cut off being failed
    (``not_finished``), so they understate its latency."""
    if not (outcome.stopped and num_cut):
        return None
    done = (outcome.num_requests or 0) - (outcome.num_failed or 0)
    if done <= 0:  # nothing finished: there are no figures to bound
        return (f"of no request: none finished before the early stop cut off {num_cut} "
                f"{'request' if num_cut == 1 else 'requests'}")
    return (f"of the {done} {'request' if done == 1 else 'requests'} that finished only, not "
            f"of the {num_cut} the early stop cut off: a lower bound")


def cut_off_fields(outcome: ProbeOutcome, num_cut: int) -> dict[str, Any]:
    """``probe.json``'s and ``search.json``'s word on a probe's requests cut off by its early
    stop (``num_cut``, 0 for a probe not stopped): ``num_cut_off``, and ``latency_note``
    saying what ``ttft_p90_s`` and ``tpot_p90_s`` are then of (None when none was cut off)."""
    text = cut_off_text(outcome, num_cut)
    return {"num_cut_off": num_cut,
            "latency_note": None if text is None else f"ttft_p90_s and tpot_p90_s are {text}"}


def read_probe(run_dir: Path, digest: str) -> ProbeOutcome | None:
    """A finished probe of the same search (equal digest) in ``run_dir``, else None."""
    import json

    try:
        data = json.loads((run_dir / PROBE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("digest") != digest:
        return None
    if not (run_dir / SUMMARY_FILE).exists():
        return None
    summary = read_summary(run_dir / SUMMARY_FILE)
    sent = summary.get("num_requests")
    if isinstance(sent, int | float) and sent > 0 and (
            2 * sum(connection_failures(summary).values()) >= sent):
        # half its requests or more never reached the server: no verdict about the load (one
        # an earlier batchlab kept as a verdict is run again)
        return None
    try:
        outcome = ProbeOutcome.from_dict(data)
    except TypeError:
        return None
    return replace(outcome, run_dir=run_dir.name)
