"""What a predicted number says about itself, in words: the one wording of a prediction record
(``adapters.reference.prediction_record``) for the report and the command line.

    predicted by the reference engine with profile NAME; on N published figures its fit never
    saw, it missed by a median M% (worst W%, docs/fidelity.md); by kind of figure: throughput
    M1% (worst W1%) of N1, TTFT ...; no held-out E2E figure

A profile that borrows another's coefficients (no training figures of its own engine and GPU)
says whose, after its name.

Reads records only (run folders, a served engine's ``/version``): nothing here imports an
engine, so the report can use it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# The kinds of figure a prediction's accuracy is stated for, in this order: what a report shows
# (harness.published.rows.METRIC_KINDS says which published metric is which).
KINDS = ("throughput", "TTFT", "TPOT/ITL", "E2E")

# What the published figures a prediction's accuracy was measured on are (every metric a
# published row may have, harness.published.rows.METRIC_KINDS: a test keeps the two in step),
# and what no published figure gives: a predicted number of these kinds has no measured error.
MEASURED_STATISTICS = "means, medians and whole-run rates"
UNMEASURED_KINDS = ("preemption counts, prefix-cache hits, per-class latencies, batch sizes "
                    "and capacities at an SLO")

# under a predicted capacity: what its error is (the command line, capacity.json)
CAPACITY_CAVEAT = ("a capacity at an SLO is itself a prediction, whose error no published "
                   "figure measures: the errors above are those of the throughput and latencies "
                   "it is made from")

SIMULATED = "by the reference engine"
# a live run against ``batchlab serve reference``: the server sleeps each step's predicted time
SERVED = ("by the reference engine served over HTTP (step times from its cost model; HTTP and "
          "client time measured)")


@dataclass(frozen=True)
class Errors:
    """Median and worst |error| over ``num_rows`` published figures (predicted / published - 1;
    a run's duration as the throughput it implies: harness.published.check.CheckedRow)."""

    median: float | None
    worst: float | None
    num_rows: int | None
    sources: tuple[str, ...] = ()  # the published sources the figures come from (when known)
    # how many were predicted above the published figure (None: not recorded)
    num_over: int | None = None

    def text(self) -> str:
        """"9.4% (worst 84.8%)"."""
        return f"{_pct(self.median)} (worst {_pct(self.worst)})"

    def basis(self) -> str:
        """"6 from one source (nim-llama-3.3-70b-1.8.0)", "40 from 3 sources", or "6" when
        the record names no sources: how many figures, and how broad their basis is (a single
        source's figures say little of other models, dtypes or loads)."""
        return ("–" if self.num_rows is None else str(self.num_rows)) + self.sources_text()

    def sources_text(self) -> str:
        """" from one source (x)", " from 3 sources", or "" when not recorded."""
        if not self.sources:
            return ""
        if len(self.sources) == 1:
            return f" from one source ({self.sources[0]})"
        return f" from {len(self.sources)} sources"

    def bias(self) -> str:
        """" (7 of 8 predicted high)" when at least three quarters of four or more figures
        erred the same way: a bias the median |error| hides (a throughput predicted high is
        an optimistic one; a latency predicted high, a pessimistic one). '' otherwise."""
        n, over = self.num_rows, self.num_over
        if not n or over is None or n < 4:
            return ""
        if over >= 0.75 * n:
            return f" ({over} of {n} predicted high)"
        if n - over >= 0.75 * n:
            return f" ({n - over} of {n} predicted low)"
        return ""

    @classmethod
    def of(cls, stats: object, prefix: str = "") -> Errors | None:
        """From a record's ``{prefix}median_abs_error``, ``worst_...``, ``num_rows``,
        ``sources``."""
        if not isinstance(stats, Mapping) or stats.get(f"{prefix}median_abs_error") is None:
            return None
        sources = stats.get(f"{prefix}sources")
        over = stats.get(f"{prefix}num_over")
        return cls(stats.get(f"{prefix}median_abs_error"), stats.get(f"{prefix}worst_abs_error"),
                   stats.get(f"{prefix}num_rows"),
                   tuple(str(x) for x in sources) if isinstance(sources, list) else (),
                   over if isinstance(over, int) and not isinstance(over, bool) else None)


@dataclass(frozen=True)
class Accuracy:
    """How accurate a kind of prediction was measured to be, from its prediction record:
    a profile's figures its fit never saw (``held_out``), or the catalog's over every
    published figure."""

    held_out: bool
    overall: Errors
    # the same over the held-out figures whose workload is fully published (None: none are,
    # or the record predates that count: ``published_counted``)
    published: Errors | None
    by_kind: dict[str, Errors]  # KINDS order, the kinds there are figures of
    doc: str  # where the figures are: docs/fidelity.md or docs/published.md
    # the record says how many held-out figures have a fully published workload, none
    # included (False: the catalog, or a record written before that was counted)
    published_counted: bool = False

    @property
    def unmeasured_kinds(self) -> list[str]:
        """Kinds of figure no held-out figure was of ([] for the catalog, or an old record
        without kinds)."""
        if not self.held_out or not self.by_kind:
            return []
        return [kind for kind in KINDS if kind not in self.by_kind]

    def figures_text(self) -> str:
        """"44 published figures its fit never saw" or "197 published figures"."""
        n = self.overall.num_rows
        figures = f"{n} published figures" if n else "published figures"
        return figures + (" its fit never saw" if self.held_out else "")


def accuracy(prediction: object) -> Accuracy | None:
    """The measured accuracy a prediction record quotes; None when it quotes none (no
    record, a profile never measured against published figures, or one changed since its
    accuracy was measured: the record's ``accuracy_note`` says so)."""
    if not isinstance(prediction, Mapping) or not isinstance(prediction.get("accuracy"),
                                                            Mapping):
        return None
    acc: Mapping[str, Any] = prediction["accuracy"]
    held = bool(prediction.get("profile"))
    prefix = "held_out_" if held else ""
    overall = Errors.of(acc, prefix)
    if overall is None:
        return None
    published = Errors.of(acc, "held_out_published_") if held else None
    # a record written since they were counted has the key, None when there are none
    # (adapters.reference.cost_model.profile_accuracy); an older one lacks it
    counted = held and "held_out_published_num_rows" in acc
    raw = acc.get("held_out_by_kind" if held else "by_kind")
    kinds = raw if isinstance(raw, Mapping) else {}
    by_kind = {kind: e for kind in KINDS if (e := Errors.of(kinds.get(kind))) is not None}
    return Accuracy(held, overall, published, by_kind,
                    "docs/fidelity.md" if held else "docs/published.md", counted)


def predictor_text(prediction: object, *, by: str = SIMULATED,
                   code: Callable[[str], str] = str) -> str:
    """"by the reference engine with profile NAME (coefficients borrowed from ...)", or
    "... with the catalog's datasheet coefficients"; ``by`` alone without a record."""
    if not isinstance(prediction, Mapping):
        return by
    if not prediction.get("profile"):
        return by + " with the catalog's datasheet coefficients"
    text = f"{by} with profile {code(str(prediction['profile']))}"
    acc = prediction.get("accuracy")
    donor = acc.get("coefficients_from") if isinstance(acc, Mapping) else None
    if donor:
        text += f" (coefficients borrowed from {code(str(donor))}: no training figures of its own)"
    return text


def prediction_text(prediction: object, *, by: str = SIMULATED,
                    mark: Callable[[str], str] = str, code: Callable[[str], str] = str) -> str:
    """``prediction``: a prediction record, or None for a run that recorded none. ``mark``
    sets off the word "predicted" and ``code`` a profile's name (the report's bold and code
    spans; plain text by default)."""
    head = f"{mark('predicted')} {predictor_text(prediction, by=by, code=code)}"
    if not isinstance(prediction, Mapping):
        return head + " (accuracy not recorded in this run)"
    acc = accuracy(prediction)
    if acc is None:
        note = prediction.get("accuracy_note")
        return head + ((f"; its accuracy is not known: {note}" if note else
                        "; its accuracy was not measured against published figures")
                       if prediction.get("profile") else "")
    comma = "," if acc.held_out else ""
    text = (head + f"; on {acc.figures_text()}{comma} it missed by a median "
            f"{_pct(acc.overall.median)} (worst {_pct(acc.overall.worst)}")
    text += _published(acc) + f", {acc.doc})" + _by_kind(acc)
    note = coverage_note(prediction)
    text += f"; but {note}" if note else _kinds_uncovered(prediction, list(acc.by_kind))
    return text + _settings_text(prediction)


def _settings_text(prediction: Mapping[str, Any]) -> str:
    """"; it ran with max_num_seqs 32 where its profile's default is 1024 (...)": the engine
    settings of the run that are not its profile's defaults, which the accuracy was measured
    with (``settings_not_defaults``); '' when there are none."""
    differ = prediction.get("settings_not_defaults")
    if not isinstance(differ, Mapping) or not differ:
        return ""
    said = [f"{key} {_setting(entry.get('value'))} where its profile's default is "
            f"{_setting(entry.get('default'))}" for key, entry in differ.items()
            if isinstance(entry, Mapping)]
    if not said:
        return ""
    return ("; it ran with " + ", ".join(said) + " (that accuracy was measured with the "
            "profile's defaults, save where a published figure's own run set another)")


def _setting(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _kinds_uncovered(prediction: Mapping[str, Any], kinds: list[str]) -> str:
    """"; but none of the published TTFT or E2E figures its accuracy was measured on is of
    this GPU a100-80gb: their errors here were never measured", for the kinds among ``kinds``
    whose own figures are none of the run's model, GPU, weights dtype or KV-cache dtype ('' when
    there is none)."""
    by_outside: dict[str, list[str]] = {}
    for kind in kinds:
        outside = _kind_entry(prediction, kind).get("outside")
        if isinstance(outside, str) and outside:
            by_outside.setdefault(_predicate(outside), []).append(kind)
    text = ""
    for predicate, names in by_outside.items():
        which = "their errors here were" if len(names) > 1 else "that error here was"
        text += (f"; but none of the published {_or(names)} figures its accuracy was measured "
                 f"on {predicate}: {which} never measured")
    return text


def _predicate(outside: str) -> str:
    """A ``coverage_by_kind`` entry's ``outside`` as said after "none of the figures": "is of
    this GPU a100-80gb", "has fp8 weights"; a record written before data types were covered
    names only what they are not of ("GPU a100-80gb")."""
    return outside if outside.startswith(("is ", "has ")) else f"is of this {outside}"


def coverage_note(prediction: object) -> str | None:
    """"none of the published figures its accuracy was measured on is of this GPU h100-pcie
    (...): its error here was never measured" (or "... has fp8 weights (they are bf16) ..."),
    when the prediction's model, GPU, weights dtype or KV-cache dtype is none of those its
    accuracy was measured on (``adapters.reference.prediction``); else None."""
    if not isinstance(prediction, Mapping):
        return None
    note = prediction.get("coverage_note")
    return note if isinstance(note, str) and note else None


def kind_coverage_note(prediction: object, kind: str) -> str | None:
    """``coverage_note`` for the error quoted of one kind of figure (``KINDS``): the whole
    record's, or "none of the published TTFT figures its accuracy was measured on is of this
    GPU a100-80gb (...)" (or "... has fp8 weights (...)") when that kind's figures alone are
    none of this model, GPU, weights dtype or KV-cache dtype."""
    note = coverage_note(prediction)
    if note is not None or not isinstance(prediction, Mapping):
        return note
    kind_note = _kind_entry(prediction, kind).get("note")
    return kind_note if isinstance(kind_note, str) and kind_note else None


def _kind_entry(prediction: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    """A record's ``coverage_by_kind`` entry of ``kind`` ({} when it has none)."""
    by_kind = prediction.get("coverage_by_kind")
    entry = by_kind.get(kind) if isinstance(by_kind, Mapping) else None
    return entry if isinstance(entry, Mapping) else {}


# said after "none of them" of a record that does not say what its figures are not of apart
# from its note (an older batchlab's)
OUTSIDE_NOT_SAID = "is of its model, GPU and data types all at once"


def coverage_outside(prediction: object, kind: str) -> str | None:
    """What none of the published figures of ``kind`` a prediction's accuracy was measured on
    is or has, when that leaves its error unmeasured (``kind_coverage_note``): "is of this
    model llama-3.1-8b nor has fp8 weights", to say after "none of them"; None when the figures
    cover the run, or the record (an older batchlab's) does not say it apart from its note."""
    if not isinstance(prediction, Mapping) or kind_coverage_note(prediction, kind) is None:
        return None
    outside = (prediction.get("coverage_outside") if coverage_note(prediction) is not None
               else _kind_entry(prediction, kind).get("outside"))
    return _predicate(outside) if isinstance(outside, str) and outside else None


def coverage_notes(prediction: object, kind: str | None = None) -> list[str]:
    """``coverage_note`` (``kind``: ``kind_coverage_note``) split into one note for each thing
    the figures are not of ("none of the ... is of this GPU h100-sxm (...): its error here was
    never measured", then "... has fp8 weights ..."), any of which alone leaves the error
    unmeasured: a report says once the one that several cells share. [the whole note] for a
    record written before the notes were kept one by one; [] when the figures cover the run."""
    whole = coverage_note(prediction) if kind is None else kind_coverage_note(prediction, kind)
    if whole is None or not isinstance(prediction, Mapping):
        return []
    each = (prediction.get("coverage_each") if kind is None or coverage_note(prediction)
            is not None else _kind_entry(prediction, kind).get("each"))
    if isinstance(each, list) and each and all(isinstance(n, str) and n for n in each):
        return list(each)
    return [whole]


def recorded_prediction(engine: object) -> tuple[Mapping[str, Any] | None, str] | None:
    """A run's prediction record from its manifest's ``engine`` (None: a simulated run that
    recorded none) and by what it was made (``SIMULATED``, or ``SERVED``: a live run whose
    server was the reference engine served over HTTP, its ``/version`` answer kept in
    ``engine.version_probe``); None for a measurement of a real engine."""
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


def summary_prediction(engine: object) -> dict[str, Any] | None:
    """What ``summary.json`` says of a run whose figures are predictions, from its manifest's
    ``engine`` (``recorded_prediction``): ``text`` (``prediction_text``'s words), ``served``
    (the reference engine served over HTTP, its HTTP and client time measured) and
    ``record`` (the prediction record, None when the run recorded none). None for a run
    measured on a real engine: a job that reads only the summary can tell the two apart."""
    found = recorded_prediction(engine)
    if found is None:
        return None
    record, by = found
    return {"text": prediction_text(record, by=by), "served": by == SERVED,
            "record": dict(record) if record is not None else None}


def headline_caveat(prediction: object) -> str | None:
    """Under a headline of predicted figures (p99s, a preemption count, SLO attainment): the
    accuracy quoted is that of the statistics published figures give, not of those. None
    when the record quotes no accuracy (its text says so already)."""
    if accuracy(prediction) is None:
        return None
    return (f"that accuracy was measured on {MEASURED_STATISTICS}: no predicted p99, "
            "preemption count or SLO attainment was ever compared with a published figure")


def prediction_words(manifest: Mapping[str, Any]) -> str | None:
    """What a run's figures are, in ``prediction_text``'s words (the line ``simulate`` prints
    under its figures), from its manifest; None for a run measured on a real engine."""
    found = recorded_prediction(manifest.get("engine"))
    return None if found is None else prediction_text(found[0], by=found[1])


def _published(acc: Accuracy) -> str:
    """"; 9.1% (worst 84.8%) on the 42 whose workload is fully published", "; none of them
    with a fully published workload", or '' when that is all of them or was not counted."""
    if acc.published is None:
        return "; none of them with a fully published workload" if acc.published_counted else ""
    if acc.published.num_rows == acc.overall.num_rows:
        return ""
    return (f"; {acc.published.text()} on the {acc.published.num_rows} whose workload is "
            "fully published")


def _by_kind(acc: Accuracy) -> str:
    """"; by kind of figure: throughput 5.9% (worst 21.4%) of 26, TTFT ...": the error of
    each kind (``KINDS``) the record has, and the kinds no held-out figure was of. '' for a
    record without kinds (written before they were recorded)."""
    if not acc.by_kind:
        return ""
    missing = _or(acc.unmeasured_kinds)
    gap = f"no held-out {missing} figure" if missing else ""
    if len(acc.by_kind) == 1:  # its figures are the ones above
        kind, e = next(iter(acc.by_kind.items()))
        return f"; all of them {kind} figures{e.bias()}" + (f": {gap}" if gap else "")
    parts = [f"{kind} {e.text()} of {e.basis()}{e.bias()}" for kind, e in acc.by_kind.items()]
    return "; by kind of figure: " + ", ".join(parts) + (f"; {gap}" if gap else "")


def _or(words: list[str]) -> str:
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else "".join(words)


def _pct(fraction: object) -> str:
    """An error as a percentage, as the report writes percentages (``fmt_pct``)."""
    if not isinstance(fraction, int | float) or isinstance(fraction, bool) or not math.isfinite(
            fraction):
        return "–"
    pct = fraction * 100
    return f"{pct:.0f}%" if pct in (0, 100) else f"{pct:.1f}%"
