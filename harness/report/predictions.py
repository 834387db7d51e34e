"""What a report says of its predicted cells: the overview's *Predicted* row (which cells are
predictions, and by what) and the table of how accurate each kind of prediction was measured
to be against published real-hardware figures. The wording of a prediction record is
``harness.prediction``'s; this module lays it out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.prediction import (
    KINDS,
    MEASURED_STATISTICS,
    OUTSIDE_NOT_SAID,
    SERVED,
    UNMEASURED_KINDS,
    Accuracy,
    Errors,
    accuracy,
    coverage_note,
    coverage_notes,
    coverage_outside,
    kind_coverage_note,
    prediction_text,
    predictor_text,
    recorded_prediction,
)
from harness.report.curves import CapacityRow, cell_setting
from harness.report.format import code, fmt_pct, table
from harness.report.runs import CellResult

ACCURACY_HEADING = "How accurate the predictions are"
ACCURACY_LINK = (f"[{ACCURACY_HEADING.lower()}]"
                 f"(#{ACCURACY_HEADING.lower().replace(' ', '-')})")


def prediction_row(cells: Sequence[CellResult]) -> str:
    """Which cells are predictions, and by what: simulated cells, and live cells whose server
    was the reference engine served (its ``/version`` answer, kept in the manifest's
    ``engine.version_probe``, carries the record). How accurate each kind of prediction was
    measured to be is the table ``prediction_accuracy_lines`` draws (linked from here); a
    record that quotes no accuracy says so here. Only cells with figures are named
    (``_with_figures``)."""
    groups: dict[str, list[str]] = {}
    linked = False
    for c in _with_figures(cells):
        found = recorded_prediction(c.manifest.get("engine"))
        if found is None:
            continue
        record, by = found
        if accuracy(record) is not None:
            text = f"{_bold('predicted')} {predictor_text(record, by=by, code=code)}"
            linked = True
        else:
            text = prediction_text(record, by=by, mark=_bold, code=code)
        groups.setdefault(text, []).append(code(c.name))
    if len(cells) > 1 and [len(names) for names in groups.values()] == [len(cells)]:
        text = f"every cell: {next(iter(groups))}"
    else:
        text = "<br>".join(f"{', '.join(names)}: {text}" for text, names in groups.items())
    if linked:
        text += (f"<br>Their measured accuracy: {ACCURACY_LINK}" if len(groups) > 1
                 else f" (measured accuracy: {ACCURACY_LINK})")
    return text


def _with_figures(cells: Sequence[CellResult]) -> list[CellResult]:
    """The cells with figures to call predicted: not a cell not run (whose folder may still
    hold an earlier run's manifest), nor one that ended before it measured anything."""
    return [c for c in cells if c.summary is not None and c.state != "not_run"]


def is_prediction(manifest: Mapping[str, Any]) -> bool:
    """A run whose timings are predictions (simulated, or the reference engine served over
    HTTP), from its manifest."""
    return recorded_prediction(manifest.get("engine")) is not None


def is_served_prediction(c: CellResult) -> bool:
    """A live cell whose server was the reference engine served over HTTP (its ``/version``
    answered with a prediction record): its timings are predictions too."""
    found = recorded_prediction(c.manifest.get("engine"))
    return found is not None and found[1] == SERVED


def mixes_kinds(cells: Sequence[CellResult]) -> bool:
    """Some of ``cells`` are predictions and some measurements."""
    predicted = [is_prediction(c.manifest) for c in cells]
    return any(predicted) and not all(predicted)


def row_labels(cells: Sequence[CellResult]) -> dict[str, str]:
    """Each cell's name as a table's row writes it, by name: a code span, and " (predicted)"
    after a predicted cell's when ``cells`` (the report's) mix predictions and measurements,
    so that a row's figures and its change against a measured baseline read as what they
    are. A wholly predicted report says so once, above its tables: its rows are not marked."""
    mixed = mixes_kinds(cells)
    return {c.name: code(c.name) + (" (predicted)" if mixed and is_prediction(c.manifest)
                                    else "") for c in cells}


def predicted_settings(rows: Sequence[CapacityRow], cells: Sequence[CellResult]) -> set[str]:
    """The settings (``CapacityRow.key``) among ``rows`` whose capacity rests on predicted
    cells (of that setting, or named as its evidence), when ``cells`` (the report's) mix
    predictions and measurements; none in a wholly predicted or wholly measured report."""
    if not mixes_kinds(cells):
        return set()
    return {r.key for r in rows
            if any(is_prediction(c.manifest) for c in cells
                   if cell_setting(c) == r.key or c.name in r.cells)}


# what predicted a simulated run that recorded no prediction record (an older batchlab's)
UNRECORDED = "the reference engine (the run recorded no prediction record)"


def predictor(engine: object) -> str | None:
    """What a run's figures were predicted with, from its manifest's ``engine``: "profile
    `x`" or "catalog coefficients" ("the reference engine ..." when it recorded no
    prediction record); None for a measurement."""
    found = recorded_prediction(engine)
    if found is None:
        return None
    record = found[0]
    if record is None:
        return UNRECORDED
    return (f"profile {code(str(record['profile']))}" if record.get("profile")
            else "catalog coefficients")


def _published_text(acc: Accuracy) -> str:
    if not acc.held_out:
        return "not computed for the catalog"
    if acc.published is None:
        return ("none: every one's workload is partly unpublished" if acc.published_counted
                else "not recorded in the run")
    if acc.published.num_rows == acc.overall.num_rows:
        return "all of them"
    return f"{acc.published.text()} of {acc.published.num_rows}"


# a cell's coverage note: the record's whole words, and one note for each reason alone
_Coverage = tuple[str, list[str]]


@dataclass(frozen=True)
class _Group:
    """Cells predicted the same way, with the same recorded accuracy."""

    what: str  # "profile `x`", "catalog coefficients", ...
    # None: never measured (a calibrated profile), not recorded, or not known (``note``)
    accuracy: Accuracy | None
    note: str | None  # why no accuracy is quoted, from the record (a profile edited since)
    names: list[str]  # the cells, as code spans
    # cells whose model, GPU or data types are none of those the accuracy was measured on:
    # {cell: its record's words for it, and those words one reason each}
    # (``harness.prediction.coverage_note``, ``coverage_notes``): their error was never measured
    uncovered: dict[str, _Coverage] = field(default_factory=dict)
    # {kind: {cell: ...}}: the cells whose figures of that kind alone are of other models,
    # GPUs or data types (``harness.prediction.kind_coverage_note``), or all of them are
    uncovered_by_kind: dict[str, dict[str, _Coverage]] = field(default_factory=dict)


def _groups(cells: Sequence[CellResult]) -> list[_Group]:
    """The predicted cells among ``cells``, grouped by predictor and the accuracy their record
    quotes; runs recorded with other figures (an older profile) are groups of their own, and
    so are those whose accuracy was never measured, not recorded or is not known for a
    reason the record gives."""
    groups: dict[tuple[str, str, str | None], _Group] = {}
    for c in _with_figures(cells):
        found = recorded_prediction(c.manifest.get("engine"))
        if found is None:
            continue  # a measurement
        record, by = found
        acc = accuracy(record)
        what = predictor(c.manifest.get("engine")) or UNRECORDED
        donor = ((record or {}).get("accuracy") or {}).get("coefficients_from")
        if donor:
            what += f" (coefficients of {code(str(donor))})"
        if by == SERVED:
            what += ", served over HTTP"
        note = _accuracy_note(record) if acc is None else None
        group = groups.setdefault((what, repr(acc), note), _Group(what, acc, note, []))
        group.names.append(code(c.name))
        uncovered = coverage_note(record) if acc is not None else None
        if uncovered:
            group.uncovered[code(c.name)] = (uncovered, coverage_notes(record))
        for kind in KINDS if acc is not None else ():
            note = kind_coverage_note(record, kind)
            if note:
                group.uncovered_by_kind.setdefault(kind, {})[code(c.name)] = (
                    note, coverage_notes(record, kind))
    return list(groups.values())


def _uncovered(groups: Sequence[_Group], cells: Sequence[CellResult], kind: str | None = None
               ) -> list[tuple[str, str]]:
    """(whose, the record's words) for the cells among ``cells`` whose model, GPU or data types
    are none of those their prediction's accuracy was measured on: ("`a`, `b`", "none of the
    published figures its accuracy was measured on is of this model ..."), in the cells'
    order. ``kind``: of that kind's figures (throughput, TTFT, ...) instead.

    Any one reason leaves a cell's error unmeasured, so a reason several cells share is said
    once for all of them ("every cell": "... is of this GPU h100-sxm ...") and the others
    they have go unsaid; a cell that shares none keeps its record's whole words, all of its
    reasons, as do cells whose whole words are the same."""
    found: dict[str, _Coverage] = {}
    for g in groups:
        found.update(g.uncovered if kind is None else g.uncovered_by_kind.get(kind, {}))
    said: dict[str, list[str]] = {}
    left = dict(found)
    while left:  # the reason most of the cells left share, while one is shared
        counts: dict[str, int] = {}
        for _, each in left.values():
            for note in dict.fromkeys(each):
                counts[note] = counts.get(note, 0) + 1
        note, count = max(counts.items(), key=lambda item: item[1])  # the first, on a tie
        if count < 2:
            break
        said[note] = [name for name, (_, each) in left.items() if note in each]
        for name in said[note]:
            del left[name]
    for name, (whole, _) in left.items():
        said.setdefault(whole, []).append(name)
    order = {name: i for i, name in enumerate(found)}
    return [("every cell" if len(names) == len(cells) > 1 else ", ".join(names), note)
            for note, names in sorted(said.items(), key=lambda item: order[item[1][0]])]


def _accuracy_note(record: Mapping[str, Any] | None) -> str | None:
    """The reason a record gives for quoting no accuracy (``accuracy_note``), if any."""
    note = (record or {}).get("accuracy_note")
    return str(note) if note else None


def _never_text(g: _Group, names: str = "") -> str:
    """Why a group quotes no accuracy, the same words as the *Predicted* row's; of the cells
    ``names`` when given ("... for `a`")."""
    whose = f" for {names}" if names else ""
    if g.what == UNRECORDED:
        return f"its accuracy not recorded in the run{whose}"
    if g.note:
        return f"its accuracy is not known{whose}: {g.note}"
    return f"never measured against published figures{whose}"


def prediction_accuracy_lines(cells: Sequence[CellResult]) -> list[str]:
    """A table of each kind of prediction among ``cells`` (a profile, or the catalog's
    coefficients) with the error it was measured to have on published real-hardware figures,
    over all of them and for each kind of figure (throughput, TTFT, TPOT/ITL, E2E); a kind of
    prediction that quotes no accuracy is a row that says why."""
    groups = _groups(cells)
    if not groups:
        return []
    rows = []
    for g in groups:
        names = "every cell" if len(g.names) == len(cells) > 1 else ", ".join(g.names)
        acc = g.accuracy
        if acc is None:
            rows.append([names, g.what, _never_text(g), "unknown", "–", *["–"] * len(KINDS)])
            continue
        held = "held-out " if acc.held_out else ""
        row = [names, g.what, f"{acc.overall.num_rows or '–'} {held}figures ({acc.doc})",
               acc.overall.text(), _published_text(acc)]
        for kind in KINDS:
            e = acc.by_kind.get(kind)
            row.append(f"{e.text()} of {e.basis()}{e.bias()}" if e is not None
                       else "no held-out figure" if kind in acc.unmeasured_kinds else "–")
        rows.append(row)
    # each column of errors says that it holds them: "median error" alone read as the row's
    # one figure, and "workload fully published" as a yes or no
    headers = ["cells", "predicted with", "measured on", "median error (worst), all figures",
               "median error (worst), workload fully published",
               *(f"{kind}: median error (worst)" for kind in KINDS)]
    return [f"### {ACCURACY_HEADING}", "",
            "Every number of a predicted cell is a prediction. Its error (predicted / "
            "published − 1; a run's duration as the throughput it implies) was measured on "
            "published real-hardware figures: a profile's on "
            "figures its fit never saw, the catalog coefficients' on every figure; the median "
            "and worst over all of them, over those whose workload is fully published, and "
            f"over each kind of figure. The published figures are {MEASURED_STATISTICS}: "
            "no p90, p99 or maximum, so a predicted tail percentile's error is not known; nor "
            f"is that of {UNMEASURED_KINDS}, which no published figure gives.", "",
            table(headers, rows, align=["l"] * len(headers)), "",
            *(line for whose, note in _uncovered_any_kind(groups, cells)
              for line in (f"For {whose}: {note}.", ""))]


def _uncovered_any_kind(groups: Sequence[_Group], cells: Sequence[CellResult]
                        ) -> list[tuple[str, str]]:
    """``_uncovered`` of the whole records, then of each kind of figure whose own figures
    alone are of other models or GPUs (a record's words once)."""
    out = _uncovered(groups, cells)
    said = {note for _, note in out}
    for kind in KINDS:
        out += [(whose, note) for whose, note in _uncovered(groups, cells, kind)
                if note not in said]
        said.update(note for _, note in out)
    return out


def tails_note(cells: Sequence[CellResult]) -> list[str]:
    """Above tables of predicted percentiles: the published figures their accuracy was
    measured on were no p90 or p99. [] without a predicted cell."""
    if not _predicted_names(cells):
        return []
    return [f"The published figures predictions were measured against are {MEASURED_STATISTICS}:"
            " no predicted p90 or p99 below was ever compared with a published figure, and the "
            "notes under each table give the error of a typical figure, not of a tail.", ""]


def kind_note(cells: Sequence[CellResult], kind: str, label: str) -> list[str]:
    """Under a table of ``label`` figures (TTFT, TPOT, ...; ``kind`` one of ``KINDS``): how
    far the predicted cells' figures of that kind were measured to miss published ones, or
    that they never were; and of the cells whose model or GPU is none of those figures',
    that the error quoted does not hold for them. [] without a predicted cell."""
    parts, unmeasured, never = [], [], []
    quoted: list[_Group] = []  # the groups whose error of this kind is quoted
    for g in _groups(cells):
        acc = g.accuracy
        names = "every cell" if len(g.names) == len(cells) > 1 else ", ".join(g.names)
        e = acc.by_kind.get(kind) if acc is not None else None
        if acc is None:
            never.append(_never_text(g, names))
        elif e is not None:
            held = " held-out" if acc.held_out else ""
            # which way they erred, when most did one way: the median |error| hides it
            parts.append(f"{names} a median {fmt_pct(e.median)} off (worst "
                         f"{fmt_pct(e.worst)}) over {e.num_rows}{held} figures"
                         f"{e.sources_text()}{e.bias()}")
            quoted.append(g)
        elif kind in acc.unmeasured_kinds:
            unmeasured.append(names)
    if unmeasured:
        whose = "any cell" if unmeasured == ["every cell"] else ", ".join(unmeasured)
        parts.append(f"no held-out {kind} figure for {whose}")
    parts += never
    if not parts:
        return []
    # an error quoted for a cell must not read as holding where it was never measured
    parts += [f"but {note}" if whose == "every cell" or len(cells) == 1
              else f"but for {whose}, {note}"
              for whose, note in _uncovered(quoted, cells, kind)]
    return [f"How far predicted {label} was measured to miss published {kind} figures: "
            + "; ".join(parts) + f" ({ACCURACY_LINK}).", ""]


def kind_note_again(cells: Sequence[CellResult], kind: str, label: str, first: str
                    ) -> list[str]:
    """Under a second table of one kind of figure (ITL after TPOT: both are checked against
    the same TPOT/ITL figures): that ``kind_note`` under the ``first`` table holds, rather than
    its words again. [] without a predicted cell."""
    if not _predicted_names(cells):
        return []
    return [f"How far predicted {label} was measured to miss published {kind} figures: as said "
            f"under the {first} table above, the same figures ({ACCURACY_LINK}).", ""]


def _predicted_whose(cells: Sequence[CellResult],
                     report_cells: Sequence[CellResult] | None) -> str | None:
    """The predicted cells among ``cells``: "every cell" when each of the report's
    (``report_cells``, else ``cells``) is one, else their names; None when none is."""
    names = _predicted_names(cells)
    if not names:
        return None
    every = len(report_cells if report_cells is not None else cells)
    return "every cell" if len(names) == every else ", ".join(names)


def noted_elsewhere(cells: Sequence[CellResult], what: str, where: str, *,
                    report_cells: Sequence[CellResult] | None = None) -> list[str]:
    """Under a table that repeats figures other tables show with their accuracy notes (the
    batch-size table's TPOT and output tokens/s): that they are predicted, and where their
    measured error is said, rather than those notes again. ``report_cells`` as for
    ``unmeasured_note``. [] without a predicted cell."""
    whose = _predicted_whose(cells, report_cells)
    if whose is None:
        return []
    return [f"The {what} of {whose} are predicted, as in {where}, under which their measured "
            f"error is said ({ACCURACY_LINK}).", ""]


def unmeasured_note(cells: Sequence[CellResult], what: str, *,
                    report_cells: Sequence[CellResult] | None = None) -> list[str]:
    """Under a table of a kind of figure no published measurement gives (preemptions, the
    prefix cache's hits, per-class latencies, batch sizes): that the predicted cells' are
    predictions whose error is not known. ``cells``: the table's; ``report_cells``: the
    report's, when the table shows only some of them (a live cell whose engine counted no
    prefix-cache hits): "every cell" only when each of those is predicted, else the predicted cells
    by name. [] without a predicted cell."""
    whose = _predicted_whose(cells, report_cells)
    if whose is None:
        return []
    return [f"{what} of {whose} are predicted, and no published real-hardware figure of "
            f"their kind was ever compared with them: their error is not known "
            f"({ACCURACY_LINK}).", ""]


def predicted_text(cells: Sequence[CellResult]) -> str | None:
    """"Every figure is **predicted** ..." or "Figures of `a`, `b` are **predicted** ...", for
    text that quotes the cells' numbers away from their tables (findings, plots), with the
    cells whose model or GPU is none of those their prediction's accuracy was measured on;
    None without a predicted cell."""
    groups = _groups(cells)
    names = [n for g in groups for n in g.names]
    if not names:
        return None
    whose = ("Every figure here is" if len(names) == len(cells)
             else f"Figures of {', '.join(names)} are")
    uncovered = _uncovered(groups, cells)
    if len(uncovered) == 1 and len(names) == len(cells) and (
            len(cells) == 1 or uncovered[0][0] == "every cell"):
        # of every cell: "but none of ... its error here was never measured"
        but = f"; but {uncovered[0][1]}"
    else:
        but = "".join(f"; {'but ' if i == 0 else ''}for {of}, {note}"
                      for i, (of, note) in enumerate(uncovered))
    return (f"{whose} {_bold('predicted')} by the reference engine, not measured on "
            f"hardware ({ACCURACY_LINK}){but}.")


# the latencies an SLO bounds, in the words of the tables that show them
_SLO_LATENCIES = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E latency"}


def derived_note(cells: Sequence[CellResult], what: str, *, pace: bool = False,
                 slo: Mapping[str, Any] | None = None) -> list[str]:
    """Under a table of figures computed from predicted latencies (goodput, SLO attainment,
    capacity at SLO): that they are predicted too, where their inputs' error is, and that they
    were never compared with a published figure themselves. ``pace``: they rest on whether the
    engine kept pace with its arrivals too (a capacity), that is on predicted throughput.
    ``slo``: the SLO, whose latencies are named (else the cells' summaries')."""
    names = _predicted_names(cells)
    if not names:
        return []
    whose = "every cell" if len(names) == len(cells) else ", ".join(names)
    bounds = _slo_latencies(slo, cells)
    latencies = " and ".join(bounds) if len(bounds) < 3 else "TTFT, TPOT and E2E latency"
    inputs = (f"rest on predicted {latencies} (which requests met the SLO) and on predicted "
              "throughput (whether the engine kept pace with its arrivals)" if pace
              else f"count the requests whose predicted {latencies} met the SLO")
    tables = [*bounds, "throughput"] if pace else bounds
    listed = (", ".join(tables[:-1]) + " and " + tables[-1]) if len(tables) > 1 else tables[0]
    return [f"{what} of {whose} are predicted: they {inputs}. How far those were "
            f"measured to miss: the notes under the {listed} "
            f"table{'s' if len(tables) > 1 else ''}, and "
            f"{ACCURACY_LINK}; no published figure of this kind was compared with them "
            "themselves.", ""]


def _slo_latencies(slo: Mapping[str, Any] | None, cells: Sequence[CellResult]) -> list[str]:
    """The latencies ``slo`` bounds (else the SLO any of ``cells``' summaries was computed
    under), in ``_SLO_LATENCIES``' order; all three when none says."""
    keys: set[str] = set(slo or {})
    if not keys:
        for c in cells:
            recorded = (c.summary or {}).get("slo")
            keys.update(recorded if isinstance(recorded, Mapping) else ())
    named = [word for key, word in _SLO_LATENCIES.items() if key in keys]
    return named or list(_SLO_LATENCIES.values())


def short_of_error(c: CellResult, value: float, limit: float, kind: str) -> Errors | None:
    """The measured error of ``kind`` that a predicted cell's ``value``, within ``limit``, is
    within it by less than (its median): the case ``margin_caveat`` says "and only ... within
    the limit" of. None for a measured cell, an error not known or not measured on figures
    like the cell's, or a margin at least that error."""
    found = recorded_prediction(c.manifest.get("engine"))
    if found is None or limit <= 0 or kind_coverage_note(found[0], kind):
        return None
    acc = accuracy(found[0])
    error = acc.by_kind.get(kind) if acc is not None else None
    if error is None or error.median is None or 1 - value / limit >= error.median:
        return None
    return error


def margin_caveat(c: CellResult, value: float, limit: float, kind: str) -> str:
    """A phrase for a finding that a predicted figure of ``kind`` (one of ``KINDS``) is within
    ``limit``: when the margin is smaller than that kind's measured median error, the finding
    may not hold on hardware; '' for a measured cell, or a margin wider than the error. An
    error measured only on other models, GPUs or data types than the cell's (the record's
    coverage: ``kind_coverage_note``) is no error known for it."""
    found = recorded_prediction(c.manifest.get("engine"))
    if found is None or limit <= 0:
        return ""
    record = found[0]
    acc = accuracy(record)
    error = acc.by_kind.get(kind) if acc is not None else None
    margin = 1 - value / limit
    if error is not None and error.median is not None and kind_coverage_note(record, kind):
        outside = coverage_outside(record, kind)
        return (f"; predicted, {fmt_pct(margin)} within the limit, with an error never "
                f"measured on predicted {kind} figures like its own (none of them "
                f"{outside or OUTSIDE_NOT_SAID})")
    if error is None or error.median is None:
        return (f"; predicted, {fmt_pct(margin)} within the limit, with an error "
                f"{_unknown_error_text(record, acc, kind)}")
    if margin >= error.median:
        return ""
    said = (f"; predicted, and only {fmt_pct(margin)} within the limit, less than the median "
            f"error of {fmt_pct(error.median)} measured for predicted {kind} figures")
    rows, over = error.num_rows, error.num_over
    if rows and over is not None and 2 * (rows - over) > rows:  # biased low: at risk
        # (the kinds here are latencies: a figure predicted low is one the hardware exceeds)
        return (said + f", which came out low in {rows - over} of {rows}: it is more likely "
                "than not to exceed the limit on hardware")
    return said + ", so it may not hold on hardware"


def _unknown_error_text(record: Mapping[str, Any] | None, acc: Accuracy | None,
                        kind: str) -> str:
    """Why a predicted figure of ``kind`` has no measured error: "not recorded in the run",
    "not known: " and the record's ``accuracy_note``, or "never measured for predicted
    TTFT"."""
    if record is None:
        return "not recorded in the run"
    note = _accuracy_note(record) if acc is None else None
    return f"not known: {note}" if note else f"never measured for predicted {kind}"


def _predicted_names(cells: Sequence[CellResult]) -> list[str]:
    """The predicted cells among ``cells``, as code spans."""
    return [n for g in _groups(cells) for n in g.names]


def _bold(text: str) -> str:
    return f"**{text}**"
