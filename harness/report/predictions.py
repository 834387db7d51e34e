"""What a report says of its predicted cells: the overview's *Predicted* row (which cells are
predictions, and by what) and the table of how accurate each kind of prediction was measured
to be against published real-hardware figures. The wording of a prediction record is
``harness.prediction``'s; this module lays it out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.prediction import (
    KINDS,
    SERVED,
    SIMULATED,
    Accuracy,
    accuracy,
    prediction_text,
    predictor_text,
)
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
    record that quotes no accuracy says so here."""
    groups: dict[str, list[str]] = {}
    linked = False
    for c in cells:
        found = _prediction_of(c.manifest.get("engine"))
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


def is_prediction(manifest: Mapping[str, Any]) -> bool:
    """A run whose timings are predictions (simulated, or the reference engine served over
    HTTP), from its manifest."""
    return _prediction_of(manifest.get("engine")) is not None


def is_served_prediction(c: CellResult) -> bool:
    """A live cell whose server was the reference engine served over HTTP (its ``/version``
    answered with a prediction record): its timings are predictions too."""
    found = _prediction_of(c.manifest.get("engine"))
    return found is not None and found[1] == SERVED


def _prediction_of(engine: object) -> tuple[Mapping[str, Any] | None, str] | None:
    """The cell's prediction record (None: a simulated run that recorded none) and by what
    it was made (``SIMULATED`` or ``SERVED``); None for a measurement of a real engine."""
    if not isinstance(engine, Mapping):
        return None
    if engine.get("mode") == "simulated":
        record = engine.get("prediction")
        return (record if isinstance(record, Mapping) else None), SIMULATED
    probe = engine.get("version_probe")
    body = probe.get("body") if isinstance(probe, Mapping) else None
    if isinstance(body, Mapping) and isinstance(body.get("prediction"), Mapping):
        return body["prediction"], SERVED
    return None


def _published_text(acc: Accuracy) -> str:
    if not acc.held_out:
        return "not computed for the catalog"
    if acc.published is None:
        return "none: every one's workload is partly unpublished"
    if acc.published.num_rows == acc.overall.num_rows:
        return "all of them"
    return f"{acc.published.text()} of {acc.published.num_rows}"


@dataclass(frozen=True)
class _Group:
    """Cells predicted the same way, with the same recorded accuracy."""

    what: str  # "profile `x`", "catalog coefficients", ...
    accuracy: Accuracy
    names: list[str]  # the cells, as code spans


def _groups(cells: Sequence[CellResult]) -> list[_Group]:
    """The predicted cells among ``cells`` whose record quotes a measured accuracy, grouped by
    predictor; runs recorded with other figures (an older profile) are groups of their own."""
    groups: dict[tuple[str, str], _Group] = {}
    for c in cells:
        found = _prediction_of(c.manifest.get("engine"))
        record, by = found if found is not None else (None, SIMULATED)
        acc = accuracy(record)
        if record is None or acc is None:
            continue
        what = (f"profile {code(str(record['profile']))}" if record.get("profile")
                else "catalog coefficients")
        donor = (record.get("accuracy") or {}).get("coefficients_from")
        if donor:
            what += f" (coefficients of {code(str(donor))})"
        if by == SERVED:
            what += ", served over HTTP"
        groups.setdefault((what, repr(acc)), _Group(what, acc, [])).names.append(code(c.name))
    return list(groups.values())


def prediction_accuracy_lines(cells: Sequence[CellResult]) -> list[str]:
    """A table of each kind of prediction among ``cells`` (a profile, or the catalog's
    coefficients) with the error it was measured to have on published real-hardware figures,
    over all of them and for each kind of figure (throughput, TTFT, TPOT/ITL, E2E)."""
    groups = _groups(cells)
    if not groups:
        return []
    rows = []
    for g in groups:
        acc = g.accuracy
        held = "held-out " if acc.held_out else ""
        row = ["every cell" if len(g.names) == len(cells) > 1 else ", ".join(g.names), g.what,
               f"{acc.overall.num_rows or '–'} {held}figures ({acc.doc})", acc.overall.text(),
               _published_text(acc)]
        for kind in KINDS:
            e = acc.by_kind.get(kind)
            row.append(f"{e.text()} of {e.num_rows}" if e is not None
                       else "no held-out figure" if kind in acc.unmeasured_kinds else "–")
        rows.append(row)
    headers = ["cells", "predicted with", "measured on", "median error",
               "workload fully published", *KINDS]
    return [f"### {ACCURACY_HEADING}", "",
            "Every number of a predicted cell is a prediction. Its error (predicted / "
            "published − 1) was measured on published real-hardware figures: a profile's on "
            "figures its fit never saw, the catalog coefficients' on every figure; the median "
            "and worst over all of them, over those whose workload is fully published, and "
            "over each kind of figure.", "",
            table(headers, rows, align=["l"] * len(headers)), ""]


def kind_note(cells: Sequence[CellResult], kind: str, label: str) -> list[str]:
    """Under a table of ``label`` figures (TTFT, TPOT, ...; ``kind`` one of ``KINDS``): how
    far the predicted cells' figures of that kind were measured to miss published ones, or
    that they never were. [] without a predicted cell whose record has kinds."""
    parts, unmeasured = [], []
    for g in _groups(cells):
        acc, names = g.accuracy, ", ".join(g.names)
        e = acc.by_kind.get(kind)
        if e is not None:
            held = " held-out" if acc.held_out else ""
            parts.append(f"{names} a median {fmt_pct(e.median)} off (worst "
                         f"{fmt_pct(e.worst)}) over {e.num_rows}{held} figures")
        elif kind in acc.unmeasured_kinds:
            unmeasured.append(names)
    if unmeasured:
        parts.append(f"no held-out {kind} figure for {', '.join(unmeasured)}")
    if not parts:
        return []
    return [f"How far predicted {label} was measured to miss published {kind} figures: "
            + "; ".join(parts) + f" ({ACCURACY_LINK}).", ""]


def predicted_text(cells: Sequence[CellResult]) -> str | None:
    """"Every figure is **predicted** ..." or "Figures of `a`, `b` are **predicted** ...", for
    text that quotes the cells' numbers away from their tables (findings, plots); None
    without a predicted cell."""
    names = _predicted_names(cells)
    if not names:
        return None
    whose = ("Every figure here is" if len(names) == len(cells)
             else f"Figures of {', '.join(names)} are")
    return (f"{whose} {_bold('predicted')} by the reference engine, not measured on "
            f"hardware ({ACCURACY_LINK}).")


def derived_note(cells: Sequence[CellResult], what: str) -> list[str]:
    """Under a table of figures computed from predicted latencies (goodput, SLO attainment,
    capacity at SLO): that they are predicted too, and where their inputs' error is."""
    names = _predicted_names(cells)
    if not names:
        return []
    whose = "every cell" if len(names) == len(cells) else ", ".join(names)
    return [f"{what} of {whose} are predicted: they count requests whose predicted TTFT and "
            "TPOT met the SLO (how far those were measured to miss: the notes under the TTFT "
            f"and TPOT tables, and {ACCURACY_LINK}).", ""]


def _predicted_names(cells: Sequence[CellResult]) -> list[str]:
    """The predicted cells among ``cells``, as code spans."""
    return [n for g in _groups(cells) for n in g.names]


def _bold(text: str) -> str:
    return f"**{text}**"
