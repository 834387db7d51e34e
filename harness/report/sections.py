"""The report's header, cells and metric tables, priority classes and reproduce section."""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.metrics import PACE_SIGMAS, PACE_TOLERANCE, SHORTEST_STEADY_E2ES
from harness.redact import redact_argv
from harness.report.context import (
    ReportContext,
    class_name,
    metrics_link,
    one_slo,
    priority_sort_key,
    same_slo,
)
from harness.report.curves import (
    Baselines,
    BatchRow,
    CapacityRow,
    CurvePoint,
    Series,
    capacity_ratio,
    capacity_text,
    cell_setting,
    find_searches,
    roofline_of,
    stopped_cut_off,
)
from harness.report.format import (
    and_codes,
    at_least,
    code,
    display_path,
    fmt_attainment,
    fmt_int,
    fmt_number,
    fmt_pct,
    fmt_seconds,
    load_text,
    missing,
    short,
    slo_text,
    table,
    value_text,
    with_delta,
)
from harness.report.predictions import (
    derived_note,
    kind_note,
    kind_note_again,
    noted_elsewhere,
    predicted_settings,
    prediction_accuracy_lines,
    prediction_row,
    row_labels,
    tails_note,
    unmeasured_note,
)
from harness.report.runs import (
    CellResult,
    approximations,
    classes_not_drawn,
    client_limited,
    get,
    preemptions,
    varying_knobs,
)

LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E latency"))
# the kind of published figure (harness.prediction.KINDS) each latency's accuracy is quoted from
_KIND_OF = {"ttft_s": "TTFT", "tpot_s": "TPOT/ITL", "itl_s": "TPOT/ITL", "e2e_s": "E2E"}
PERCENTILES = ("p50", "p90", "p99")
# Reference-engine settings that the scenario's knobs do not already show.
_REFERENCE_SETTINGS = ("policy", "admission", "preemption", "max_num_seqs",
                       "max_num_batched_tokens", "chunked_prefill", "weights_dtype",
                       "kv_cache_dtype", "num_gpu_blocks", "block_size", "max_model_len")


def header(cells: Sequence[CellResult], base: CellResult | None, ctx: ReportContext
            ) -> list[str]:
    lines = [f"# {ctx.title}", ""]
    if ctx.question:
        lines += [f"> **Question.** {ctx.question}", ""]
    rows: list[tuple[str, str]] = []
    traces: dict[str, list[str]] = {}
    for c in cells:
        trace = c.manifest.get("trace") or {}
        if not trace:
            continue
        key = f"{trace.get('source')}|{trace.get('digest')}"
        traces.setdefault(key, []).append(c.name)
    if traces:
        rows.append(("Trace", _traces_text(cells, traces)))
    elif ctx.scenario.get("trace"):
        rows.append(("Trace", code(display_path(ctx.scenario["trace"].get("path")))))
    for key, label in (("model", "Model"), ("gpu", "GPU")):
        values = list(dict.fromkeys(
            str(c.manifest.get(key) or ctx.scenario.get(key) or "–") for c in cells
            if c.manifest or ctx.scenario))
        if values:
            rows.append((label, ", ".join(values)))
    engines = list(dict.fromkeys(_engine_text(c) for c in cells
                                 if (c.manifest or c.cell) and c.state != "not_run"))
    not_run = [e for e in dict.fromkeys(_engine_text(c) for c in cells
                                        if c.cell and c.state == "not_run")
               if e not in engines]
    if engines or not_run:
        rows.append(("Engines", "; ".join(engines + [f"{e}: not run" for e in not_run])))
    if ctx.slo:
        rows.append(("SLO", slo_text(ctx.slo)))
    if base is not None and len(cells) > 1:
        ok = [c for c in cells if c.ok]
        shown = code(base.name)
        if Baselines.of(ok, base).per_load:  # each cell against this setting at its load
            shown = f"{code(str(cell_setting(base)))} at each load"
        if ctx.baseline and ctx.baseline != base.name:
            early = any(c.name == ctx.baseline for c in ok)
            shown += (f" (requested {code(ctx.baseline)}: "
                      + ("ended early)" if early else "no results)"))
        rows.append(("Baseline", shown))
    rows.append(("Client ever the limit", _client_text(cells)))
    predicted = prediction_row(cells)
    if predicted:
        rows.append(("Predicted", predicted))
    lines += [table(("", ""), rows, align=("l", "l")), ""]
    return lines


def _traces_text(cells: Sequence[CellResult], traces: Mapping[str, list[str]]) -> str:
    """One line per trace, naming its cells when there are several. Load points of one trace
    (each with its own arrivals, so its own digest) are one line: the same requests, at each
    cell's load."""
    first = {key: next(x for x in cells if x.name == names[0]) for key, names in traces.items()}
    if len(traces) > 1 and all(c.at_load for c in cells):
        untimed = {_trace_text(c, timing=False) for c in first.values()}
        if len(untimed) == 1:
            return (f"{untimed.pop()}, arrivals at each cell's load ({len(traces)} arrival "
                    "schedules, each digest in its cell's manifest.json)")
    described = []
    for key, names in traces.items():
        text = _trace_text(first[key])
        if len(traces) > 1:
            text += f" — {', '.join(map(code, names))}"
        described.append(text)
    return "<br>".join(described)


_CHANGED_REQUESTS = ("clipped ", "dropped ", "skipped ")  # trace notes (harness.traces)


def _changed_requests(note: str) -> bool:
    """A loader's note of requests it clipped, dropped or skipped; a mix's notes start with
    the file they are about ("excerpt.jsonl: clipped 5 requests ...")."""
    _, sep, rest = note.partition(": ")
    return note.startswith(_CHANGED_REQUESTS) or bool(sep and rest.startswith(_CHANGED_REQUESTS))


def _trace_text(c: CellResult, *, timing: bool = True) -> str:
    """The trace's source, format, size and lengths; with ``timing``, its span and digest
    (which change with the arrivals)."""
    trace = c.manifest.get("trace") or {}
    source = str(trace.get("source") or "")  # a mix: "a.csv + b.jsonl"
    parts = [code(" + ".join(display_path(part) for part in source.split(" + ")))]
    fmt = trace.get("format")
    stats = trace.get("stats") or {}
    details = []
    if fmt:
        details.append(str(fmt))
    n = stats.get("num_requests", get(c.summary, "num_requests"))
    if n is not None:
        details.append(f"{int(n):,} requests")
    span = stats.get("span_s")
    closed = (c.manifest.get("load") or {}).get("mode") == "closed"  # arrivals not used
    if timing and not closed and not missing(span):
        details.append(f"over {fmt_seconds(span)}")
    for key, label in (("prompt_tokens_mean", "mean prompt"),
                       ("output_tokens_mean", "mean output")):
        if not missing(stats.get(key)):
            details.append(f"{label} {fmt_number(stats[key])} tokens")
    # requests the loader changed or left out: the workload is not the file's
    details += [str(n).split(";")[0] for n in trace.get("notes") or ()
                if _changed_requests(str(n))]
    if details:
        parts.append("(" + ", ".join(details) + ")")
    digest = trace.get("digest")
    if timing and digest:
        parts.append(f"digest {code(str(digest)[:12])}")
    return " ".join(parts)


def _engine_text(c: CellResult) -> str:
    version = c.engine_version
    if not version and c.engine == "reference":
        bv = c.manifest.get("batchlab_version")
        version = f"batchlab {bv}" if bv else None
    mode = c.mode
    text = c.engine
    if version:
        text += f" {version}"
    if mode not in ("–", ""):
        text += f" ({mode})"
    return text


def _client_text(cells: Sequence[CellResult]) -> str:
    live = [c for c in cells if c.ok and c.mode == "live"]
    if not live:
        if any(c.mode == "live" and c.state != "not_run" for c in cells):
            return "not known: no live cell finished"
        if any(c.mode == "live" for c in cells):
            return "not applicable: no live cell was run (not run yet, or left out by --only)"
        unknown = [code(c.name) for c in cells if c.ok and c.mode in ("–", "")]
        if unknown:  # no manifest to say how it ran
            return f"not known: {', '.join(unknown)} record{'s' if len(unknown) == 1 else ''} " \
                   "no mode (no manifest.json)"
        return "not applicable: every cell was simulated" if any(c.ok for c in cells) else "–"
    limited = [c for c in live if client_limited(c)]
    if not limited:
        return "no: every live cell's send lag stayed within its threshold"
    return "**yes**, in " + ", ".join(
        f"{code(c.name)} (send lag p99 {fmt_seconds(get(c.summary, 'send_lag_s.p99'))})"
        for c in limited)


def cells_section(cells: Sequence[CellResult]) -> list[str]:
    lines = ["## Cells", ""]
    varying = varying_knobs(cells)
    all_knobs: list[str] = []
    for c in cells:
        all_knobs += [k for k in c.knobs if k not in all_knobs]
    common = [k for k in all_knobs if k not in varying]
    show_status = any(c.state != "done" or c.ended_early for c in cells)
    show_load = any(c.at_load for c in cells)
    headers = ["cell", "engine", "mode"] + (["load"] if show_load else []) + varying
    if show_status:
        headers.append("status")
    rows = []
    for c in cells:
        row = [code(c.name), c.engine, c.mode]
        if show_load:
            row.append(c.load)
        row += [value_text(c.knobs.get(k)) if k in c.knobs else "–" for k in varying]
        if show_status:
            row.append(_status_text(c))
        rows.append(row)
    lines += [table(headers, rows, align=["l"] * len(headers)), ""]
    if common:
        unknown = [code(c.name) for c in cells if not c.knobs and c.state != "not_run"]
        whose = ("every cell" if not unknown else
                 f"every cell whose knobs are known ({', '.join(unknown)}: unknown)")
        # a cell not run records only the knobs its definition asked for: the others would be
        # its engine's defaults, not known until it runs
        partial = [code(c.name) for c in cells if c.state == "not_run"
                   and any(k not in c.knobs for k in common)]
        if partial:
            whose += (f" that records them ({', '.join(partial)}, not run, only the knobs "
                      "asked for: the rest would be their engines' defaults)")
        lines += [f"Knobs common to {whose}: " + ", ".join(
            f"{k}={value_text(next(c.knobs[k] for c in cells if k in c.knobs))}"
            for k in common) + ".", ""]
    flags = [(c, _flags_text(c)) for c in cells]
    flags = [(c, f) for c, f in flags if f]
    if flags:
        lines += ["### Engine flags", "",
                  "Each cell's uniform knobs as its engine received them:", ""]
        lines += [f"- {code(c.name)} ({c.engine}): {f}" for c, f in flags]
        lines.append("")
    lines += ["### Approximations", ""]
    approx = [(c, approximations(c)) for c in cells]
    approx = [(c, a) for c, a in approx if a]
    if approx:
        for c, items in approx:
            lines += [f"- {code(c.name)}: " + "; ".join(items)]
    unrecorded = [code(c.name) for c in cells if c.ok and not c.manifest]
    if unrecorded:  # no manifest.json: how its knobs reached the engine is not known
        lines += [*([""] if approx else []),
                  f"Not known for {', '.join(unrecorded)}: no manifest.json records how the "
                  "knobs were applied."]
    unread = [code(c.name) for c in cells if c.ok and c.manifest
              and c.unread_in("knobs", "mapping", "approximations", "knob_sources")]
    if unread:  # read as absent, being of the wrong type (said in the key findings)
        lines += [*([""] if approx or unrecorded else []),
                  f"Not known for {', '.join(unread)}: a field recording the knobs or how they "
                  "were applied was of the wrong type, read as absent (see the key findings)."]
    if not (approx or unrecorded or unread):
        lines.append("Nothing was approximated or left unapplied: every knob was applied as "
                     "given.")
    lines.append("")
    lines += prediction_accuracy_lines(cells)
    return lines


def _status_text(c: CellResult) -> str:
    if c.state == "done":
        ended = c.ended_early
        if ended and c.served_nothing:  # sent its trace and had nothing back: a failure
            return f"failed: {short(ended)}"
        return f"ended early: {short(ended)}" if ended else "done"
    if c.state == "not_run":
        return "not run"
    return f"{c.state}: {short(c.reason)}" if c.reason else c.state


def _flags_text(c: CellResult) -> str:
    parts = []
    engine = c.manifest.get("engine")
    config = engine.get("config") if isinstance(engine, Mapping) else None
    if not c.manifest.get("mapping") and isinstance(config, Mapping):
        # The reference engine takes the knobs directly; show its resolved settings (the KV
        # block count and admission it derived) as `batchlab simulate` flags.
        for key in _REFERENCE_SETTINGS:
            value = config.get(key)
            if value is None:
                continue
            flag = "--" + key.replace("_", "-")
            if isinstance(value, bool):
                parts.append(code(flag if value else "--no-" + key.replace("_", "-")))
            else:
                parts.append(code(f"{flag} {value}"))
        if config.get("prefix_caching") is True:
            parts.append(code("--prefix-caching"))
        return " ".join(parts)
    for m in c.manifest.get("mapping") or []:
        if not isinstance(m, Mapping):
            continue
        flags = m.get("flags") or []
        if isinstance(flags, str):
            flags = [flags]
        if flags:
            parts.append(code(" ".join(str(f) for f in flags)))
    return " ".join(parts)


def latency_section(ok: Sequence[CellResult], bases: Baselines) -> list[str]:
    lines = ["## Latency", "",
             "Percentiles over successful requests"
             + (f"; in brackets the change against {bases.phrase(code)} (+12%, -40%; 2.8× "
                "for two-fold and more; 1/20 for a fall to a twentieth or less), here and in "
                "the tables below."
                if bases.compared() else "."), "", *tails_note(ok)]
    # cells with percentiles (a request finished) that leave out those cut off
    cut = [(c, n) for c in ok if (n := stopped_cut_off(c.summary))
           and get(c.summary, "num_completed")]
    if cut:
        lines += ["Stopped early: " + ", ".join(f"{code(c.name)} cut off {n:,} request"
                                               + ("" if n == 1 else "s")
                                               for c, n in cut)
                  + (": its" if len(cut) == 1 else ": their")
                  + " percentiles are of the requests that finished only, a lower bound "
                  "(docs/metrics.md), and so " + ("is its mean" if len(cut) == 1
                                                  else "are their means")
                  + ": each marked ≥, here and in the tables below.", ""]
    lines += _withheld_note(ok, bases)
    labels = row_labels(ok)
    noted: dict[str, str] = {}  # kind of figure -> the table under which its error was said
    for metric, label in LATENCIES:
        if not any(get(c.summary, f"{metric}.count") for c in ok):
            continue
        rows = []
        for c in ok:
            row: list[str] = [labels[c.name]]
            b = bases.of_cell(c)  # None beside a cell stopped early: a bound is no figure
            bound = stopped_cut_off(c.summary) > 0
            for p in PERCENTILES:
                v = get(c.summary, f"{metric}.{p}")
                bv = get(b.summary, f"{metric}.{p}") if b else None
                row.append(with_delta(at_least(fmt_seconds(v), bound), v, bv, c is b))
            row.append(at_least(fmt_seconds(get(c.summary, f"{metric}.mean")), bound))
            rows.append(row)
        lines += [f"### {label}", "", table(["cell", *PERCENTILES, "mean"], rows), ""]
        kind = _KIND_OF[metric]
        lines += (kind_note_again(ok, kind, label, noted[kind]) if kind in noted
                  else kind_note(ok, kind, label))
        noted.setdefault(kind, label)
    return lines


def _partial_words(c: CellResult) -> str:
    """How a cell came to have figures of part of its trace (``CellResult.partial``)."""
    return "did not run to its end" if c.ended_early else "was stopped early"


def _withheld_note(ok: Sequence[CellResult], bases: Baselines) -> list[str]:
    """Why a row shows no change in brackets where the others do: it, or the cell it would
    be compared with, ran part of its trace (``Baselines.withheld``)."""
    if not bases.withheld:
        return []
    by_name = {c.name: c for c in ok}
    parts = []
    for name, b in bases.withheld.items():
        c = by_name[name]
        parts.append(f"{code(name)}, which {_partial_words(c)}" if c.partial else
                     f"{code(name)} against {code(b.name)}, which {_partial_words(b)}")
    return ["A cell that was stopped early or did not run to its end has figures of part of "
            "its trace: no change is given for them, nor against them, here or in the tables "
            "below. Left without one: " + "; ".join(parts) + ".", ""]


def _stopped_note(ok: Sequence[CellResult], what: str) -> list[str]:
    """``what`` the cells stopped early (that ran to the stop: ``ended_early`` are said
    apart) show, said once below a table of them: "`a` and `b` were stopped early: " + what,
    and, beside other cells, that they are not compared with them."""
    stopped = [c.name for c in ok if c.stopped_early and not c.ended_early]
    if not stopped:
        return []
    names = and_codes(stopped)
    one = len(stopped) == 1
    return [f"{names} {'was' if one else 'were'} stopped early: "
            + what.format(its="its" if one else "their", s="" if one else "s",
                          it="it" if one else "they")
            + (": not compared with another cell's." if len(ok) > 1 else "."), ""]


def throughput_section(ok: Sequence[CellResult], bases: Baselines) -> list[str]:
    cols = (("throughput.requests_per_s", "requests/s"),
            ("throughput.input_tokens_per_s", "input tok/s"),
            ("throughput.output_tokens_per_s", "output tok/s"),
            ("throughput.total_tokens_per_s", "total tok/s"))
    rows = []
    labels = row_labels(ok)
    for c in ok:
        row: list[str] = [labels[c.name]]
        b = bases.of_cell(c)
        for key, _ in cols:
            v = get(c.summary, key)
            row.append(with_delta(fmt_number(v), v, get(b.summary, key) if b else None,
                                   c is b))
        row.append(fmt_seconds(get(c.summary, "duration_s")))
        rows.append(row)
    return ["## Throughput", "",
            "Completed requests and their tokens divided by the run's duration (first arrival "
            "to last event).", "",
            table(["cell", *(label for _, label in cols), "duration"], rows), "",
            *_stopped_note(ok, "{its} throughput is over the part of {its} trace{s} {it} "
                           "ran, up to the stop, and counts none of the requests the stop cut "
                           "off in flight"),
            *kind_note(ok, "throughput", "throughput")]


def goodput_section(ok: Sequence[CellResult], bases: Baselines, ctx: ReportContext
                     ) -> list[str]:
    lines = ["## Goodput and SLO attainment", ""]
    if not any(get(c.summary, "goodput") for c in ok):
        return [*lines, "No SLO was set, so goodput is not computed.", ""]
    several = not one_slo(ok)  # `batchlab summarize --slo` recomputed some: each row's own
    if several:
        lines += ["A request is good when it succeeded and met every SLO of its own cell (the SLO "
                  "column: these cells' goodput was computed under different SLOs, so it is not "
                  "compared between them); attainment divides by requests sent.", ""]
    elif ctx.slo:
        lines += [f"A request is good when it succeeded and met every SLO ({slo_text(ctx.slo)});"
                  " attainment divides by requests sent.", ""]
    rows = []
    labels = row_labels(ok)
    for c in ok:
        b = bases.of_cell(c)
        if b is not None and not same_slo(c, b):
            b = None  # no change against a baseline measured by another SLO
        att = get(c.summary, "goodput.slo_attainment")
        batt = get(b.summary, "goodput.slo_attainment") if b else None
        att_text = fmt_attainment(att)
        if b is not None and c is not b and not missing(att) and not missing(batt):
            att_text += f" ({(att - batt) * 100:+.1f} pts)"
        gp = get(c.summary, "goodput.requests_per_s")
        row = [labels[c.name], fmt_int(get(c.summary, "goodput.num_good")),
               fmt_int(get(c.summary, "num_requests")),
               with_delta(fmt_number(gp), gp,
                          get(b.summary, "goodput.requests_per_s") if b else None, c is b),
               att_text]
        if several:
            row.append(_slo_cell(c))
        rows.append(row)
    headers = ["cell", "good requests", "requests", "goodput req/s", "SLO attainment"]
    lines += [table(headers + (["SLO"] if several else []), rows), ""]
    lines += _stopped_note(ok, "{its} goodput and SLO attainment count only the requests "
                               "{it} sent before the stop (docs/metrics.md)")
    return lines + derived_note(ok, "Goodput and SLO attainment", slo=ctx.slo)


def _slo_cell(c: CellResult) -> str:
    """A cell's own SLO, for tables of cells summarised under different SLOs."""
    slo = get(c.summary, "slo")
    return slo_text(slo) if slo else "none"


def preemption_section(ok: Sequence[CellResult], preempted: Mapping[str, int | None]
                        ) -> list[str]:
    rows = []
    swapping = any(get(c.summary, "num_swap_fallbacks") is not None for c in ok)
    labels = row_labels(ok)
    for c in ok:
        n = preemptions(c)
        total = get(c.summary, "num_requests") or 0
        row = [labels[c.name], "not known" if n is None else f"{n:,}",
               fmt_int(preempted.get(c.name)),
               fmt_number(100 * n / total) if total and n is not None else "–"]
        if swapping:
            row.append(fmt_int(get(c.summary, "num_swap_fallbacks")))
        rows.append(row)
    headers = ["cell", "preemptions", "requests preempted", "per 100 requests"]
    if swapping:
        headers.append("swaps recomputed (host full)")
    live = any(c.manifest.get("kind") == "live" for c in ok)
    return ["## Preemptions", "",
            "A preemption frees a running request's KV blocks (recompute resets its progress, "
            "swap moves the blocks to host memory"
            + ("; when the host's swap space is full, a swap preemption is recomputed instead, "
               "counted in the last column" if swapping else "") + ")."
            + (" A live run's preemptions are its engine's own count (its telemetry); a client "
               "cannot see them, nor which requests were preempted (–): not known when the "
               "engine exports no counter, or its telemetry was not scraped (`replay --target`; "
               "`replay --engine ENGINE --url URL` scrapes it)." if live else ""), "",
            table(headers, rows), "", *unmeasured_note(ok, "Preemption counts")]


def prefix_cache_section(ok: Sequence[CellResult]) -> list[str]:
    """Prefix-cache hit rates, when any cell cached prefixes (simulated: summary.json)."""
    rows = []
    cached: list[CellResult] = []  # cells with hit counts
    blind: list[str] = []  # cells whose trace says nothing of shared prefixes
    counted: list[str] = []  # live cells: the engine's counters, without re-admissions
    for c in ok:
        pc = get(c.summary, "prefix_cache")
        if not isinstance(pc, Mapping):
            continue
        cached.append(c)
        if pc.get("num_requests_with_prefix_ids") == 0:
            blind.append(code(c.name))
        if c.mode != "simulated" and pc.get("preempted_queries_tokens") is None:
            counted.append(code(c.name))
        rate, again = pc.get("hit_rate"), pc.get("preempted_hit_rate")
        rows.append([code(c.name), fmt_int(pc.get("queries_tokens")),
                     fmt_int(pc.get("hits_tokens")),
                     fmt_pct(rate) if rate is not None else "–",
                     fmt_pct(again) if again is not None else "–"])
    # live cells that cached prefixes, with no prefix-cache counter read from their engine
    # (it exports none, or was not scraped): their hit rates are not known (not 0)
    unread = [code(c.name) for c in ok if c.mode != "simulated"
              and c.knobs.get("prefix_caching") is True
              and not isinstance(get(c.summary, "prefix_cache"), Mapping)]
    if not rows and not unread:
        return []
    rows += [[name, "not read", "not read", "–", "–"] for name in unread]
    lines = ["## Prefix cache", "",
             "Prompt tokens looked up in the prefix cache when a request was admitted, and how "
             "many were found (their prefill is skipped); re-admissions after a preemption are "
             "counted apart, as vLLM counts `vllm:prefix_cache_queries` and `_hits`.", "",
             table(["cell", "tokens looked up", "tokens hit", "hit rate",
                    "hit rate after preemption"], rows), ""]
    if blind:
        lines += [f"No request of {', '.join(blind)} carried prefix identities: the trace "
                  "records lengths, not prompts, so no two prompts can be known to share a "
                  "prefix and no lookup hits. Only Mooncake traces (`hash_ids`) exercise the "
                  "cache.", ""]
    if counted:
        lines += [f"{', '.join(counted)}: the live engine's own counters; it exports none for "
                  "re-admissions after a preemption (–).", ""]
    if unread:
        lines += [f"{', '.join(unread)} ran with prefix caching on a live engine from which "
                  "no prefix-cache counter was read, so their hit rates are not known: batchlab "
                  "reads vLLM's `vllm:prefix_cache_queries` and `_hits` only (not the "
                  "`vllm:gpu_prefix_cache_*` of vLLM builds before their rename; TGI, "
                  "TensorRT-LLM and llama.cpp export no count in prompt tokens), from an "
                  "engine whose telemetry was scraped (not `replay --target`), in runs made "
                  "since batchlab reads them.", ""]
    if cached:
        lines += unmeasured_note(cached, "Prefix-cache hits", report_cells=ok)
    return lines


def output_length_section(ok: Sequence[CellResult]) -> list[str]:
    # more tokens than asked (the server ignored max_tokens): a column when any run had
    # some, by the server's count or, apart, the client's
    over = [k for k in ("num_over_target", "num_over_target_client_counted")
            if any(not missing(n := get(c.summary, f"output_length_fidelity.{k}")) and n > 0
                   for c in ok)]
    rows = []
    for c in ok:
        rows.append([code(c.name), fmt_int(get(c.summary, "num_completed")),
                     fmt_int(get(c.summary, "output_length_fidelity.num_reached_target")),
                     fmt_pct(get(c.summary, "output_length_fidelity.fraction_reached_target"))]
                    + [fmt_int(get(c.summary, f"output_length_fidelity.{k}")) for k in over])
    headers = {"num_over_target": "more than asked",
               "num_over_target_client_counted": "more than asked (client's count)"}
    return ["## Output-length fidelity", "",
            "Requests that produced at least the trace's output length (an engine that stops "
            "early serves fewer tokens)" + (", and those that produced more (a server that "
            "ignored max_tokens: its tokens/s counts tokens the trace never asked for)"
            if over else "") + ".", "",
            table(["cell", "completed", "reached target", "fraction",
                   *(headers[k] for k in over)], rows), ""]


def failures_section(ok: Sequence[CellResult]) -> list[str]:
    kinds: list[str] = []
    for c in ok:
        kinds += [k for k in (get(c.summary, "failures") or {}) if k not in kinds]
    kinds.sort()
    rows = []
    for c in ok:
        failures = get(c.summary, "failures") or {}
        rows.append([code(c.name), fmt_int(get(c.summary, "num_requests")),
                     fmt_int(get(c.summary, "num_completed")),
                     fmt_int(get(c.summary, "num_failed")),
                     *(fmt_int(failures.get(k, 0)) for k in kinds)])
    lines = ["## Failures", ""]
    if not kinds:
        lines += ["No request failed.", ""]
    lines += [table(["cell", "requests", "completed", "failed", *kinds], rows), ""]
    return lines


def priority_section(ok: Sequence[CellResult], bases: Baselines, ctx: ReportContext
                      ) -> list[str]:
    keys: list[str] = []
    for c in ok:
        keys += [k for k in (get(c.summary, "by_priority") or {}) if k not in keys]
    if not keys:
        return []
    keys.sort(key=priority_sort_key)
    has_slo = any(get(c.summary, "goodput") for c in ok)
    several = has_slo and not one_slo(ok)  # each row's own SLO, as in the goodput section
    lines = ["## Per priority class", "",
             "Requests split by priority (lower values are served first under the priority "
             "policy; other policies ignore them; a request with no priority is in class 0). "
             "Failed: requests of the class that did not complete (their kinds are in the "
             "Failures section); the latencies are of those that did. ITL p99 and ITL max are "
             "the tail of the gaps between tokens: a prefill sharing a step shows in one of "
             "them, a stall of a few steps in a thousand (a whole long prompt) in the max alone."
             + (f" Deltas against the same class in {bases.phrase(code)}." if bases.compared()
                else "")
             + (" SLO attainment is each cell's under its own SLO (the SLO column): these "
                "cells' goodput was computed under different SLOs, so it is not compared "
                "between them." if several else ""), ""]
    origins = sorted({o for c in ok if (o := classes_not_drawn(c.manifest)) is not None})
    if ctx.scenario and ctx.scenario.get("priority_classes") and origins:
        lines += [f"The scenario's `priority_classes` were not drawn: {'; '.join(origins)}; "
                  "the classes' names are not given to them.", ""]
    labels = row_labels(ok)
    for key in keys:
        rows = []
        for c in ok:
            cls = get(c.summary, f"by_priority.{key}")
            if not cls:
                continue
            b = bases.of_cell(c)
            base_cls = get(b.summary, f"by_priority.{key}") if b else None
            row: list[str] = [labels[c.name], fmt_int(get(cls, "num_requests")),
                              fmt_int(get(cls, "num_failed"))]
            bound = stopped_cut_off(c.summary) > 0  # of the requests that finished only
            for metric in ("ttft_s.p50", "ttft_s.p90", "tpot_s.p90", "itl_s.p99", "itl_s.max",
                           "e2e_s.p90"):
                v = get(cls, metric)
                row.append(with_delta(at_least(fmt_seconds(v), bound), v,
                                      get(base_cls, metric), c is b))
            if has_slo:
                row.append(fmt_attainment(get(cls, "goodput.slo_attainment")))
            if several:
                row.append(_slo_cell(c))
            rows.append(row)
        headers = ["cell", "requests", "failed", "TTFT p50", "TTFT p90", "TPOT p90",
                   "ITL p99", "ITL max", "E2E p90"]
        if has_slo:
            headers.append("SLO attainment")
        if several:
            headers.append("SLO")
        title = class_name(ctx, key).replace("`", "")
        lines += [f"### Class {title}", "", table(headers, rows), ""]
    return lines + unmeasured_note(ok, "Per-class figures")


def reproduce_section(cells: Sequence[CellResult], ctx: ReportContext, out_dir: Path
                      ) -> list[str]:
    lines = ["## Reproduce", ""]
    resummarized = [c for c in cells if _resummarized_slo(c) is not None]
    shown = bool(ctx.command)  # each one's summarize step among the commands
    # Commands are redacted again: a manifest written before redaction may hold secrets.
    if ctx.command:
        lines += ["Run it again:", "", "```sh", shlex.join(redact_argv(ctx.command)),
                  *(_summarize_command(c) for c in resummarized), "```", ""]
    else:
        commands = [(c, list(c.manifest["command"])) for c in cells
                    if c.manifest.get("command")]
        shown = all(any(c is x for x, _ in commands) for c in resummarized)
        if commands:
            lines += ["Each cell was produced by:", "", "```sh"]
            for c, cmd in commands:
                lines += [f"# {c.name}", shlex.join(redact_argv(cmd))]
                if any(c is x for x in resummarized):
                    lines.append(_summarize_command(c))
            lines += ["```", ""]
    if resummarized:
        lines += _resummarized_note(resummarized, cells, shown=shown)
    if ctx.rerender:
        lines += ["Re-render this report from the saved results, without re-running:", "",
                  "```sh", shlex.join(ctx.rerender), "```", ""]
    lines += [f"Metric definitions (TTFT, TPOT, ITL, E2E, goodput): "
              f"[docs/metrics.md]({metrics_link(ctx, out_dir)}).", ""]
    return lines


def _resummarized_slo(c: CellResult) -> Mapping[str, float] | None:
    """The SLO ``c``'s goodput was computed under (its summary's), when ``batchlab summarize
    --slo`` changed it from the one its run was given (its manifest's, as its command line
    set it); None when it did not, or no manifest says what the run was given."""
    if not c.ok or "slo" not in c.manifest:
        return None
    now = get(c.summary, "slo")
    if not isinstance(now, Mapping) or not now:
        return None  # summarize cannot take an SLO away: none now is the run's own
    given = c.manifest.get("slo")
    return None if isinstance(given, Mapping) and dict(given) == dict(now) else now


def _summarize_command(c: CellResult) -> str:
    """The ``batchlab summarize DIR --slo ...`` that gave ``c``'s figures their SLO."""
    slo = _resummarized_slo(c) or {}
    return shlex.join(["batchlab", "summarize", display_path(str(c.run_dir)),
                       "--slo", ",".join(f"{k}={_seconds_arg(v)}" for k, v in slo.items())])


def _seconds_arg(value: Any) -> str:
    """A number of seconds as ``--slo`` takes it back unchanged: ``1``, ``0.05``."""
    text = repr(float(value))
    return text.removesuffix(".0")


def _resummarized_note(cells: Sequence[CellResult], everyone: Sequence[CellResult], *,
                       shown: bool) -> list[str]:
    """What the reproduce commands' ``batchlab summarize`` step is there for: which cells'
    goodput is under which SLO (the SLO their runs were given is in their commands, and
    written out nowhere else: the report's figures are not under it). ``everyone``: the
    report's cells, for "every cell"; ``shown``: whether the commands above have the step
    of each."""
    groups: dict[str, list[str]] = {}  # names by what is said of them
    for c in cells:
        given = c.manifest.get("slo")
        text = f"under {slo_text(_resummarized_slo(c) or {})}" + (
            "" if isinstance(given, Mapping) and given else " (its run was given none)")
        groups.setdefault(text, []).append(code(c.name))
    ran = [c for c in everyone if c.ok]
    parts = [("every cell" if len(names) == len(ran) > 1 else ", ".join(names)) + " " + text
             for text, names in groups.items()]
    return ["Goodput and SLO attainment were summarised again since the run, under another "
            "SLO than the run was given, by `batchlab summarize DIR --slo ...`"
            + (" (in the commands above)" if shown else "") + ": " + "; ".join(parts) + ".",
            ""]


# ---------------------------------------------------------------- load curves and capacity



def _under_way_note(series: Sequence[Series]) -> list[str]:
    """Above a curve table with closed-loop capacity probes: what "once under way" is."""
    if not any(p.under_way for s in series for p in s.points):
        return []
    return ["A closed loop's users send their first requests all at once, a burst no steady "
            "load of that many users makes: a capacity search judges each probe by the SLO "
            "attainment *once under way*, over the requests sent after the first one "
            "completed, shown beside the attainment over every request.", ""]


def curves_section(series: Sequence[Series], has_plot: bool,
                   cells: Sequence[CellResult] = (), target: float | None = None
                   ) -> list[str]:
    """Each setting across its load points: tokens/s, TPOT, TTFT and SLO attainment, with
    how accurate each kind of figure of a predicted cell was measured to be. ``cells``: the
    report's, the points' among them. ``target``: the attainment a capacity search asked
    for, heeded only where one measured a setting of ``cells`` (``_search_target``): every
    point below it is marked failed, saying so before any other reason it failed. Where
    none did, no target is spoken of, nor anything failed: a point is marked only where its
    engine fell behind."""
    if not series:
        return []
    target, judged = _search_target(series, cells, target)
    labels = row_labels(cells)
    names = {p.cell for s in series for p in s.points}
    shown = [c for c in cells if c.name in names]
    lines = ["## Throughput–latency curves", "",
             "Each engine and knob setting across its load points, by load: output tokens/s "
             "against TPOT (p50, p90) and TTFT p90"
             + (" (plotted in `throughput_latency.png`, SLO lines drawn in)." if has_plot
                else "."), "", *_under_way_note(series), *tails_note(shown)]
    for s in series:
        rows = []
        # a point whose goodput `batchlab summarize --slo` recomputed says under which SLO
        several = len({json.dumps(p.slo, sort_keys=True) for p in s.points}) > 1
        for p in s.points:
            att = fmt_attainment(p.attainment) + (
                f" ({fmt_attainment(p.under_way[0])} once under way)" if p.under_way else ""
            ) + (" (stopped early)" if p.stopped else _point_mark(p, target, judged))
            if several:
                att += f" under {slo_text(p.slo)}" if p.slo else " (no SLO)"
            bound = p.num_cut_off > 0  # of the requests that finished only
            rows.append([load_text({"kind": s.kind, "value": p.load}),
                         labels.get(p.cell, code(p.cell)),
                         fmt_number(p.output_tokens_per_s),
                         *(at_least(fmt_seconds(v), bound)
                           for v in (p.tpot_p50_s, p.tpot_p90_s, p.ttft_p90_s)), att])
        lines += [f"### {code(s.key)}", "",
                  table(["load", "cell", "output tok/s", "TPOT p50", "TPOT p90", "TTFT p90",
                         "SLO attainment"], rows, align=("r", "l", "r", "r", "r", "r", "r")),
                  ""]
    cut = [p for s in series for p in s.points if p.num_cut_off and any(
        v is not None for v in (p.tpot_p50_s, p.tpot_p90_s, p.ttft_p90_s))]  # a "≥" shown
    if cut:
        lines += ["≥: a load point stopped early; its TPOT and TTFT are of the requests that "
                  "finished, not of the " + ", ".join(
                      f"{p.num_cut_off:,} of {code(p.cell)}" for p in cut)
                  + " it cut off: a lower bound (docs/metrics.md).", ""]
    lines += kind_note(shown, "throughput", "output tokens/s")
    lines += kind_note(shown, "TPOT/ITL", "TPOT")
    lines += kind_note(shown, "TTFT", "TTFT")
    if any(p.attainment is not None for s in series for p in s.points):
        lines += derived_note(shown, "SLO attainments")
    return lines


def _search_target(series: Sequence[Series], cells: Sequence[CellResult],
                   target: float | None) -> tuple[float | None, bool]:
    """The target the curve table marks points against, and whether a point that missed it
    or fell behind is said to have failed (a capacity search's probe). Where a capacity
    search (``find_searches``: beside ``cells``, at the SLO of the points' attainments)
    measured a setting of the report: ``target``, else the search's own. Where none did: no
    target (the report's default, ``DEFAULT_TARGET``, is no target anyone set, and a load
    point is not failed for missing it) and nothing failed. Without ``cells`` to look beside:
    the caller's ``target``, its points judged as a search's."""
    if not cells:
        return target, True
    slos = {json.dumps(p.slo, sort_keys=True): p.slo for s in series for p in s.points}
    searches = [r for slo in slos.values() for r in find_searches(cells, slo)]
    if not searches:
        return None, False
    return (target if target is not None else searches[0].target), True


def _point_mark(p: CurvePoint, target: float | None, judged: bool) -> str:
    """After a curve point's attainment: " (failed: below the 99.0% target)" for every point
    under ``target`` (a closed loop's judged once under way, as its search judged it), with
    "; also fell behind" where its pace failed too; " (failed: fell behind)" for one that
    met it but did not keep pace. Not ``judged`` (no capacity search): " (fell behind)"
    where it did, and nothing else."""
    behind = p.behind.split(":")[0] if p.behind else None  # "fell behind", "too short ..."
    if not judged:
        return f" ({behind})" if behind else ""
    attainment = p.under_way[0] if p.under_way else p.attainment
    if target is not None and attainment is not None and attainment < target:
        # the SLO missed first, then the pace
        return (f" (failed: below the {fmt_pct(target)} target"
                + (f"; also {behind})" if behind else ")"))
    return f" (failed: {behind})" if behind else ""


def capacity_section(rows: Sequence[CapacityRow], base_key: str | None,
                     slo: Mapping[str, float] | None, target: float,
                     cells: Sequence[CellResult] = (), unsearched: Sequence[str] = ()
                     ) -> list[str]:
    """Capacity at SLO per setting, with its ratio to the baseline setting's. ``cells``: the
    report's; a setting whose capacity is predicted is marked so when they mix predicted and
    measured cells (``predicted_settings``). ``unsearched``: the search's settings with no
    row, each with why (``unsearched_settings``), said under the table."""
    if not rows and not unsearched:
        return []
    lines = ["## Capacity at SLO", ""]
    missing = (["Setting folders here without a row in this table: " + "; ".join(unsearched)
                + ".", ""] if unsearched else [])
    if not rows:
        return [*lines, *missing]
    if not slo:
        return [*lines, "No SLO was set, so there is no capacity at SLO.", ""]
    waits = "ttft_s" in slo or "e2e_s" in slo
    lines += [f"The highest load at which at least {fmt_pct(target)} of requests met every SLO "
              f"({slo_text(slo)}) and the engine kept up. A probe fails, whatever its "
              "attainment, when it was stopped early as over-saturated; a rate probe also "
              "fails when, over the second half of its arrivals, the engine completed fewer "
              "requests than were due (each its own decode time after its arrival, had it "
              "waited no longer for its first token than the quickest request), by more than "
              f"{PACE_TOLERANCE:.0%} of them and more than chance explains (it fell behind), "
              "or when its "
              f"arrivals last under {SHORTEST_STEADY_E2ES} times its requests' decode time p90 "
              "(first token to finish: too short to show a steady state, and a trace with more "
              "requests may show a higher capacity)"
              + ("" if waits else " (this SLO bounds no waiting time, so an over-saturated load "
                 "could meet it: being stopped early or falling behind is what fails it)")
              + ". A kept pace allows a shortfall that chance explains, so a capacity may "
              "exceed the rate the engine sustains by up to 1/(1 − max(5%, 2/√n)) − 1, n about "
              "half the probe's requests (7% with 2,000, 25% with 200, 67% with 50): more than "
              "a search's precision on a short trace. *search*: found by `batchlab capacity` (its "
              "`search.json`: the bracket, to the stated precision); *interpolated*: between "
              "this report's "
              "load points, linear in SLO attainment (a rough figure; a search states its "
              "precision). ≥: a lower bound (no load tried failed, the search was cut short, or "
              "the trace was too short to test more); <: every load tried failed.", ""]
    base = next((r for r in rows if r.key == base_key), rows[0])
    predicted = predicted_settings(rows, cells)
    table_rows = []
    for r in rows:
        ratio = "baseline" if r is base else capacity_ratio(r, base) or "–"
        evidence = r.evidence + _pace_slack(r, cells)
        if r.cells:
            evidence += "; " + ", ".join(code(c) for c in r.cells[:4])
        setting = code(r.key) + (" (predicted)" if r.key in predicted else "")
        table_rows.append([setting, capacity_text(r), ratio, r.source, evidence])
    lines += [table(["setting", "capacity", "vs baseline", "from", "evidence"], table_rows,
                    align=("l", "r", "r", "l", "l")), "", *missing]
    return lines


def _pace_slack(row: CapacityRow, cells: Sequence[CellResult]) -> str:
    """A rate capacity a search found, or its lower bound (``≥``: no load tried failed, the
    trace too short to test more, a search cut short): how far short of its arrivals the pace
    check let the probe at it fall, worked out for its own count of requests due (the
    paragraph above gives the rule), and the rate it may then sustain: "; its pace check
    allowed a shortfall of up to 19.6% (104 requests due): it may sustain as little as 8.34
    req/s". A lower bound on few requests is where this matters most. '' when the probe or
    its pace is not at hand."""
    if (row.kind != "rate" or row.source != "search" or row.bound not in ("=", "≥")
            or not row.capacity):
        return ""
    probe = next((c for c in cells if c.name in row.cells
                  and c.load_point.get("kind") == "rate"
                  and isinstance(c.load_point.get("value"), (int, float))
                  and math.isclose(float(c.load_point["value"]), row.capacity, rel_tol=1e-6)),
                 None)
    pace = probe.pace if probe is not None else None
    if pace is None or not pace.kept or not pace.num_due:
        return ""
    share = max(PACE_TOLERANCE, PACE_SIGMAS / math.sqrt(pace.num_due))
    return (f"; its pace check allowed a shortfall of up to {fmt_pct(share)} ({pace.num_due:,} "
            f"requests due): it may sustain as little as "
            f"{fmt_number(row.capacity * (1 - share), 'req/s')}")


def _preemptions_text(c: CellResult) -> str:
    """A cell's preemptions for a table: "not known" for a live run whose engine exported no
    count (``preemptions``), never a 0 it did not count."""
    n = preemptions(c)
    return "not known" if n is None else fmt_int(n)


def batch_size_section(series: Mapping[str, Sequence[BatchRow]],
                       report_cells: Sequence[CellResult] | None = None) -> list[str]:
    """The seed's batch-size table from measurements, with the turn marked, and how accurate
    each kind of figure of a predicted cell was measured to be. ``report_cells``: the
    report's, when it has cells outside the sweep (whether it mixes predicted and measured
    ones decides whether a row is marked predicted)."""
    if not series:
        return []
    lines = ["## Batch size", "",
             "The cost model's batch-size table (docs/cost-model.md), as the runs showed it: each "
             "`max_num_seqs` cap with the running batch it reached (mean over busy time / "
             "peak), TPOT, output tokens/s and KV-cache use. *bound by*: what kept the running "
             "batch from growing: kv (KV memory: preemptions, or the cache full), cap (reached), "
             "budget (requests waited with room in the batch: the per-step token budget admits "
             "prefills only so fast) or load (nothing waited). *gain*: how output tokens/s "
             "grew against the running batch "
             "since the previous cap (1: in proportion, memory-bound; near 0: flat); the turn "
             "is the first cap under 0.5; – where it cannot be told (the first cap, a batch "
             "that grew under 10% since the previous cap, or either cap's batch bound by the "
             "load).",
             ""]
    cells = [r.cell for rows in series.values() for r in rows]
    labels = row_labels(report_cells if report_cells is not None else cells)
    # its TPOT and output tokens/s are those the Latency and Throughput tables show, with
    # their accuracy notes: said to be predicted, and where, not in those notes' words again
    lines += noted_elsewhere(cells, "TPOT and output tokens/s",
                             "the TPOT and Throughput tables", report_cells=report_cells)
    lines += unmeasured_note(cells, "Running batches, KV use, what bound them and the turn",
                             report_cells=report_cells)
    roof_line = _roofline_text(series)
    if roof_line:
        lines += [roof_line, ""]
    for name, rows in series.items():
        table_rows = []
        for i, r in enumerate(rows):
            use, s = r.use, r.cell.summary
            running = "–" if use is None or use.running_mean is None else (
                f"{use.running_mean:.1f} / {use.running_peak:.0f}")
            kv = "–" if use is None or use.kv_mean is None else (
                f"{fmt_pct(use.kv_mean)} / {fmt_pct(use.kv_peak)}")
            gain = "–" if r.gain is None else f"{r.gain:.2f}"
            if r.past_turn and (i == 0 or not rows[i - 1].past_turn):
                gain += " **← turn**"
            shown = labels.get(r.cell.name, code(r.cell.name))
            bound = stopped_cut_off(s) > 0  # of the requests that finished only
            table_rows.append([str(r.cap), shown, running,
                               at_least(fmt_seconds(get(s, "tpot_s.p50")), bound),
                               at_least(fmt_seconds(get(s, "tpot_s.p90")), bound),
                               fmt_number(get(s, "throughput.output_tokens_per_s")), kv,
                               _preemptions_text(r.cell), r.limit, gain, r.roofline])
        if len(series) > 1:
            lines += [f"### {code(name)}", ""]
        lines += [table(["max_num_seqs", "cell", "running mean / peak", "TPOT p50", "TPOT p90",
                         "output tok/s", "KV use mean / peak", "preemptions", "bound by", "gain",
                         "roofline"], rows=table_rows,
                        align=("r", "l", "r", "r", "r", "r", "r", "r", "l", "l", "l")), ""]
    cut = [r.cell for rows in series.values() for r in rows
           if stopped_cut_off(r.cell.summary) and get(r.cell.summary, "num_completed")]
    if cut:  # a "≥" shown
        lines += ["≥: stopped early; TPOT of the requests that finished, not of the "
                  + ", ".join(f"{stopped_cut_off(c.summary):,} of {code(c.name)}" for c in cut)
                  + " it cut off: a lower bound (docs/metrics.md). No gain is given to or "
                  "from a run stopped early: its tokens/s is of part of its trace.", ""]
    return lines


def _largest_batch(roof: Mapping[str, Any]) -> int:
    batch = roof.get("max_batch", roof.get("max_batch_in_kv"))
    return batch if isinstance(batch, int) and not isinstance(batch, bool) else 0


def _roofline_text(series: Mapping[str, Sequence[BatchRow]]) -> str:
    roofs = [rf for rows in series.values() for r in rows
             if (rf := roofline_of(r.cell)) is not None]
    if not roofs:
        return ""
    # the cell that runs the largest batch: the others' caps stop short of what it shows
    roof = max(roofs, key=lambda rf: _largest_batch(rf))
    ctx, ridge = roof.get("context_len"), roof.get("ridge_flop_per_byte")
    datasheet = roof.get("datasheet_ridge_flop_per_byte")
    where = (f"ridge {fmt_number(ridge)} FLOP/byte at the model's efficiencies, where its "
             f"bound turns; {fmt_number(datasheet)} at the datasheet's peaks" if datasheet
             else f"ridge {fmt_number(ridge)} FLOP/byte at the datasheet's peaks")
    head = (f"Roofline (the reference cost model, at the trace's mean decode context of "
            f"{fmt_int(ctx)} tokens; {where}): ")
    turn = roof.get("turn_batch_size")
    if turn is not None:
        return head + (f"decode turns from memory-bound to compute-bound at a running batch "
                       f"of {fmt_int(turn)}; the *roofline* column places each cap's mean "
                       "running batch.")
    in_kv, seqs = roof.get("max_batch_in_kv"), roof.get("max_num_seqs")
    limit = (f"the largest batch it runs, {fmt_int(seqs)} (its max_num_seqs; the KV cache "
             f"holds {fmt_int(in_kv)})" if isinstance(seqs, int) and isinstance(in_kv, int)
             and seqs < in_kv else f"the KV cache's limit of about {fmt_int(in_kv)} requests "
             "of that mean context (a batch of shorter ones runs larger)")
    return head + (f"decode stays memory-bound up to {limit} (intensity "
                   f"{fmt_number(roof.get('intensity_at_max_batch'))} FLOP/byte there). No "
                   "batch it runs is compute-bound: past the turn, reading each "
                   "request's KV and the per-request overheads grow with the batch, and "
                   "tokens/s flatten while every step is still memory-bound. The *roofline* "
                   "column says where each cap's mean running batch is: memory-bound for all.")
