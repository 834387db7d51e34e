"""Key findings: generated sentences about a report's cells, the largest differences first.

Two figures differ when they are more than ``SAME_WITHIN`` apart (relative to the one they are
compared with). When one of them is a prediction (a simulated cell, or the reference engine
served over HTTP: ``is_prediction``), the gap must also exceed what the predictions are known
to miss by for that kind of figure (throughput, TTFT, TPOT/ITL: ``METRIC_KINDS``): the median
|error| each predicted side's record quotes for it (``_Margin``). A gap within that error is
said to be within the predictions' known error, naming it; one beside a prediction whose error
of that kind was never measured (or not recorded), or was measured only on other models, GPUs
or data types than its own (the record's coverage, as the tables' notes say), is given as its
figures and change, saying so. Neither crowns a leader or is said to have risen or fallen.
Two measurements compare as they always did, and so do predictions of one model on one GPU by
one predictor that differ in their settings only (``_one_predictor``): its known error is of
absolute figures.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from harness.metrics import PACE_TOLERANCE, Pace, flatten
from harness.prediction import (
    OUTSIDE_NOT_SAID,
    accuracy,
    coverage_outside,
    kind_coverage_note,
    recorded_prediction,
)
from harness.report.context import (
    ReportContext,
    class_name,
    one_slo,
    priority_sort_key,
    same_slo,
    slo_notes,
)
from harness.report.curves import (
    DEFAULT_TARGET,
    MIN_SWEEP_CAPS,
    Baselines,
    CapacityRow,
    batch_rows,
    capacity_ratio,
    capacity_text,
    cell_setting,
    within_precision,
)
from harness.report.format import (
    and_codes,
    code,
    fmt_attainment,
    fmt_int,
    fmt_number,
    fmt_pair,
    fmt_pct,
    fmt_ratio,
    fmt_seconds,
    fmt_seconds_against,
    missing,
    short,
    slo_text,
    value_text,
)
from harness.report.predictions import (
    is_prediction,
    margin_caveat,
    predicted_settings,
    predictor,
    short_of_error,
)
from harness.report.runs import (
    CellResult,
    approximations,
    client_limited,
    engine_config,
    get,
    knob,
    preemptions,
    series_key,
    sweep_cells,
    varying_knobs,
    wrong_text,
)

# relative differences under 5% are called "about the same"; beside a prediction, a gap counts
# as a difference only beyond the larger of this and the predictions' known error (``_Margin``)
SAME_WITHIN = 0.05
MAX_COMPARISONS = 5  # cells compared with the baseline in the findings, largest first
MAX_PRIORITY_FINDINGS = 3  # per-class comparisons in the findings
ITL_APART = 1.25  # a class's ITL p99 is worth a phrase when it moved this much unlike TPOT p90


def key_findings(cells: Sequence[CellResult], base: CellResult | None, ctx: ReportContext,
                 preempted: Mapping[str, int | None], *,
                 capacity: Sequence[CapacityRow] = (),
                 target: float = DEFAULT_TARGET,
                 bases: Baselines | None = None, num_unsearched: int = 0) -> list[str]:
    """Generated sentences: the capacity at the SLO first (``capacity``: the report's capacity
    rows, at SLO attainment ``target``; ``num_unsearched``: the search's settings without a
    row, which the answer counts), then the largest differences against the baseline
    (``bases``: what each cell is compared with; ``Baselines.of(ok, base)`` when not given)."""
    ok = [c for c in cells if c.ok]
    out: list[str] = []
    # cells not compared with their baseline, their results another's (_same_results_finding)
    compared: dict[str, tuple[str, str] | None] = {}
    answer = _capacity_finding(capacity, base, ctx.slo, target,
                               predicted=predicted_settings(capacity, ok),
                               num_unsearched=num_unsearched)
    if answer:
        out.append(answer)
    out += [*ctx.notes, *slo_notes(ok)]
    behind = ([] if any(r.source == "search" for r in capacity)
              else [*_behind_finding(ok), *_pace_unchecked_finding(ok),
                    *_pace_unread_finding(ok)])
    if len(ok) == 1:
        sentence = _single_run_sentence(ok[0])
        out.append(sentence if len(cells) == 1 else
                   f"{code(ok[0].name)} s{sentence[1:]}")  # "`x` served ..."
        out += behind
    elif ok and base is not None:
        out += behind  # before the comparisons it qualifies
        if not any(r.source == "search" for r in capacity):
            out += _offered_load_finding(ok)
        bases = bases or Baselines.of(ok, base)
        # what a sweep of max_num_seqs asks (the cap within the TPOT SLO, where KV memory
        # binds) before the largest differences between cells
        # a cell that ended early (interrupted, its engine gone) or was stopped early (its
        # latencies a lower bound) has partial figures: said apart below, never compared with
        # a whole run's (``CellResult.partial``)
        whole = [c for c in ok if not c.partial]
        batch = _batch_size_findings(whole, ctx.slo)
        out += batch
        out += tuning_findings(whole, ctx.slo, latency_stated=bool(batch))
        # cells that differ in scheduling policy, priority among them: what each class got is
        # the answer, and comes before the all-traffic comparisons it would otherwise follow
        # a capacity search's answer is its capacity load: what each class got there first
        at_capacity = {r.cells[0] for r in capacity if r.source == "search" and r.cells}
        priority = _priority_findings(whole, bases, ctx, first=at_capacity)
        policies = {knob(c, "policy") for c in whole}
        if priority and len(policies) > 1 and "priority" in policies:
            out += priority
            priority = []
        scored = []
        # a cell whose results are another's (``_same_results_finding``) is not compared with
        # the same baseline a second time, word for word: that finding says the first's holds
        twins = _same_results_groups(ok)
        for c in ok:
            b = bases.of_cell(c)
            # a run stopped or ended early has partial figures: said apart, never compared
            if b is None or b is c or b.partial or c.partial:
                continue
            first = next((g[0] for g in twins if c in g[1:]), None)
            if first is not None and (b is first or bases.of_cell(first) is b):
                compared[c.name] = (first.name, b.name) if b is not first else None
                continue
            score, text = _comparison(c, b)
            if text:
                scored.append((score, text, c.name))
        scored.sort(key=lambda s: -s[0])  # stable: equal scores keep cell order
        out += [text for _, text, _ in scored[:MAX_COMPARISONS]]
        shown = {name for _, _, name in scored[:MAX_COMPARISONS]}
        for name, said in compared.items():  # "above" only of a comparison that is
            if said is not None and said[0] not in shown:
                compared[name] = None
        if len(scored) > MAX_COMPARISONS:
            out.append(f"{len(scored) - MAX_COMPARISONS} more cells compare with "
                       f"{bases.phrase(code)} in the tables below.")
        out += _one_knob_findings(whole, base)
        out += _leaders_by_load(whole)
        out += priority
    out += _same_results_finding(ok, compared)
    preemption = _preemption_finding(ok, preempted) if len(ok) > 1 else ""
    if preemption:
        out.append(preemption)
    out += _prefix_cache_finding(ok)
    for c in ok:
        ended = c.ended_early
        if ended and c.served_nothing:
            # sent its whole trace and had nothing back: a failure, not a run cut short
            out.append(f"{code(c.name)} failed: {ended.rstrip('.')}; nothing was measured.")
        elif ended:
            out.append(f"{code(c.name)} did not run to its end: {ended.rstrip('.')}."
                       + ("" if c.in_flight_lost else
                          " Its figures cover the requests it sent."))
    for c in cells:
        if c.state in ("failed", "interrupted", "running"):
            reason = short(c.reason) if c.reason else "no reason recorded"
            nothing = reason.startswith("NothingServed: ")  # it ran to its end, serving none
            out.append(f"{code(c.name)} " + (
                f"measured nothing: {reason.removeprefix('NothingServed: ').rstrip('.')}."
                if nothing else f"did not finish: {reason.rstrip('.')}."))
    for c in cells:
        if c.unread:
            out.append(f"In {code(c.name)}, fields of another type than batchlab writes there "
                       "were read as absent (what they record is not known here): "
                       f"{wrong_text(c.unread)}.")
    stale = [c.name for c in ok if c.stale]
    if stale:
        out.append(f"{', '.join(map(code, stale))} "
                   f"{'were' if len(stale) > 1 else 'was'} run from an earlier definition "
                   "(its knobs, trace, files or batchlab version have changed since) and left "
                   "as it was by --only or --resume: "
                   f"{'their figures' if len(stale) > 1 else 'its figures'} may not answer this "
                   "scenario; `batchlab run` with `--resume` runs "
                   f"{'them' if len(stale) > 1 else 'it'} again.")
    out += _server_changed(ok)
    not_run = [c.name for c in cells if c.state == "not_run"]
    if not_run:
        out.append(f"{len(not_run)} cell{'s' if len(not_run) > 1 else ''} not run "
                   f"(excluded by --only or not yet run): {', '.join(map(code, not_run))}.")
    for c in ok:
        failures = dict(get(c.summary, "failures") or {})
        stopped = get(c.summary, "stopped_early")
        if stopped:  # requests in flight when the run was stopped were cut off, not failed
            cut = failures.pop("not_finished", 0)
            not_sent = int(get(c.summary, "num_not_sent") or c.manifest.get("num_not_sent")
                           or 0)
            if c.ended_early is None:
                out.append(f"{code(c.name)} was stopped early ({short(str(stopped))}): "
                           f"{cut:,} request{'s' if cut != 1 else ''} in flight cut off, "
                           f"{not_sent:,} never sent.")
        failed = sum(failures.values())
        if failed:
            kinds = ", ".join(f"{k} {v:,}" for k, v in failures.items())
            out.append(f"{code(c.name)} failed {failed:,} of "
                       f"{get(c.summary, 'num_requests') or 0:,} requests ({kinds}).")
        if client_limited(c):
            out.append(f"The client was the limit in {code(c.name)} (send lag p99 "
                       f"{fmt_seconds(get(c.summary, 'send_lag_s.p99'))}): its latencies "
                       "include client delay.")
        frac = get(c.summary, "output_length_fidelity.fraction_reached_target")
        if not missing(frac) and frac < 0.99:
            out.append(f"In {code(c.name)} only {fmt_pct(frac)} of requests reached their "
                       "target output length, so its tokens/s is not comparable token for "
                       "token.")
        over = get(c.summary, "output_length_fidelity.num_over_target")
        if not missing(over) and over > 0:
            out.append(f"In {code(c.name)} {over:,} requests returned more output tokens than "
                       "the trace asks (by the server's own count): the server did not honour "
                       "max_tokens, so its tokens/s counts tokens the trace never asked for.")
        if c.attached:
            out.append(f"{code(c.name)} ran on a server started outside batchlab: no knob "
                       "reached it, so its settings are what the server had (see "
                       "Approximations).")
            continue
        n_approx = len(approximations(c))
        if n_approx:
            out.append(f"{code(c.name)} ran with {n_approx} knob{'s' if n_approx > 1 else ''} "
                       "approximated or not applied (see Approximations).")
    if not ok:
        out.insert(0, "No cell produced results.")
    return out


def _single_run_sentence(c: CellResult) -> str:
    s = c.summary
    text = (f"Served {get(s, 'num_completed') or 0:,} of {get(s, 'num_requests') or 0:,} "
            f"requests in {fmt_seconds(get(s, 'duration_s'))}: "
            f"{fmt_number(get(s, 'throughput.output_tokens_per_s'), 'output tokens/s')}, "
            f"TTFT p90 {fmt_seconds(get(s, 'ttft_s.p90'))}, "
            f"TPOT p90 {fmt_seconds(get(s, 'tpot_s.p90'))}, "
            f"E2E p90 {fmt_seconds(get(s, 'e2e_s.p90'))}")
    attainment = get(s, "goodput.slo_attainment")
    if not missing(attainment):
        text += f"; {fmt_attainment(attainment)} of requests met the SLO"
    return text + "."


def _server_changed(ok: Sequence[CellResult]) -> list[str]:
    """Cells measured against one attached server (``--url``, or a scenario engine's ``url``)
    while it described itself differently (its ``/version`` or ``/info`` answer, as each
    cell's manifest recorded it): restarted with other settings between them, so their
    figures are of different configurations, though nothing in their definitions differs."""
    by_url: dict[str, dict[str, list[str]]] = {}
    answers: dict[str, Any] = {}
    for c in ok:
        engine = c.manifest.get("engine")
        if not isinstance(engine, Mapping) or engine.get("mode") != "attach":
            continue
        probe = engine.get("version_probe")
        body = probe.get("body") if isinstance(probe, Mapping) else None
        url = engine.get("base_url")
        if body is None or not isinstance(url, str):
            continue
        key = json.dumps(body, sort_keys=True, default=str)
        answers[key] = body
        by_url.setdefault(url, {}).setdefault(key, []).append(c.name)
    out = []
    for url, groups in by_url.items():
        if len(groups) < 2:
            continue
        flat = [flatten(answers[key]) if isinstance(answers[key], Mapping)
                else {"answer": answers[key]} for key in groups]
        differ = sorted({k for f in flat for k in f if len({str(g.get(k)) for g in flat}) > 1})
        said = ", ".join(differ[:4]) + (f" and {len(differ) - 4} more" if len(differ) > 4 else "")
        sets = "; ".join(", ".join(map(code, names)) for names in groups.values())
        out.append(f"The server at {url} described itself differently across the cells measured "
                   f"against it ({said} differ): {sets}. It was restarted with other settings "
                   "between them, so their figures are of different configurations, though "
                   "their definitions are the same; `batchlab run` with `--resume` runs again "
                   "those measured against another configuration than the server reports now.")
    return out


def _behind_finding(ok: Sequence[CellResult]) -> list[str]:
    """The runs whose engine fell behind their arrivals (``CellResult.pace``): a queue that
    grew for the whole run, so that their waits are those of the trace's length. Beside them,
    the runs that fell short of their arrivals by more than ``PACE_TOLERANCE`` too, but by no
    more than chance explains: a cell is not set apart from one just as short.

    The completion rates are the pace check's (docs/metrics.md): requests finished from the
    arrivals' midpoint to the last arrival. The finding says so, and that they are not the
    Throughput table's whole-run rates, which count the queue's drain too (a batch-size
    sweep's cell completed 7.52 req/s in that window and 20 req/s over its whole run)."""
    paces = [(c, c.pace) for c in ok]
    behind = [(c, p) for c, p in paces if p is not None and p.overloaded]
    if not behind:
        return []
    near = [(c, p) for c, p in paces if p is not None and _short_within_chance(p)]

    def waited_text(pace: Pace) -> str:
        return (f"those arriving last waited {fmt_seconds(pace.queue_growth_s)} longer for a "
                f"first token than the first, over arrivals lasting {fmt_seconds(pace.span_s)}, "
                "too short to count a rate over their second half")

    def rates(pace: Pace, short: bool = False) -> str:
        if not pace.counted:  # the wait is the evidence, as Pace.behind_warning says it
            return waited_text(pace)
        grew = (f"; too short to show a steady state, yet those arriving last waited "
                f"{fmt_seconds(pace.queue_growth_s)} longer for a first token than the first"
                if pace.swamped else "")
        # "11.24 req/s while 12.4 req/s were due, 9.4% short": figures that give the shortfall
        done, came = fmt_pair(pace.completed_per_s, pace.due_per_s,
                              change=_shortfall if short else None)
        return (f"completed {done} req/s while {came} req/s were due{grew}"
                + (f", {_shortfall(pace.completed_per_s / pace.due_per_s)} short"
                   if short else ""))

    # the verdict first: what falling behind does to the figures, then the evidence
    def verdict(head: str, *, one: bool) -> str:
        its, it = ("its", "it") if one else ("their", "each")
        return (f"{head}, so {its} TTFT and E2E are those of this trace's length (a longer trace "
                f"would wait longer), not of a steady state; `batchlab capacity` finds the "
                f"highest load {it} keeps pace with.")

    if len(behind) == 1:
        c, pace = behind[0]
        who = "The engine" if len(ok) == 1 else code(c.name)
        evidence = (f"over the second half of its arrivals it {rates(pace)}" if pace.counted
                    else waited_text(pace))
        how = f"{evidence[0].upper()}{evidence[1:]}, its queue growing for the whole run."
        window = f" {_pace_window([pace], plural=False)}" if pace.counted else ""
        text = f"{verdict(f'{who} fell behind its arrivals', one=True)} {how}{window}"
    elif (len({fmt_number(p.due_per_s, "req/s") for _, p in behind}) == 1
          and len({p.swamped for _, p in behind}) == 1
          and all(p.counted for _, p in behind)):
        # one arrival rate (one trace and load), and every run long enough to show a steady
        # state or none: said once, each cell's completions after it
        done = ", ".join(f"{code(c.name)} {fmt_number(p.completed_per_s)}" for c, p in behind)
        grew = sorted(p.queue_growth_s or 0.0 for _, p in behind)
        waited = fmt_seconds(grew[0]) + (f" to {fmt_seconds(grew[-1])}" if len(grew) > 1
                                         else "")
        text = (verdict(f"{len(behind)} of {len(ok)} cells fell behind their arrivals",
                        one=False)
                + " Over the second half of the arrivals, "
                f"{fmt_number(behind[0][1].due_per_s, 'req/s')} were due while they "
                f"completed (req/s) {done}"
                + (f"; each too short to show a steady state, yet those arriving last waited "
                   f"{waited} longer for a first token than the first"
                   if behind[0][1].swamped else "")
                + ", their queues growing for the whole run. "
                + _pace_window([p for _, p in behind], plural=True))
    elif all(p.counted and p.swamped for _, p in behind):
        # every run too short to show a steady state, each with its own due rate: one figure
        # pair and one wait a cell, what they are said once
        each = "; ".join(f"{code(c.name)} {fmt_number(p.completed_per_s)} of "
                         f"{fmt_number(p.due_per_s)}, {fmt_seconds(p.queue_growth_s)}"
                         for c, p in behind)
        text = (verdict(f"{len(behind)} of {len(ok)} cells fell behind their arrivals",
                        one=False)
                + " Over the second half of the arrivals (requests/s completed of those due; "
                "how much longer those arriving last waited for a first token than the first, "
                f"each run too short to show a steady state): {each}. "
                + _pace_window([p for _, p in behind], plural=True))
    else:
        names = "; ".join(f"{code(c.name)} ({rates(p)})" for c, p in behind)
        # the rates' window, said for the cells whose rates were counted only
        rated = [p for _, p in behind if p.counted]
        over = " (over the second half of the arrivals)" if len(rated) == len(behind) else ""
        window = (f" {_pace_window(rated, plural=len(rated) > 1)}" if rated else "")
        text = (verdict(f"{len(behind)} of {len(ok)} cells fell behind their arrivals",
                        one=False)
                + f" Their queues grew for the whole run{over}: {names}.{window}")
    if near:
        names = "; ".join(f"{code(c.name)} ({rates(p, short=True)})" for c, p in near)
        text += (f" Short of its arrivals too, by more than {fmt_pct(PACE_TOLERANCE)} but by no "
                 f"more than chance explains: {names}.")
    return [text]


def _pace_unchecked(pace: Pace | None) -> bool:
    """A pace check that was made but could not tell: arrivals too short to show a steady
    state (``Pace.settled`` False), and no queue plainly growing over them (``Pace.swamped``):
    the run neither kept pace nor is said to have fallen behind."""
    return pace is not None and not pace.kept and not pace.overloaded


def _pace_unchecked_finding(ok: Sequence[CellResult]) -> list[str]:
    """The runs whose pace check (``_behind_finding``) could not tell whether they kept pace
    (``_pace_unchecked``), with why (``Pace.why``: their arrivals against their decode time)
    and what that leaves open, which their comparisons below carry: had one kept pace, its
    throughput is the load offered (a ratio to a cell that fell behind a lower bound); had it
    fallen behind, its waits are those of the trace's length. Neither is said of it."""
    unchecked = [(c, c.pace) for c in ok if _pace_unchecked(c.pace)]
    if not unchecked:
        return []

    def why(pace: Pace | None) -> str:
        # the check's words: "too short to show a steady state: its arrivals last 64.5 s, ..."
        return (pace.why if pace is not None and pace.why
                else "too short to show a steady state")

    def whose(c: CellResult, pace: Pace | None) -> str:
        """"`a`'s arrivals last 64.5 s, under 4 times its decode time p90 (18.1 s)"."""
        detail = why(pace).partition(": ")[2]
        return (f"{code(c.name)}'s {detail.removeprefix('its ')}" if detail.startswith("its ")
                else f"{code(c.name)} {why(pace)}")

    one = len(unchecked) == 1
    if one:
        c, pace = unchecked[0]
        who = "the engine" if len(ok) == 1 else code(c.name)
        head = (f"Whether {who} kept pace with its arrivals could not be checked, its run "
                f"being {why(pace)}.")
    else:
        head = (f"Whether {and_codes([c.name for c, _ in unchecked])} kept pace with their "
                "arrivals could not be checked, each run being too short to show a steady "
                "state: " + "; ".join(whose(c, p) for c, p in unchecked) + ".")
    behind = any(c.pace is not None and c.pace.overloaded for c in ok)
    ratio = (f", and a throughput ratio between {'it' if one else 'one'} and a cell that fell "
             "behind a lower bound on the difference in what they can serve" if behind else "")
    return [head + f" {'It' if one else 'Each'} may have served all the load offered to it, its "
            f"output throughput then that load's, not what it could serve{ratio}; or have "
            "fallen behind, its TTFT and E2E then those of this trace's length, not of a steady "
            f"state. The comparisons below that involve {'it' if one else 'them'} carry both "
            "cautions; a trace with more requests tells which holds."]


def _pace_unread_finding(ok: Sequence[CellResult]) -> list[str]:
    """The runs whose pace check (``_behind_finding``) could not be made, their
    requests.parquet being unreadable (``CellResult.pace_unread``): whether they fell behind
    their arrivals is said to be unknown, not left unsaid as if they kept pace."""
    out = []
    for c in ok:
        why = c.pace_unread
        if why is not None:
            who = "the engine" if len(ok) == 1 else code(c.name)
            out.append(f"Whether {who} kept pace with its arrivals (or fell behind them, its "
                       "queue growing for the whole run) could not be checked: its "
                       f"`requests.parquet` cannot be read ({short(why).rstrip('.')}).")
    return out


def _shortfall(ratio: float) -> str:
    """How far completions fell short of arrivals, from their ratio: "9.4%"."""
    return fmt_pct(1 - ratio)


def _pace_window(paces: Sequence[Pace], *, plural: bool) -> str:
    """Which window the pace check's completion rates are over, and why they are not the
    Throughput table's: a sentence. The window's length is said when every pace in
    ``paces`` knows it, and it is one length (``Pace.span_s``: half the arrivals' span)."""
    lengths = {fmt_seconds(p.span_s / 2) if p.span_s is not None else None for p in paces}
    length = next(iter(lengths)) if len(lengths) == 1 else None
    window = "from the arrivals' midpoint to the last arrival" + (f" ({length})" if length
                                                                  else "")
    these, rate = ("These", "rates") if plural else ("That", "rate")
    return (f"{these} completion {rate} count{'' if plural else 's'} the requests finished "
            f"{window}, not the Throughput table's whole-run requests/s; a request is due when "
            "it would have finished had it not queued (its arrival, plus the quickest wait any "
            "request had for a first token, plus its own decode time: docs/metrics.md).")


def _short_within_chance(pace: Pace) -> bool:
    """Short of its arrivals by more than ``PACE_TOLERANCE``, though by no more than chance
    explains: not set apart from the cells that fell behind, nor said to have served all the
    load offered."""
    return (bool(pace.settled) and not pace.fell_behind
            and pace.completed_per_s < (1 - PACE_TOLERANCE) * pace.due_per_s)


def _offered_load_finding(ok: Sequence[CellResult]) -> list[str]:
    """Cells that kept pace with their arrivals served the load offered to them: their output
    throughput is that load's, not what they could serve. Said when every cell kept pace
    (throughput then tells the engines apart in nothing), or when some kept pace while others
    fell behind (the ratios between them are lower bounds)."""
    paces = [(c, c.pace) for c in ok]
    if len(ok) < 2 or any(p is None for _, p in paces):
        return []
    kept = [c for c, p in paces if p is not None and p.kept and not _short_within_chance(p)]
    near = [(c, p) for c, p in paces if p is not None and _short_within_chance(p)]
    behind = [c for c, p in paces if p is not None and p.overloaded]
    capacity = "`batchlab capacity` finds the highest load each keeps pace with."
    if len(kept) == len(ok):
        return ["Every cell kept pace with its arrivals: each served the load offered to it, "
                "so their output throughputs are the offered load's, not what each could "
                "serve, and do not tell them apart; " + capacity]
    tolerance = fmt_pct(PACE_TOLERANCE)
    if len(kept) + len(near) == len(ok):
        every = len(near) == len(ok)
        who = "every one" if every else _near_text(near)
        return [f"No cell fell behind its arrivals, though {who} fell short of them by more "
                f"than {tolerance}, by no more than chance explains"
                f"{f' ({_near_text(near)})' if every else ''}: each served about the load "
                "offered to it, so their output throughputs are close to the offered load's, not "
                "what each could serve, and do not tell them apart; " + capacity]
    if kept and behind:  # those short within chance are named beside them (_behind_finding)
        names = ", ".join(code(c.name) for c in kept)
        return [f"{names} kept pace with {'its' if len(kept) == 1 else 'their'} arrivals, "
                "serving all the load offered: a throughput ratio between "
                f"{'it' if len(kept) == 1 else 'them'} and a cell that fell behind is a lower "
                "bound on the difference in what they can serve; " + capacity]
    return []


def _near_text(near: Sequence[tuple[CellResult, Pace]]) -> str:
    """The cells that fell short of their arrivals within chance, with how far: "`a` (5.6%)",
    "`a` (5.6%), `b` (6.1%)"."""
    return ", ".join(f"{code(c.name)} ({fmt_pct(1 - p.completed_per_s / p.due_per_s)})"
                     for c, p in near)


# the kind of figure (``harness.prediction.KINDS``) whose measured error a compared metric has
METRIC_KINDS = {"throughput.output_tokens_per_s": "throughput", "ttft_s.p90": "TTFT",
                "tpot_s.p90": "TPOT/ITL"}


@dataclass(frozen=True)
class _Margin:
    """How far apart figures of one kind (``KINDS``: throughput, TTFT, TPOT/ITL) must be to
    count as a difference: ``within``, the larger of ``SAME_WITHIN`` and the median |error|
    each predicted cell's record quotes for that kind (a profile's on held-out figures, the
    catalog's on every figure). ``unknown`` and ``unrecorded``: predicted cells whose error of
    that kind was never measured, or whose run recorded no prediction record; ``uncovered``:
    those whose error of that kind was measured only on figures of other models, GPUs or data
    types than theirs (the record's coverage: ``kind_coverage_note``, the notes under the
    tables): beside any of them a gap's meaning is not known. Between measurements alone:
    ``SAME_WITHIN``, as always."""

    kind: str
    within: float = SAME_WITHIN
    quoted: tuple[str, ...] = ()  # the cells whose error sets ``within`` (above SAME_WITHIN)
    unknown: tuple[str, ...] = ()
    unrecorded: tuple[str, ...] = ()
    uncovered: tuple[str, ...] = ()
    # of each ``uncovered`` cell, what none of its figures is or has (``coverage_outside``)
    outside: tuple[str | None, ...] = ()

    @classmethod
    def of(cls, cells: Iterable[CellResult], kind: str) -> _Margin:
        cells = list(cells)
        if _one_predictor(cells):  # what it gets wrong, it gets wrong for each of them
            return cls(kind)
        errors: dict[str, float] = {}
        unknown: list[str] = []
        unrecorded: list[str] = []
        uncovered: list[str] = []
        outside: list[str | None] = []
        for c in cells:
            found = recorded_prediction(c.manifest.get("engine"))
            if found is None or c.name in errors or c.name in unknown + unrecorded + uncovered:
                continue  # a measurement, or a cell already counted
            record = found[0]
            acc = accuracy(record) if record is not None else None
            e = acc.by_kind.get(kind) if acc is not None else None
            median = e.median if e is not None else None
            if record is None:
                unrecorded.append(c.name)
            elif median is None or missing(median):
                unknown.append(c.name)
            elif kind_coverage_note(record, kind):  # measured, but never on figures like its
                uncovered.append(c.name)
                outside.append(coverage_outside(record, kind))
            else:
                errors[c.name] = float(median)
        within = max([SAME_WITHIN, *errors.values()])
        quoted = tuple(n for n, v in errors.items() if v == within > SAME_WITHIN)
        return cls(kind, within, quoted, tuple(unknown), tuple(unrecorded), tuple(uncovered),
                   tuple(outside))

    @property
    def known(self) -> bool:
        """Every predicted cell's error of this kind is known, for its own model, GPU and data
        types (or none is predicted)."""
        return not self.unknown and not self.unrecorded and not self.uncovered

    def gap(self, ratio: float, same: bool) -> str:
        """What a gap between two figures (``ratio``, one over the other) is: "same" (``same``:
        within ``SAME_WITHIN`` as the caller writes it), "unknown" (beside a prediction whose
        error of this kind is not known), "within" (the predictions' known error) or
        "differs"."""
        if same:
            return "same"
        if not self.known:
            return "unknown"
        return "within" if abs(ratio - 1) <= self.within else "differs"

    def why(self, pair: int = 0) -> str:
        """Why a gap is not known to be a difference: "the TTFT error of `a` was never
        measured", "the TTFT error of `c` was never measured for its model, GPU and data
        types", "predicted TTFT of `b` misses by a median 14.0%" ("; "-joined, where several
        hold). ``pair``: the number of cells compared, when two, that the sentence names
        already: "... for either" when it is both of them."""
        parts = []
        either = pair == 2
        if self.unknown:
            parts.append(f"no {self.kind} error was ever measured for either"
                         if either and len(self.unknown) == 2 else
                         f"the {self.kind} error of {and_codes(self.unknown)} was never measured")
        if self.unrecorded:
            parts.append("no error is recorded in either run"
                         if either and len(self.unrecorded) == 2 else
                         f"no error is recorded in the run"
                         f"{'s' if len(self.unrecorded) > 1 else ''} of "
                         f"{and_codes(self.unrecorded)}")
        for i, (names, like) in enumerate(self._uncovered_groups()):
            if i == 0 and self.unknown:  # "the TTFT error of `a` was never measured, nor ..."
                parts[0] += f", nor that of {and_codes(names)} {like}"
            else:
                parts.append(f"the {self.kind} error of {and_codes(names)} was never measured "
                             f"{like}")
        if self.known and self.quoted:
            parts.append(f"predicted {self.kind} of {and_codes(self.quoted)} misses by a median "
                         f"{fmt_pct(self.within)}")
        return "; ".join(parts)

    def _uncovered_groups(self) -> list[tuple[list[str], str]]:
        """The ``uncovered`` cells by what their figures are not of: (cells, "on figures like
        its own (none of them is of this model llama-3.1-8b)"), in their order."""
        groups: dict[str | None, list[str]] = {}
        for name, outside in zip(self.uncovered, self.outside or [None] * len(self.uncovered),
                                 strict=True):
            groups.setdefault(outside, []).append(name)
        out = []
        for outside, names in groups.items():
            its = "their" if len(names) > 1 else "its"
            out.append((names, f"on figures like {its} own (none of them "
                                f"{outside or OUTSIDE_NOT_SAID})"))
        return out


MAX_ONE_KNOB_PAIRS = 3  # pairs of non-baseline cells a knob or two apart, compared directly
# knobs that change how much KV memory an engine has by design: a gap between cells apart only
# in these that comes through memory is the knobs' effect, not a confound of it
MEMORY_KNOBS = ("weights_dtype", "kv_cache_dtype", "gpu_memory_utilization",
                "tensor_parallel_size")


def _one_knob_findings(whole: Sequence[CellResult], base: CellResult | None) -> list[str]:
    """Two cells besides the baseline that differ in one knob, or in two that go together
    (the quickstart's `continuous` and `continuous-chunked`: chunked prefill, with its token
    budget): each is compared with the baseline, never with the other, though what that
    change does may be the question. The later cell against the earlier, at one load, on one
    engine and predictor; the pairs one knob apart, else those two apart, and only when there
    are a few (a sweep's neighbours are its own findings': ``_batch_size_findings``). Where
    their engine configurations differ in a setting besides the knobs too (the reference's
    admission follows its preemption: ``_other_settings``), the pair is said to be apart in
    that as well, not "only" in the knob."""
    cells = [c for c in whole if c is not base and c.knobs]
    if len({c.load for c in whole}) > 1:
        return []
    by_count: dict[int, list[tuple[CellResult, CellResult, list[str]]]] = {1: [], 2: []}
    for i, a in enumerate(cells):
        for b in cells[i + 1:]:
            if (a.engine, a.mode, predictor(a.manifest.get("engine"))) != \
                    (b.engine, b.mode, predictor(b.manifest.get("engine"))):
                continue
            differ = _differing_knobs(a, b)
            if len(differ) in by_count and "max_num_seqs" not in differ:
                by_count[len(differ)].append((a, b, differ))
    pairs = by_count[1] or by_count[2]
    if not pairs or len(pairs) > MAX_ONE_KNOB_PAIRS:
        return []
    out = []
    for a, b, differ in pairs:
        _, text = _comparison(b, a)
        if not text:
            continue
        apart = (f"{' and '.join(differ)} ({_knob_values(b, differ)} in {code(b.name)}, "
                 f"{_knob_values(a, differ)} in {code(a.name)})")
        settings = _other_settings(a, b)
        if not settings:
            out.append(f"Apart only in {apart}: {text}")
            continue
        # an engine setting besides the knobs differs too: the knob set it (reference
        # admission follows preemption), or the scenario set it
        derived = [k for k, set_by_knob in settings.items() if set_by_knob]
        given = [k for k, set_by_knob in settings.items() if not set_by_knob]
        said = ""
        if derived:
            said += (f", and with {'it' if len(differ) == 1 else 'them'} "
                     f"{_setting_values(a, b, derived)}")
        if given:
            said += f", and in {_setting_values(a, b, given)}"
        out.append(f"Apart in {apart}{said}: {text}")
    return out


# engine settings that are no knob and no difference of setting: what a run ran on, or said of
# KV memory by the comparison itself (``_comparison``: its KV cache's tokens)
_NOT_SETTINGS = frozenset({"model", "gpu", "tp", "cost_model", "cost_model_digest",
                           "num_gpu_blocks"})


def _other_settings(a: CellResult, b: CellResult) -> dict[str, bool]:
    """The engine settings besides the knobs in which ``a`` and ``b``'s resolved engine
    configurations (``engine_config``: the reference's) differ, each True when neither
    cell's scenario engine set it, so that a knob did (preemption "none" means reserve
    admission), False when the scenario did."""
    ca, cb = engine_config(a), engine_config(b)
    knobs = {*a.knobs, *b.knobs}
    out = {}
    for key in dict.fromkeys([*ca, *cb]):
        if key in knobs or key in _NOT_SETTINGS or value_text(ca.get(key)) == value_text(
                cb.get(key)):
            continue
        given = [c.cell.get("engine") for c in (a, b)]
        out[key] = not any(isinstance(e, Mapping) and e.get(key) is not None for e in given)
    return out


def _setting_values(a: CellResult, b: CellResult, keys: Sequence[str]) -> str:
    """"admission (reserve in `b`, optimistic in `a`)": engine settings ``keys`` as each
    cell's configuration (``engine_config``) has them, ``b`` first."""
    ca, cb = engine_config(a), engine_config(b)
    return (f"{' and '.join(keys)} ({' and '.join(value_text(cb.get(k)) for k in keys)} in "
            f"{code(b.name)}, {' and '.join(value_text(ca.get(k)) for k in keys)} in "
            f"{code(a.name)})")


def _differing_knobs(a: CellResult, b: CellResult) -> list[str]:
    """The knobs (as they took effect) whose values differ between ``a`` and ``b``, in the
    order they are named."""
    return [k for k in dict.fromkeys([*a.knobs, *b.knobs])
            if value_text(a.knobs.get(k)) != value_text(b.knobs.get(k))]


def _knob_values(c: CellResult, names: Sequence[str]) -> str:
    """"true and 2048": ``c``'s values of the knobs ``names``, as the scenario spells them."""
    return " and ".join(value_text(c.knobs.get(k)) for k in names)


def _one_predictor(cells: Sequence[CellResult]) -> bool:
    """Every cell is a prediction of the same model on the same GPU by the same predictor
    (profile or catalog, with the same coefficients; simulated, or served over HTTP): cells
    that differ in their settings only. Their gaps compare as measurements' do: the
    predictor's known error is of its absolute figures, and what it gets wrong it gets wrong
    for each of them; two predictors' errors need not be alike (``_Margin``)."""
    keys = set()
    for c in cells:
        found = recorded_prediction(c.manifest.get("engine"))
        if found is None:
            return False  # a measurement
        config = engine_config(c)
        keys.add((predictor(c.manifest.get("engine")), found[1],
                  *(value_text(config.get(k)) for k in ("model", "gpu", "cost_model_digest"))))
    return len(keys) == 1


def _change(ratio: float) -> str:
    """A gap as a signed whole percentage: "+8%"."""
    return f"{(ratio - 1) * 100:+.0f}%"


def _ratio(a: Any, b: Any) -> float | None:
    if missing(a) or missing(b) or b == 0 or a < 0 or b < 0:
        return None
    return float(a) / float(b)


def _log_score(*ratios: float | None) -> float:
    return max((abs(math.log(r)) for r in ratios if r is not None and r > 0), default=0.0)


def _throughput_phrase(c: CellResult, b: CellResult, margin: _Margin | None = None
                       ) -> tuple[str, float | None]:
    """How ``c``'s output throughput compares with ``b``'s, and their ratio. Beside a
    prediction, a gap within the predictions' known throughput error, or beside one whose
    error is not known, is said to be so, not "served 1.1×" (``margin``: the two cells'
    throughput ``_Margin``, made here when not given)."""
    cv = get(c.summary, "throughput.output_tokens_per_s")
    bv = get(b.summary, "throughput.output_tokens_per_s")
    r = _ratio(cv, bv)
    if r is None:
        return "", None
    margin = margin or _Margin.of((c, b), "throughput")
    gap = margin.gap(r, abs(r - 1) < SAME_WITHIN)
    if gap in ("unknown", "within"):
        c_text, b_text = fmt_pair(cv, bv, change=_change)
        if gap == "unknown":  # the figures and the change, neither more nor fewer said
            return (f"served {c_text} vs {b_text} tok/s against {code(b.name)} "
                    f"({_change(r)}; {margin.why(pair=2)})"), r
        return (f"served output tokens/s within the predictions' known error of "
                f"{code(b.name)}'s ({c_text} vs {b_text} tok/s, {_change(r)}; "
                f"{margin.why(pair=2)})"), r
    change = (fmt_ratio if r >= 1 + SAME_WITHIN else _fewer if r <= 1 - SAME_WITHIN
              else _within)
    c_text, b_text = fmt_pair(cv, bv, change=change)
    nums = f"{c_text} vs {b_text} tok/s"
    if r >= 1 + SAME_WITHIN:
        return f"served {fmt_ratio(r)} the output tokens/s of {code(b.name)} ({nums})", r
    if r <= 1 - SAME_WITHIN:
        return f"served {_fewer(r)} fewer output tokens/s than {code(b.name)} ({nums})", r
    return (f"served about the same output tokens/s as {code(b.name)} "
            f"({nums}{_within(r)})"), r


def _fewer(ratio: float) -> str:
    """How much less a ratio under 1 is, as a whole percentage: "7%"."""
    return f"{(1 - ratio) * 100:.0f}%"


def _within(ratio: float) -> str:
    """What "about the same" hides, when anything: ", -4.7%, within 5%"."""
    change = (ratio - 1) * 100
    if round(change, 1) == 0:
        return ""
    return f", {change:+.1f}%, within {SAME_WITHIN:.0%}"


def _latency_phrase(label: str, cv: Any, bv: Any, margin: _Margin | None = None
                    ) -> tuple[str, float | None]:
    """"TTFT p90 rose from 104 ms to 112 ms", "... about the same (...)", and the ratio.
    ``margin``: the figures' kind and the predictions' known error of it, when either is a
    prediction: a gap within that error, or beside a prediction whose error is not known,
    is said to be so rather than to have risen or fallen."""
    r = _ratio(cv, bv)
    if r is None:
        return "", None
    gap = margin.gap(r, abs(r - 1) < SAME_WITHIN) if margin is not None else ""
    if gap in ("unknown", "within"):
        assert margin is not None
        c_text, b_text = fmt_pair(cv, bv, fmt_seconds, change=_change)
        if gap == "unknown":  # the figures and the change, neither rose nor fell
            return f"{label} {c_text} vs {b_text} ({_change(r)}; {margin.why(pair=2)})", r
        return (f"{label} within the predictions' known error ({c_text} vs {b_text}, "
                f"{_change(r)}; {margin.why(pair=2)})"), r
    if abs(r - 1) < SAME_WITHIN:
        c_text, b_text = fmt_pair(cv, bv, fmt_seconds, change=_within)
        return f"{label} about the same ({c_text} vs {b_text}{_within(r)})", r
    verb = "fell" if r < 1 else "rose"
    c_text, b_text = fmt_pair(cv, bv, fmt_seconds)
    return f"{label} {verb} from {b_text} to {c_text}", r


def _attainment_phrase(c: CellResult, b: CellResult) -> str:
    cv = get(c.summary, "goodput.slo_attainment")
    bv = get(b.summary, "goodput.slo_attainment")
    if missing(cv) or missing(bv) or not same_slo(c, b) or not _attainments_differ(c, b):
        return ""  # under two SLOs, attainments differ for the SLOs' sake (slo_notes)
    verb = "rose" if cv > bv else "fell"
    return f"SLO attainment {verb} from {fmt_attainment(bv)} to {fmt_attainment(cv)}"


def _attainments_differ(c: CellResult, b: CellResult) -> bool:
    """Two cells' SLO attainments differ by more than chance: over two standard errors of the
    difference of two proportions (of their requests sent), and at least half a point. A few
    requests out of hundreds is not a finding."""
    cv, bv = get(c.summary, "goodput.slo_attainment"), get(b.summary, "goodput.slo_attainment")
    cn, bn = get(c.summary, "num_requests") or 0, get(b.summary, "num_requests") or 0
    if missing(cv) or missing(bv):
        return False
    if not cn or not bn:
        return bool(abs(cv - bv) >= 0.005)
    chance = 2 * math.sqrt(cv * (1 - cv) / cn + bv * (1 - bv) / bn)
    return bool(abs(cv - bv) >= max(0.005, chance))


def _capacity_finding(rows: Sequence[CapacityRow], base: CellResult | None,
                      slo: Mapping[str, float] | None, target: float, *,
                      predicted: Set[str] = frozenset(), num_unsearched: int = 0) -> str:
    """The answer to "how much load fits my SLO": each setting's capacity, with its ratio to
    the baseline setting's (the Capacity at SLO table says where each comes from), and how
    many of the search's settings have none (``num_unsearched``: not searched, or left out).
    ``predicted``: the settings whose capacity is a prediction, said of each (in a report that
    mixes predicted and measured cells, ``predicted_settings``)."""
    if not rows or not slo:
        return ""
    base_key = cell_setting(base) if base is not None else None
    b = next((r for r in rows if r.key == base_key), rows[0])
    parts = []
    for r in rows:
        notes = []
        if r.source != "search" and r.capacity is not None:
            notes.append("interpolated")
        if r.note and not r.answer:
            notes.append(r.note)
        if r.key in predicted:
            notes.append("predicted")
        if r.slo is not None and r.slo != slo:  # summarize --slo recomputed its cells' goodput
            notes.append(f"its goodput computed under {slo_text(r.slo)}")
        if len(rows) > 1:
            ratio = "baseline" if r is b else capacity_ratio(r, b)
            if r is not b and within_precision(r, b):
                notes.append("the same as the baseline within the searches' precision")
            elif ratio:
                notes.append(ratio if r is b else f"{ratio} the baseline")
        # no number: what the row says instead (no load meets the SLO, or the trace too short)
        text = code(r.key) + (f": {r.answer}" if r.answer else f" {capacity_text(r)}"
                              if r.capacity is not None else " not known")
        parts.append(text + (f" ({'; '.join(notes)})" if notes else ""))
    more = (f" {num_unsearched} more setting folder{'s' if num_unsearched > 1 else ''} here "
            f"{'have' if num_unsearched > 1 else 'has'} no capacity in this report (not "
            "searched, or left out: the Capacity at SLO section says why)."
            if num_unsearched else "")
    return (f"Capacity at SLO (the highest load with at least {fmt_pct(target)} of requests "
            f"within {slo_text(slo)}, the engine keeping up): "
            + "; ".join(parts) + "." + more)


def _comparison(c: CellResult, b: CellResult) -> tuple[float, str]:
    """A sentence comparing ``c`` with its baseline ``b``, and its score (the largest gap that
    may be a difference: one within the predictions' known error scores nothing)."""
    tp_margin, ttft_margin, tpot_margin = (_Margin.of((c, b), kind)
                                           for kind in METRIC_KINDS.values())
    tp, r_tp = _throughput_phrase(c, b, tp_margin)
    ttft, r_ttft = _latency_phrase("TTFT p90", get(c.summary, "ttft_s.p90"),
                                   get(b.summary, "ttft_s.p90"), ttft_margin)
    tpot, r_tpot = _latency_phrase("TPOT p90", get(c.summary, "tpot_s.p90"),
                                   get(b.summary, "tpot_s.p90"), tpot_margin)
    # a gap known to be within the predictions' error is no difference to rank by
    r_tp, r_ttft, r_tpot = (
        None if r is None or m.gap(r, abs(r - 1) < SAME_WITHIN) == "within" else r
        for r, m in ((r_tp, tp_margin), (r_ttft, ttft_margin), (r_tpot, tpot_margin)))
    slo = _attainment_phrase(c, b)
    parts = [p for p in (ttft, tpot, slo) if p]
    if tp:
        text = f"{code(c.name)} {tp}"
        if parts:
            text += "; " + "; ".join(parts)
    elif parts:
        text = f"{code(c.name)} against {code(b.name)}: " + "; ".join(parts)
    else:
        return 0.0, ""
    kv_c, kv_b = _kv_tokens(c), _kv_tokens(b)
    if kv_c and kv_b and not 0.5 <= kv_c / kv_b <= 2:  # a memory difference, not a policy's
        held = (f"its KV cache holds {fmt_ratio(kv_c / kv_b)} the tokens of {code(b.name)}'s, "
                f"{fmt_int(kv_c)} against {fmt_int(kv_b)}")
        differ = _differing_knobs(c, b)
        if differ and set(differ) <= set(MEMORY_KNOBS):
            # memory is what was varied: the difference coming through it is no confound
            text += (f" ({held}: {' and '.join(differ)} "
                     f"{'change' if len(differ) > 1 else 'changes'} KV memory by design, and "
                     "part of the difference may come through it)")
        else:
            text += f" ({held}: part of the difference may be memory, not scheduling)"
    predicted = [x for x in (c, b) if is_prediction(x.manifest)]
    if len(predicted) == 1:  # a prediction against a measurement: not an engine difference
        text += (f" ({code(predicted[0].name)} is predicted, the other measured: the difference "
                 "includes the prediction's error)")
    text += _predictors_caveat(c, b)
    return _log_score(r_tp, r_ttft, r_tpot), text + "."


@dataclass(frozen=True)
class _Coefficients:
    """Whose cost-model coefficients a predicted cell's timings come from: the catalog's, or a
    profile's. A profile with no training figures of its own engine and GPU borrows another's
    (its record's ``accuracy.coefficients_from``): then ``profile`` is the one they come from
    and ``borrower`` the cell's own. Two cells with the same ``profile`` share the predictor's
    error; two with different ones each carry their own."""

    profile: str | None  # None: the catalog's datasheet coefficients
    borrower: str | None = None

    def whose(self) -> str:
        """"the catalog's", "profile `x`'s"."""
        return "the catalog's" if self.profile is None else f"profile {code(self.profile)}'s"


def _coefficients(c: CellResult) -> _Coefficients | None:
    """Whose coefficients predicted ``c`` (``harness.prediction.recorded_prediction``); None
    for a measurement, or a simulated run that recorded no prediction record (not known)."""
    found = recorded_prediction(c.manifest.get("engine"))
    if found is None or found[0] is None:
        return None
    record = found[0]
    if not record.get("profile"):
        return _Coefficients(None)
    own = str(record["profile"])
    acc = record.get("accuracy")
    donor = acc.get("coefficients_from") if isinstance(acc, Mapping) else None
    return _Coefficients(str(donor), own) if donor and donor != own else _Coefficients(own)


def _borrowers(coefficients: Iterable[_Coefficients]) -> str:
    """"profile `t` borrows", "profiles `t` and `u` borrow": the profiles among
    ``coefficients`` that borrow another's coefficients, or ''."""
    names = sorted({x.borrower for x in coefficients if x.borrower})
    if not names:
        return ""
    many = len(names) > 1
    return f"profile{'s' if many else ''} {' and '.join(map(code, names))} " \
           f"borrow{'' if many else 's'}"


def _predicted_with(x: _Coefficients) -> str:
    """"profile `t` and the coefficients it borrows from `v`", "profile `v`'s coefficients",
    "the catalog's coefficients": what a cell is predicted with."""
    if x.borrower:
        return (f"profile {code(x.borrower)} and the coefficients it borrows from "
                f"{code(x.profile)}")
    return f"{x.whose()} coefficients"


def _predictors_caveat(c: CellResult, b: CellResult) -> str:
    """What the difference between two predicted cells is made of, when their predictors
    differ: with other coefficients, it includes each predictor's own error; with the same
    coefficients under two profiles (one borrowing the other's), it is that of their settings
    alone. '' for two cells predicted alike, or when either is measured or not known; and for
    two with the same coefficients and the same results, which ``_same_results_finding``
    says of them."""
    cc, bc = _coefficients(c), _coefficients(b)
    if cc is None or bc is None or cc == bc:
        return ""
    if cc.profile != bc.profile:
        return (f" ({code(c.name)} is predicted with {_predicted_with(cc)}, {code(b.name)} "
                f"with {_predicted_with(bc)}: the difference includes the two predictors' own "
                "errors)")
    if _headline(c) == _headline(b):
        return ""  # no difference to explain: ``_same_results_finding`` says they share them
    return (f" ({code(c.name)} and {code(b.name)} are predicted with the same coefficients, "
            f"{cc.whose()}, which {_borrowers([cc, bc])}: the difference is that of "
            "their settings alone, not of the engines' own step costs)")


def _predictors_note(cells: Sequence[CellResult]) -> str:
    """Beside a ranking of ``cells``: which coefficients predicted which cells, when the
    predicted ones among them come from more than one predictor (their differences then
    include the predictors' own errors); '' otherwise."""
    groups: dict[str | None, list[tuple[CellResult, _Coefficients]]] = {}
    for c in cells:
        found = _coefficients(c)
        if found is not None:
            groups.setdefault(found.profile, []).append((c, found))
    if len(groups) < 2:
        return ""
    parts = []
    for members in groups.values():
        names = [code(c.name) for c, _ in members]
        who = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        borrowers = _borrowers(x for _, x in members)
        parts.append(f"{who} {members[0][1].whose()}"
                     + (f", which {borrowers}" if borrowers else ""))
    whose = ("Their figures are" if sum(map(len, groups.values())) == len(cells)
             else "The predicted ones among them are")
    return (f" {whose} predicted with different coefficients (" + "; ".join(parts)
            + "): the differences between them include the predictors' own errors.")


def _kv_tokens(c: CellResult) -> int | None:
    """The tokens a simulated cell's KV cache holds (blocks × block size), from its manifest;
    None when not known (a live engine)."""
    engine = c.manifest.get("engine")
    if not isinstance(engine, Mapping) or not isinstance(engine.get("config"), Mapping):
        return None
    blocks, size = engine.get("num_kv_blocks_total"), engine["config"].get("block_size")
    if isinstance(blocks, int) and isinstance(size, int) and blocks > 0:
        return blocks * size
    return None


_HEADLINE = ("num_completed", "throughput.output_tokens_per_s", "ttft_s.p50", "ttft_s.p90",
             "tpot_s.p50", "tpot_s.p90", "e2e_s.p90", "num_preemptions")


def _headline(c: CellResult) -> tuple[Any, ...]:
    """``c``'s headline figures (``_HEADLINE``), None where one is missing."""
    return tuple(get(c.summary, m) for m in _HEADLINE)


def _same_results_groups(ok: Sequence[CellResult]) -> list[list[CellResult]]:
    """The cells whose every headline figure is the same as another's, by load, in their
    order; two or more a group."""
    groups: dict[tuple[Any, ...], list[CellResult]] = {}
    for c in ok:
        key = _headline(c)
        if all(v is not None for v in key):
            groups.setdefault((c.load, *key), []).append(c)
    return [g for g in groups.values() if len(g) > 1]


def _same_results_finding(ok: Sequence[CellResult],
                          compared: Mapping[str, tuple[str, str] | None] | None = None
                          ) -> list[str]:
    """Cells whose every headline figure is the same: their differences in settings made no
    difference on this trace (say so, rather than let two columns look like two answers).
    Cells predicted under two profiles with the same coefficients (one borrowing the other's)
    are said to share them: their latencies come from one cost model, so only their scheduler
    settings could have told them apart. ``compared``: the cells whose comparison with their
    baseline was left out as the first one's of their group ({cell: (first, baseline)}; None
    when the first is that baseline): said to hold for them."""
    out = []
    for cells in _same_results_groups(ok):
        names = [code(c.name) for c in cells]
        head = (f"{', '.join(names[:-1])} and {names[-1]} gave the same results (completions, "
                "throughput, TTFT, TPOT, E2E and preemptions)")
        held = [(c.name, said) for c in cells
                if (said := (compared or {}).get(c.name)) is not None]
        if held:
            first, base = held[0][1]
            head += (f", so the comparison of {code(first)} with {code(base)} above holds for "
                     f"{and_codes([name for name, _ in held])} too")
        coefficients = [_coefficients(c) for c in cells]
        known = [x for x in coefficients if x is not None]
        if (len(known) == len(cells) and len({x.profile for x in known}) == 1
                and any(x.borrower for x in known)):
            out.append(f"{head}: their latencies come from the same coefficients, "
                       f"{known[0].whose()} ({_borrowers(known)} them), so only their "
                       "scheduler settings differ, and on this trace those made no difference.")
        else:
            out.append(f"{head}: on this trace, the settings in which they differ made no "
                       "difference.")
    return out


def _prefix_cache_finding(ok: Sequence[CellResult]) -> list[str]:
    """How much prefill the prefix cache skipped, split as the cache was hit: prompts shared
    with earlier requests (at admission), and the blocks of preempted requests found again
    when they were re-admitted (the cache keeps freed blocks until evicted)."""
    parts = []
    for c in ok:
        pc = get(c.summary, "prefix_cache")
        with_ids = pc.get("num_requests_with_prefix_ids") if isinstance(pc, Mapping) else 0
        if (not isinstance(pc, Mapping) or not pc.get("queries_tokens") or with_ids == 0
                or (with_ids is None and not pc.get("hits_tokens"))):
            # nothing looked up, or a trace without prefixes (the section says so); not
            # recorded (a summary from before the count was): only hits are worth a word
            continue
        text = (f"{code(c.name)} {fmt_int(pc.get('hits_tokens'))} prompt tokens at admission "
                f"({fmt_pct(pc.get('hit_rate'))} of those looked up)")
        again = pc.get("preempted_hits_tokens")
        if again:
            text += (f" and {fmt_int(again)} re-admitting preempted requests "
                     f"({fmt_pct(pc.get('preempted_hit_rate'))})")
        parts.append(text)
    if not parts:
        return []
    return ["Prefill the prefix cache skipped: " + "; ".join(parts) + ". A hit on "
            "re-admission is a preempted request's own KV, kept rather than computed again: "
            "it helps only where requests are preempted."]


def _leaders_by_load(ok: Sequence[CellResult]) -> list[str]:
    """The leaders among three or more cells, at each load on its own: across loads, the
    lowest load would always have the lowest latency and the highest the most tokens/s."""
    by_load: dict[str, list[CellResult]] = {}
    for c in ok:
        by_load.setdefault(c.load, []).append(c)
    out = []
    for load, group in by_load.items():
        if len(group) >= 3:
            leaders = _leaders(group)
            if leaders:
                where = "Across all cells" if len(by_load) == 1 else f"At {load}"
                out.append(f"{where}: {leaders}.{_predictors_note(group)}")
    return out


def _leaders(cells: Sequence[CellResult]) -> str:
    """The best cell for each headline metric, in one clause ("" if none has a value). A cell
    within ``SAME_WITHIN`` of the best is named beside it; where a prediction is among the
    figures, one further from the best than that but within the predictions' known error of
    that kind, or beside a prediction whose error of that kind is not known, leaves no leader
    crowned: the clause names those not told apart, with why (``_Margin``)."""
    def best(metric: str, pick: Callable[[Iterable[float]], float], what: str,
             write: Callable[[float, int], str]) -> str | None:
        def fmt(value: float) -> str:
            return write(value, 3)

        values = [(c, get(c.summary, metric)) for c in cells]
        values = [(c, v) for c, v in values if not missing(v)]
        if not values:
            return None
        target = pick(v for _, v in values)
        top = next(c for c, v in values if v == target)
        # a tie, or a lead within what the report calls "about the same" (attainment: within
        # chance), names every cell in it
        names = [c.name for c, v in values if (
            not _attainments_differ(c, top) if metric == "goodput.slo_attainment"
            else abs(v - target) <= SAME_WITHIN * abs(target))]
        if len(names) == len(cells) > 1:
            if all(v == target for _, v in values):
                return f"the same {what.split(' ', 1)[1]} in every cell ({fmt(target)})"
            low, high = fmt_pair(min(v for _, v in values), max(v for _, v in values), write)
            return f"about the same {what.split(' ', 1)[1]} in every cell ({low} to {high})"
        kind = METRIC_KINDS.get(metric)
        # beside a prediction: the cells the best is not told apart from, beyond SAME_WITHIN
        # (within the predictions' known error, or beside an error never measured)
        apart = [] if kind is None else [
            c for c, v in values if c.name not in names
            and _Margin.of((c, top), kind).gap(v / target if target else math.inf,
                                                False) in ("unknown", "within")]
        if apart and kind is not None:
            near = [c for c, v in values if c.name in names or c in apart]
            low, high = fmt_pair(min(get(c.summary, metric) for c in near),
                                 max(get(c.summary, metric) for c in near), write)
            among = ("in every cell" if len(near) == len(cells)
                     else f"among {and_codes([c.name for c in near])}")
            error = _Margin.of(near, kind)
            within = "" if not error.known else "within the predictions' known error: "
            return f"{what} not told apart ({low} to {high} {among}; {within}{error.why()})"
        tied = [n for n in names if n != top.name and get(
            next(c for c in cells if c.name == n).summary, metric) == target]
        close = [n for n in names if n != top.name and n not in tied]
        text = f"{what} {', '.join(map(code, [top.name, *tied]))} ({fmt(target)})"
        if close:  # the leader first, with its figure; those as good within the margin after
            margin = "chance" if metric == "goodput.slo_attainment" else f"{SAME_WITHIN:.0%}"
            text += f", with {', '.join(map(code, close))} within {margin} of it"
        return text

    parts = [best("throughput.output_tokens_per_s", max, "highest output throughput",
                  lambda v, digits: fmt_number(v, "tok/s", digits)),
             best("ttft_s.p90", min, "lowest TTFT p90", fmt_seconds),
             best("tpot_s.p90", min, "lowest TPOT p90", fmt_seconds),
             # an attainment is cut, never rounded (``fmt_attainment``): one way to write it
             best("goodput.slo_attainment", max, "best SLO attainment",
                  lambda v, _: fmt_attainment(v))
             if one_slo(cells) else None]
    return "; ".join(p for p in parts if p)


def _batch_size_findings(cells: Sequence[CellResult], slo: Mapping[str, float] | None
                         ) -> list[str]:
    sweep = sweep_cells(cells)
    if len(sweep) < 3:
        return []
    varying = varying_knobs(sweep)
    if set(varying) - {"max_num_seqs"}:
        return []  # more than one dimension: the tables and plot say it better
    if len({c.load for c in sweep}) > 1:
        return []  # several loads: ``tuning_findings`` compares caps at each load
    pts = sorted(sweep, key=lambda c: int(knob(c, "max_num_seqs")))
    lo, hi = pts[0], pts[-1]
    out = []
    r = _ratio(get(hi.summary, "throughput.output_tokens_per_s"),
               get(lo.summary, "throughput.output_tokens_per_s"))
    tpot_lo, tpot_hi = get(lo.summary, "tpot_s.p90"), get(hi.summary, "tpot_s.p90")
    if r is not None:
        def change(ratio: float) -> str:
            return (f"rose {fmt_ratio(ratio)}" if ratio >= 1 + SAME_WITHIN else
                    f"fell {_fewer(ratio)}" if ratio <= 1 - SAME_WITHIN
                    else "stayed about the same")

        hi_text, lo_text = fmt_pair(get(hi.summary, "throughput.output_tokens_per_s"),
                                    get(lo.summary, "throughput.output_tokens_per_s"),
                                    change=change)
        tpot_hi_text, tpot_lo_text = (fmt_pair(tpot_hi, tpot_lo, fmt_seconds)
                                      if not missing(tpot_hi) and not missing(tpot_lo)
                                      else (fmt_seconds(tpot_hi), fmt_seconds(tpot_lo)))
        out.append(
            f"From max_num_seqs {knob(lo, 'max_num_seqs')} to {knob(hi, 'max_num_seqs')}, "
            f"output throughput {change(r)} ({lo_text} to {hi_text} tok/s) while "
            f"TPOT p90 went from {tpot_lo_text} to {tpot_hi_text}."
        )
    tpot_slo = (slo or {}).get("tpot_s")
    if tpot_slo:
        meeting = [c for c in pts if not missing(get(c.summary, "tpot_s.p90"))
                   and get(c.summary, "tpot_s.p90") <= tpot_slo]
        if meeting:
            best = max(meeting, key=lambda c: int(knob(c, "max_num_seqs")))
            out.append(
                f"The largest max_num_seqs whose {_predicted(best)}TPOT p90 meets the "
                f"{fmt_seconds(tpot_slo)} TPOT SLO is {knob(best, 'max_num_seqs')}"
                f"{_of_those_tried(pts, best)} ({code(best.name)}: TPOT p90 "
                f"{fmt_seconds(get(best.summary, 'tpot_s.p90'))}, "
                f"{fmt_number(get(best.summary, 'throughput.output_tokens_per_s'), 'tok/s')}"
                f"{margin_caveat(best, get(best.summary, 'tpot_s.p90'), tpot_slo, 'TPOT/ITL')})"
                f"{_next_tried(pts, best, tpot_slo)}{_clear_of_error(meeting, best, tpot_slo)}."
            )
        else:
            out.append(f"No max_num_seqs tried kept TPOT p90 within the "
                       f"{fmt_seconds(tpot_slo)} TPOT SLO{_closest(pts, tpot_slo)}.")
    return out


def _priority_findings(cells: Sequence[CellResult], bases: Baselines, ctx: ReportContext,
                       *, first: Collection[str] = ()) -> list[str]:
    """What each priority class got in a cell against its baseline, the largest differences
    first; comparisons of a cell of another scheduling policy before others, and of the cells
    named ``first`` (a capacity search's probes at its capacity) before all."""
    scored = []
    for c in cells:
        base = bases.of_cell(c)
        if base is None or base is c or base.partial:
            continue
        base_classes = get(base.summary, "by_priority") or {}
        if len(base_classes) < 2:
            continue
        classes = get(c.summary, "by_priority") or {}
        phrases, ratios = [], []
        for key in sorted(base_classes, key=priority_sort_key):
            if key not in classes:
                continue
            parts = []
            tpot_ratio = None
            for metric, label in (("ttft_s.p90", "TTFT p90"), ("tpot_s.p90", "TPOT p90"),
                                  ("itl_s.p99", "ITL p99")):
                phrase, r = _latency_phrase(label, get(classes[key], metric),
                                            get(base_classes[key], metric))
                if metric == "tpot_s.p90":
                    tpot_ratio = r
                elif metric == "itl_s.p99" and r is not None and tpot_ratio is not None \
                        and _log_score(r / tpot_ratio) < math.log(ITL_APART):
                    continue  # the tail moved with TPOT: nothing more to say
                if phrase and (metric == "ttft_s.p90" or "about the same" not in phrase):
                    parts.append(phrase)
                    ratios.append(r)
                    if metric == "itl_s.p99":
                        parts += _worst_gap_phrase(classes[key], base_classes[key], r)
            if parts:
                phrases.append(f"class {class_name(ctx, key)} " + ", ".join(parts))
        if phrases:
            # A cell with another scheduling policy is what a per-class comparison is for.
            other_policy = knob(c, "policy") != knob(base, "policy")
            at_first = c.name in first or base.name in first
            scored.append(((at_first, other_policy), _log_score(*ratios), f"Under "
                           f"{code(c.name)} rather than {code(base.name)}: "
                           + "; ".join(phrases) + "."))
    scored.sort(key=lambda s: (not s[0][0], not s[0][1], -s[1]))
    return [text for _, score, text in scored[:MAX_PRIORITY_FINDINGS] if score > 0]


def _worst_gap_phrase(cls: Mapping[str, Any], base_cls: Mapping[str, Any],
                      p99_ratio: float | None) -> list[str]:
    """A class's worst token gap, when it moved against its ITL p99 (a stall of a few steps
    in a thousand, which p99 cannot see: whole-prompt prefills against chunked ones)."""
    phrase, r = _latency_phrase("its worst token gap", get(cls, "itl_s.max"),
                                get(base_cls, "itl_s.max"))
    if (not phrase or r is None or p99_ratio is None or (r < 1) == (p99_ratio < 1)
            or abs(math.log(r)) < math.log(ITL_APART)):
        return []
    return [phrase]


def _preemption_count(c: CellResult) -> str:
    """"12 preemptions", or "preemptions not known" (a live run whose engine exported no
    count: ``preemptions``)."""
    n = preemptions(c)
    return "preemptions not known" if n is None else f"{fmt_int(n)} preemptions"


def _preemption_finding(cells: Sequence[CellResult], counts: Mapping[str, int | None]) -> str:
    if not any((preemptions(c) or 0) > 0 for c in cells):
        return ""
    parts = []
    for c in cells:
        n = preemptions(c)
        if n is None:  # a live run whose engine exported no count
            parts.append(f"{code(c.name)} not known")
            continue
        text = f"{code(c.name)} {n:,}"
        preempted = counts.get(c.name)
        if n and preempted is not None:
            text += f" ({preempted:,} requests)"
        parts.append(text)
    return "Preemptions: " + ", ".join(parts) + "."



# ---------------------------------------------------------------- tuning advice, computed


def tuning_findings(cells: Sequence[CellResult], slo: Mapping[str, float] | None, *,
                    latency_stated: bool = False) -> list[str]:
    """The seed's three tuning guidelines, as sentences with this run's numbers, each naming
    the cells it comes from: latency-sensitive (the largest cap whose TPOT p90 meets the SLO;
    ``latency_stated`` when the batch-size findings already said it), throughput-first (the
    cap from which KV memory, not the cap, bounds the batch) and mixed traffic (the
    max_num_seqs / max_num_batched_tokens pair with the best goodput)."""
    out: list[str] = []
    sweep = sweep_cells(cells)
    groups: dict[str, list[CellResult]] = {}
    varying = varying_knobs(sweep)
    for c in sweep:
        groups.setdefault(series_key(c, varying), []).append(c)
    tpot_slo = (slo or {}).get("tpot_s")
    for name, group in groups.items():
        if len({knob(c, "max_num_seqs") for c in group}) < MIN_SWEEP_CAPS:
            continue
        series = f" ({name})" if len(groups) > 1 else ""
        if tpot_slo and not latency_stated:
            out.append(_latency_sensitive(group, tpot_slo, series))
        text = _throughput_first(group, series)
        if text:
            out.append(text)
    out += _mixed_finding(cells, slo)
    return out


def _closest(cells: Sequence[CellResult], tpot_slo: float) -> str:
    """Which cell came closest to a TPOT SLO none met, with its TPOT p90 written so that it
    does not read as the SLO itself ('' when no cell has one)."""
    known = [c for c in cells if not missing(get(c.summary, "tpot_s.p90"))]
    if not known:
        return ""
    best = min(known, key=lambda c: float(get(c.summary, "tpot_s.p90")))
    tpot = float(get(best.summary, "tpot_s.p90"))
    return (f" (the closest: {code(best.name)}, max_num_seqs {knob(best, 'max_num_seqs')}, "
            f"at {fmt_seconds_against(tpot, tpot_slo)})")


def _latency_sensitive(group: Sequence[CellResult], tpot_slo: float, where: str) -> str:
    meeting = [c for c in group if not missing(get(c.summary, "tpot_s.p90"))
               and get(c.summary, "tpot_s.p90") <= tpot_slo]
    if not meeting:
        return (f"Latency-sensitive{where}: no max_num_seqs tried kept TPOT p90 within the "
                f"{fmt_seconds(tpot_slo)} TPOT SLO{_closest(group, tpot_slo)}.")
    best = max(meeting, key=lambda c: int(knob(c, "max_num_seqs")))
    tpot = get(best.summary, "tpot_s.p90")
    return (f"Latency-sensitive{where}: the largest max_num_seqs whose {_predicted(best)}TPOT "
            f"p90 meets the {fmt_seconds(tpot_slo)} TPOT SLO is {knob(best, 'max_num_seqs')}"
            f"{_of_those_tried(group, best)} ({code(best.name)}: TPOT p90 {fmt_seconds(tpot)}"
            f"{margin_caveat(best, tpot, tpot_slo, 'TPOT/ITL')})"
            f"{_next_tried(group, best, tpot_slo)}{_clear_of_error(meeting, best, tpot_slo)}.")


def _predicted(c: CellResult) -> str:
    """"predicted " before a figure of a predicted cell, said where a finding's verdict rests on
    it ("whose predicted TPOT p90 meets the SLO"): a caveat after it that hardware may miss
    the limit then qualifies the prediction, not the verdict."""
    return "predicted " if is_prediction(c.manifest) else ""


def _clear_of_error(meeting: Sequence[CellResult], best: CellResult, tpot_slo: float) -> str:
    """When ``best`` meets a TPOT SLO by less than its prediction's measured error, the largest
    cap that meets it by more ("; `x` (max_num_seqs 16: TPOT p90 9.02 ms, 1,850 tok/s) is the
    largest within it by more than that error"), or that none is; '' otherwise."""
    error = short_of_error(best, get(best.summary, "tpot_s.p90"), tpot_slo, "TPOT/ITL")
    if error is None:
        return ""  # measured, clear of the error, or an error not known: nothing to weigh
    by = f"the {fmt_pct(error.median)} median error"
    clear = [c for c in meeting if c is not best and not margin_caveat(
        c, get(c.summary, "tpot_s.p90"), tpot_slo, "TPOT/ITL")]
    if not clear:
        return f"; no max_num_seqs tried meets it by more than {by}"
    safe = max(clear, key=lambda c: int(knob(c, "max_num_seqs")))
    return (f"; {code(safe.name)} (max_num_seqs {knob(safe, 'max_num_seqs')}: TPOT p90 "
            f"{fmt_seconds(get(safe.summary, 'tpot_s.p90'))}, "
            f"{fmt_number(get(safe.summary, 'throughput.output_tokens_per_s'), 'tok/s')}) is "
            f"the largest that meets it by more than {by}")


def _above(cells: Sequence[CellResult], best: CellResult) -> CellResult | None:
    """The cell with the next max_num_seqs tried above ``best``'s, None when it is the
    largest."""
    larger = [c for c in cells if int(knob(c, "max_num_seqs")) > int(knob(best, "max_num_seqs"))]
    return min(larger, key=lambda c: int(knob(c, "max_num_seqs"))) if larger else None


def _of_those_tried(cells: Sequence[CellResult], best: CellResult) -> str:
    """After the largest cap that meets a TPOT SLO: " of those tried", or ", the largest
    tried": only the caps a sweep tried are known to meet it or not."""
    return " of those tried" if _above(cells, best) is not None else ", the largest tried"


def _next_tried(cells: Sequence[CellResult], best: CellResult, tpot_slo: float) -> str:
    """After the largest cap ``best`` that meets a TPOT SLO: the next cap tried, which does
    not, and that one between them, never tried, may ('' when ``best`` is the largest)."""
    above = _above(cells, best)
    if above is None:
        return ""
    tpot = get(above.summary, "tpot_s.p90")
    misses = ("has no TPOT p90" if missing(tpot)
              else f"misses it (TPOT p90 {fmt_seconds_against(float(tpot), tpot_slo)})")
    between = (": a cap between them, never tried, may meet it"
               if int(knob(above, "max_num_seqs")) > int(knob(best, "max_num_seqs")) + 1 else "")
    return (f"; {knob(above, 'max_num_seqs')}, the next tried ({code(above.name)}), "
            f"{misses}{between}")


def _throughput_first(group: Sequence[CellResult], where: str) -> str:
    rows = batch_rows(group)
    if all(r.use is None for r in rows):
        return ""
    first_kv = next((i for i, r in enumerate(rows) if r.limit == "kv"), None)
    if first_kv is None:
        top = rows[-1]
        peak = "–" if top.use is None else fmt_pct(top.use.kv_peak)
        bound = {"cap": "the cap did", "load": "the load did (too few requests to fill it)",
                 "budget": "the per-step token budget did (requests waited with room in the "
                           "batch: max_num_batched_tokens admits prefills only so fast)"}
        return (f"Throughput-first{where}: KV memory never bounded the running batch up to "
                f"max_num_seqs {top.cap} ({code(top.cell.name)}: KV use peaked at {peak}, "
                f"{_preemption_count(top.cell)}); "
                f"{bound.get(top.limit, 'nothing measured did')}.")
    r = rows[first_kv]
    use = r.use
    assert use is not None
    reached = use.running_peak is not None and use.running_peak >= r.cap
    # a batch that touched the cap at its peak was bounded by both, at different times
    evidence = [f"its running batch reached the cap ({r.cap}) at its peak" if reached
                else f"its running batch peaked at {use.running_peak:.0f} of {r.cap}"]
    if use.kv_peak is not None:
        evidence.append(f"KV use reached {fmt_pct(use.kv_peak)}")
    n_pre = preemptions(r.cell) or 0
    if n_pre:
        evidence.append(f"{n_pre:,} preemptions")
    limit = (" bounds the running batch as well as the cap" if reached
             else ", not the cap, is the limit")
    text = (f"Throughput-first{where}: from max_num_seqs {r.cap} ({code(r.cell.name)}) KV "
            f"memory{limit}: " + ", ".join(evidence))
    below = [x for x in rows[:first_kv] if x.limit == "cap"]
    if below:
        b = below[-1]
        below_tp = get(b.cell.summary, "throughput.output_tokens_per_s")
        at_tp = get(r.cell.summary, "throughput.output_tokens_per_s")
        below_text, at_text = (fmt_pair(below_tp, at_tp)
                               if not missing(below_tp) and not missing(at_tp)
                               else (fmt_number(below_tp), fmt_number(at_tp)))
        text += (f"; below it, max_num_seqs {b.cap} ({code(b.cell.name)}) is the largest cap "
                 f"that alone bounds the running batch, KV memory never doing so "
                 f"({below_text} against {at_text} tok/s)")
    return text + "."


def _mixed_finding(cells: Sequence[CellResult], slo: Mapping[str, float] | None) -> list[str]:
    """The max_num_seqs / max_num_batched_tokens pair with the best goodput, at each load where
    both knobs, and nothing else, were varied. Goodput is ranked only among cells computed
    under one SLO (``_under_one_slo``): the others are named as left out."""
    by_load: dict[str, list[CellResult]] = {}
    for c in cells:
        if (isinstance(knob(c, "max_num_seqs"), int)
                and isinstance(knob(c, "max_num_batched_tokens"), int)
                and not missing(get(c.summary, "goodput.requests_per_s"))):
            by_load.setdefault(c.load, []).append(c)
    out = []
    for load, group in by_load.items():
        varied = set(varying_knobs(group))
        if varied != {"max_num_seqs", "max_num_batched_tokens"}:
            continue  # a pair only when both knobs, and nothing else, were varied
        kept, left_out = _under_one_slo(group, slo)
        if len(kept) < 2:
            continue  # nothing to rank under one SLO (slo_notes says which SLO is whose)
        ranked = sorted(kept, key=lambda c: -get(c.summary, "goodput.requests_per_s"))
        best, second = ranked[0], ranked[1]

        def pair(c: CellResult) -> str:
            return (f"{knob(c, 'max_num_seqs')} / {knob(c, 'max_num_batched_tokens'):,} "
                    f"({code(c.name)}: {fmt_number(get(c.summary, 'goodput.requests_per_s'))} "
                    f"good req/s, {fmt_attainment(get(c.summary, 'goodput.slo_attainment'))} "
                    "within SLO)")

        at = f" at {load}" if len(by_load) > 1 else ""
        kept_slo = get(kept[0].summary, "slo")
        under = f" under {slo_text(kept_slo)}" if left_out and kept_slo else ""
        text = (f"Mixed traffic{at}: the max_num_seqs / max_num_batched_tokens pair with the "
                f"best goodput{under} is {pair(best)}; next best {pair(second)}.")
        if left_out:
            names = ", ".join(f"{code(c.name)} ({_slo_of(c)})" for c in left_out)
            text += (f" Left out, {'their' if len(left_out) > 1 else 'its'} goodput computed "
                     f"under another SLO: {names}; `batchlab summarize DIR --slo ...` "
                     f"recomputes {'each' if len(left_out) > 1 else 'it'}.")
        out.append(text)
    return out[:2]


def _slo_of(c: CellResult) -> str:
    slo = get(c.summary, "slo")
    return slo_text(slo) if slo else "no SLO recorded"


def _under_one_slo(cells: Sequence[CellResult], slo: Mapping[str, float] | None
                   ) -> tuple[list[CellResult], list[CellResult]]:
    """The cells whose goodput was computed under one SLO, and the others: goodput under two
    SLOs does not rank (``batchlab summarize --slo`` recomputes a run's under another). The
    SLO kept is the report's (``slo``) when a cell's is that one, else the first cell's."""
    if not cells or one_slo(cells):
        return list(cells), []
    ref = next((c for c in cells if slo and get(c.summary, "slo") == slo), cells[0])
    kept = [c for c in cells if same_slo(c, ref)]
    return kept, [c for c in cells if not same_slo(c, ref)]
