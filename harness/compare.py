"""Two runs of the same scenario, cell against cell: what got worse, what got better.

``batchlab compare BEFORE AFTER`` (docs/compare.md) is a regression test between two nights of
a CI job. Each side is a scenario folder (its cells) or one run folder; cells pair by name,
every pair's headline metrics are set side by side with their change, judged by the metric's
direction, and ``Check`` thresholds turn a change into a failure::

    BEFORE ─┐                       ┌─► Pair per cell name ──► Change per metric ──► text table
            ├─ read_side ─► pair ───┼─► added / removed                          └─► JSON
    AFTER ──┘                       └─► Difference (not comparable)   Check ──► FailedCheck

Run folders are read by ``harness.report.runs`` (``status.json``, ``manifest.json``,
``summary.json``), so a cell that failed, was interrupted or has no summary reads the same
here as in a report. Numbers stay in the SI units of ``summary.json``; only the text is
formatted (``harness.report.format``).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from harness.manifest import MANIFEST_FILE
from harness.prediction import prediction_words
from harness.report.format import (
    MAX_PAIR_DIGITS,
    fmt_attainment,
    fmt_int,
    fmt_number,
    fmt_pair,
    fmt_pct,
    fmt_seconds,
    missing,
    sig,
    value_text,
)
from harness.report.predictions import is_prediction
from harness.report.runs import (
    SCENARIO_FILE,
    STATUS_FILE,
    CellResult,
    ScenarioFileError,
    client_limited,
    engine_config,
    get,
    load_run,
    load_scenario_dir,
    trace_digest,
    wrong_text,
)
from harness.results import REQUESTS_FILE, SUMMARY_FILE

FORMAT = "batchlab-compare"
# of the JSON below (``Comparison.as_json``); a change of its shape bumps it. 2: each side of a
# pair says whether its figures are predicted, and how accurate such predictions were measured
VERSION = 2
DEFAULT_SAME_WITHIN_PCT = 1.0

Better = Literal["lower", "higher"]
Judgement = Literal["worse", "better", "same", "n/a"]


class CompareError(ValueError):
    """Bad input: a folder that is not a run or scenario folder, nothing to pair, an unknown
    metric. The command line exits 2 on it."""


@dataclass(frozen=True, slots=True)
class Metric:
    """A headline figure of ``summary.json``: its dotted field name, which way is better, and
    its unit (``s``, ``tokens/s``, ``requests/s``, ``fraction``, ``requests``)."""

    name: str
    better: Better
    unit: str

    @property
    def is_count(self) -> bool:
        """A count is judged exactly: one more failed request is worse, whatever the
        tolerance."""
        return self.unit == "requests"

    def text(self, value: float | None) -> str:
        if self.unit == "s":
            return fmt_seconds(value)
        if self.unit == "tokens/s":
            return fmt_number(value, "tok/s")
        if self.unit == "requests/s":
            return fmt_number(value, "req/s")
        if self.name == "goodput.slo_attainment":  # cut, as everywhere: 98.95% is not 99.0%
            return fmt_attainment(value)
        if self.unit == "fraction":
            return fmt_pct(value)
        return fmt_int(value)

    def texts(self, before: float | None, after: float | None) -> tuple[str, str]:
        """Both values as ``text`` writes them, with as many more significant digits as it
        takes (``fmt_pair``) for two values that differ to read differently: a check that
        failed on 1.6420 s -> 1.6453 s does not read "1.64 s -> 1.64 s"."""
        if before is None or after is None or before == after or self.is_count:
            return self.text(before), self.text(after)
        return fmt_pair(before, after, self._text_with)

    def _text_with(self, value: float, digits: int) -> str:
        """``text`` of ``value`` with ``digits`` significant digits (``fmt_pair``'s writer):
        ``text`` itself at 3."""
        if digits <= 3 or self.is_count:
            return self.text(value)
        if self.unit == "s":
            return fmt_seconds(value, digits)
        if self.unit != "fraction":
            return fmt_number(value, "tok/s" if self.unit == "tokens/s" else "req/s", digits)
        # a percentage with more decimals; an attainment cut, as ``text`` writes it, never
        # rounded up onto a target it missed
        pct = value * 100
        if pct in (0, 100):
            return self.text(value)
        decimals = max(1, digits - 1 - math.floor(math.log10(abs(pct))))
        if self.name == "goodput.slo_attainment":
            pct = math.floor(pct * 10**decimals + 1e-9) / 10**decimals
        return f"{pct:.{decimals}f}%"


def _latency(name: str) -> Metric:
    return Metric(name, "lower", "s")


# The headline metrics, in the order the table lists them (docs/metrics.md defines each).
METRICS: tuple[Metric, ...] = (
    *(_latency(f"ttft_s.{p}") for p in ("p50", "p90", "p99")),
    *(_latency(f"tpot_s.{p}") for p in ("p50", "p90")),
    *(_latency(f"itl_s.{p}") for p in ("p50", "p90")),
    *(_latency(f"e2e_s.{p}") for p in ("p50", "p90")),
    Metric("throughput.output_tokens_per_s", "higher", "tokens/s"),
    Metric("throughput.requests_per_s", "higher", "requests/s"),
    Metric("goodput.requests_per_s", "higher", "requests/s"),
    Metric("goodput.slo_attainment", "higher", "fraction"),
    Metric("num_failed", "lower", "requests"),
)
_BY_NAME = {m.name: m for m in METRICS}
# computed under the run's SLO: not comparable between runs whose SLOs differ
SLO_METRICS = frozenset({"goodput.requests_per_s", "goodput.slo_attainment"})
# ``failures`` in summary.json counts failed requests by error kind; its total is num_failed
ALIASES = {"failures": "num_failed"}


def metric_named(name: str) -> Metric:
    """The headline metric called ``name`` (or an alias); CompareError naming the known ones."""
    found = _BY_NAME.get(ALIASES.get(name, name))
    if found is None:
        raise CompareError(f"unknown metric {name!r}; known: {', '.join(_BY_NAME)} "
                           f"(and {', '.join(f'{a} = {n}' for a, n in ALIASES.items())})")
    return found


@dataclass(frozen=True, slots=True)
class Check:
    """``--fail-if METRIC=PCT``: fail when a paired cell's metric got worse by more than
    ``max_worse_pct`` percent (for a count, 0 means any increase fails)."""

    metric: Metric
    max_worse_pct: float


@dataclass(frozen=True, slots=True)
class Change:
    """One metric of one pair. ``change_pct`` is (after - before) / |before| in percent: None
    when a side has no value, or when before is 0 and after is not (no finite percentage)."""

    metric: Metric
    before: float | None
    after: float | None
    change_pct: float | None
    judgement: Judgement

    @property
    def moved_worse(self) -> bool:
        """After is worse than before by any amount, the tolerance aside."""
        if self.before is None or self.after is None:
            return False
        up = self.after > self.before
        return up if self.metric.better == "lower" else self.after < self.before

    @property
    def change_text(self) -> str:
        return self.change_text_beside()

    def change_text_beside(self, *limits: float) -> str:
        """The change in percent, signed, with one decimal or as many more digits as it takes
        to read on its side of each of ``limits`` (percentages: the "same" tolerance, a
        check's limit; ``pct_text``). A change that reads 0.0% has no sign."""
        if self.judgement == "n/a":
            return "–"  # a side without a value, or goodput under two SLOs
        if self.change_pct is None:
            return "from 0"
        text = pct_text(self.change_pct, limits)
        if float(text) == 0:
            return "0.0%"  # a rise or fall too small to show: not "-0.0%"
        return f"{'+' if self.change_pct > 0 else '-'}{text}%"

    def as_json(self) -> dict[str, Any]:
        return {"metric": self.metric.name, "better": self.metric.better,
                "unit": self.metric.unit, "before": self.before, "after": self.after,
                "change_pct": self.change_pct, "judgement": self.judgement}


# A percentage within this (relative, and absolute in percent) of a limit is at the limit:
# what floating point makes of a change of exactly the limit.
_ROUNDING = 1e-9


def beyond(pct: float, limit: float) -> bool:
    """Whether a change of ``pct`` percent (its size) is beyond a limit of ``limit`` percent,
    not at it up to floating-point rounding (1.0 -> 1.1 is 10.000000000000009%)."""
    return abs(pct) > limit * (1 + _ROUNDING) + _ROUNDING


def pct_text(pct: float, limits: Sequence[float] = ()) -> str:
    """The size of a change of ``pct`` percent, unsigned, to be read beside ``limits`` (the
    "same" tolerance, checks' limits): with one decimal, or, where one decimal would read on
    the wrong side of a limit, with the significant digits ``fmt_pair`` writes it with beside
    that limit, so that a change beyond a limit reads above it and one within it does not:
    10.04% beside a limit of 10% (not 10.0%), 0.15% beside 0.1% (not 0.1%), 0.959% within
    0.96% (not 1.0%)."""
    size = abs(pct)
    text = f"{size:.1f}"
    for limit in limits:
        if not _reads_on_its_side(text, size, limit):  # the finer of the two
            text = max(text, fmt_pair(size, limit, _pct_digits)[0], key=_decimals)
    digits = MAX_PAIR_DIGITS
    while not all(_reads_on_its_side(text, size, limit) for limit in limits) and digits < 17:
        digits += 1  # nearer a limit than fmt_pair's digits tell apart: rare, said right
        text = _pct_digits(size, digits)
    return text


def _pct_digits(size: float, digits: int) -> str:
    """``size`` with ``digits`` significant digits, but never fewer than one decimal."""
    text = sig(size, digits).replace(",", "")
    return text if "." in text else f"{size:.1f}"


def _decimals(text: str) -> int:
    return len(text.partition(".")[2])


def _reads_on_its_side(text: str, size: float, limit: float) -> bool:
    """Whether ``text`` (of ``size``) reads above ``limit`` exactly when ``size`` is beyond
    it."""
    return (float(text) > limit) == beyond(size, limit)


def change_of(metric: Metric, before: Any, after: Any, same_within_pct: float) -> Change:
    """``metric`` from before to after, judged by its direction; a change within
    ``same_within_pct`` percent is "same" (a count only when equal)."""
    b = None if missing(before) or not isinstance(before, int | float) else float(before)
    a = None if missing(after) or not isinstance(after, int | float) else float(after)
    if b is None or a is None:
        return Change(metric, b, a, None, "n/a")
    pct = (a - b) / abs(b) * 100 if b != 0 else (0.0 if a == 0 else None)
    change = Change(metric, b, a, pct, "same")
    if a == b or (not metric.is_count and pct is not None
                  and not beyond(pct, same_within_pct)):
        return change
    return Change(metric, b, a, pct, "worse" if change.moved_worse else "better")


@dataclass(frozen=True, slots=True)
class Difference:
    """Why a pair is not a like-for-like regression test: ``aspect`` (trace, kind, engine,
    engine_version, knobs, engine_config, model, gpu, batchlab_version, slo, load, manifest,
    ended_early, stale) differs between the sides, in words in ``text``."""

    cell: str
    aspect: str
    before: Any
    after: Any
    text: str

    def as_json(self) -> dict[str, Any]:
        return {"cell": self.cell, "aspect": self.aspect, "before": self.before,
                "after": self.after, "text": self.text}


@dataclass(frozen=True, slots=True)
class FailedCheck:
    """A ``Check`` a pair failed: its metric got worse by more than allowed, lost its value,
    or the after side did not finish (its metrics cannot be checked)."""

    cell: str
    check: Check
    reason: str
    before: float | None = None
    after: float | None = None
    change_pct: float | None = None

    def text(self) -> str:
        return f"{self.cell}: {self.check.metric.name} {self.reason}"

    def as_json(self) -> dict[str, Any]:
        return {"cell": self.cell, "metric": self.check.metric.name,
                "max_worse_pct": self.check.max_worse_pct, "before": self.before,
                "after": self.after, "change_pct": self.change_pct, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class UnappliedCheck:
    """A ``Check`` that could not be applied to a pair, for want of anything to regress from:
    the before side did not finish, or its metric has no value there (goodput without an
    SLO). It passes (docs/compare.md), and is counted apart from those that passed."""

    cell: str
    check: Check
    reason: str

    def text(self) -> str:
        return f"{self.cell}: {self.check.metric.name} {self.reason}"


@dataclass(frozen=True, slots=True)
class Pair:
    """The cell called ``name`` on both sides; ``changes`` is empty unless both finished."""

    name: str
    before: CellResult
    after: CellResult
    changes: tuple[Change, ...]

    @property
    def compared(self) -> bool:
        return finished(self.before) and finished(self.after)

    def as_json(self) -> dict[str, Any]:
        return {"cell": self.name, "compared": self.compared,
                "before": _side_json(self.before), "after": _side_json(self.after),
                "metrics": [c.as_json() for c in self.changes]}


def _side_json(c: CellResult) -> dict[str, Any]:
    words = prediction_words(c.manifest)
    return {"dir": str(c.run_dir), "state": state_of(c), "reason": reason_of(c) or None,
            "predicted": words is not None, "prediction": words}


def finished(c: CellResult) -> bool:
    """A run that ran to its end: done, with a summary, and not one that was interrupted,
    failed or killed part way (a single run folder has no status.json to say so: its
    manifest and summary do). An interrupted run's figures cover the requests it sent, and
    a regression test must not take them for a whole night's."""
    if not c.ok or c.ended_early is not None:
        return False
    return get(c.summary, "status") in (None, "finished", "stopped")


def state_of(c: CellResult) -> str:
    """The cell's state, "ended early" for a run with results that did not run to its end;
    "failed" for one that sent requests and served none (``CellResult.served_nothing``: a
    failure, as its status.json, manifest and summary say, not a run cut short)."""
    if c.ok and c.served_nothing:
        return "failed"
    return c.state if not c.ok or finished(c) else "ended early"


def reason_of(c: CellResult) -> str:
    if c.ok and not finished(c):
        return c.ended_early or f"its summary says {get(c.summary, 'status')}"
    return c.reason


@dataclass(frozen=True, slots=True)
class Comparison:
    """Everything ``batchlab compare`` found; ``as_json`` is the documented file."""

    before: Path
    after: Path
    same_within_pct: float
    checks: tuple[Check, ...]
    pairs: tuple[Pair, ...]
    added: tuple[CellResult, ...]
    removed: tuple[CellResult, ...]
    differences: tuple[Difference, ...]
    failed_checks: tuple[FailedCheck, ...]
    unapplied_checks: tuple[UnappliedCheck, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "before": str(self.before),
            "after": str(self.after),
            "same_within_pct": self.same_within_pct,
            "checks": [{"metric": c.metric.name, "max_worse_pct": c.max_worse_pct}
                       for c in self.checks],
            "pairs": [p.as_json() for p in self.pairs],
            "added": [{"cell": c.name, "dir": str(c.run_dir)} for c in self.added],
            "removed": [{"cell": c.name, "dir": str(c.run_dir)} for c in self.removed],
            "not_comparable": [d.as_json() for d in self.differences],
            "failed_checks": [f.as_json() for f in self.failed_checks],
            # checks that passed for want of anything to regress from (``UnappliedCheck``)
            "unapplied_checks": [{"cell": u.cell, "metric": u.check.metric.name,
                                  "max_worse_pct": u.check.max_worse_pct, "reason": u.reason}
                                 for u in self.unapplied_checks],
        }


# ---------------------------------------------------------------- reading and pairing


def read_side(path: Path) -> tuple[list[CellResult], bool]:
    """The cells of a scenario folder, or a run folder as one cell; and whether it was a
    single run folder."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise CompareError(f"{path}: a file, not a run folder or scenario folder")
    if not path.is_dir():
        raise CompareError(f"{path}: no such folder")
    if (path / SCENARIO_FILE).exists():
        try:
            return load_scenario_dir(path)[1], False
        except ScenarioFileError as exc:
            raise CompareError(str(exc)) from None
    if any((path / f).exists() for f in (SUMMARY_FILE, STATUS_FILE, REQUESTS_FILE,
                                          MANIFEST_FILE)):
        # (a manifest alone: a run killed or interrupted before its summary, not compared)
        return [load_run(path)], True
    raise CompareError(f"{path}: not a run folder or scenario folder (no {SUMMARY_FILE}, "
                       f"{STATUS_FILE}, {MANIFEST_FILE} or {SCENARIO_FILE})")


def matches(c: CellResult, patterns: Sequence[str]) -> bool:
    """Whether the cell's name, or its engine's name in the scenario, matches a shell pattern
    (as ``batchlab run --only``)."""
    engine = c.cell.get("engine")
    engine_name = engine.get("name") if isinstance(engine, Mapping) else None
    return any(fnmatch.fnmatchcase(c.name, p)
               or (engine_name is not None and fnmatch.fnmatchcase(str(engine_name), p))
               for p in patterns)


def compare(before: Path, after: Path, *, checks: Sequence[Check] = (),
            same_within_pct: float = DEFAULT_SAME_WITHIN_PCT,
            only: Sequence[str] = ()) -> Comparison:
    """Pair the cells of ``before`` and ``after`` by name (two run folders pair with each
    other), compare each pair and run the checks. CompareError when nothing pairs."""
    b_cells, b_single = read_side(before)
    a_cells, a_single = read_side(after)
    if only:
        b_cells = [c for c in b_cells if matches(c, only)]
        a_cells = [c for c in a_cells if matches(c, only)]
    if b_single and a_single and b_cells and a_cells:  # two run folders: whatever their names
        b, a = b_cells[0], a_cells[0]
        matched = [(b.name if b.name == a.name else f"{b.name} vs {a.name}", b, a)]
        removed: tuple[CellResult, ...] = ()
        added: tuple[CellResult, ...] = ()
    else:
        before_by_name = {c.name: c for c in b_cells}
        after_names = {c.name for c in a_cells}
        matched = [(c.name, before_by_name[c.name], c) for c in a_cells
                   if c.name in before_by_name]  # in AFTER's order
        removed = tuple(c for c in b_cells if c.name not in after_names)
        added = tuple(c for c in a_cells if c.name not in before_by_name)
    if not matched:
        raise CompareError(
            "nothing to pair: no cell name is on both sides"
            + (f" matching --only {','.join(only)}" if only else "")
            + f" (before: {_names(b_cells)}; after: {_names(a_cells)})")
    pairs = tuple(pair(name, b, a, same_within_pct) for name, b, a in matched)
    return Comparison(
        before=Path(before), after=Path(after), same_within_pct=same_within_pct,
        checks=tuple(checks), pairs=pairs, added=added, removed=removed,
        # only where figures were set side by side: a pair not compared says why already
        differences=tuple(d for p in pairs if p.compared
                          for d in differences(p.name, p.before, p.after)),
        failed_checks=tuple(f for p in pairs
                            for f in run_checks(p, checks, same_within_pct=same_within_pct)),
        unapplied_checks=tuple(u for p in pairs for u in unapplied_checks(p, checks)),
    )


def pair(name: str, before: CellResult, after: CellResult, same_within_pct: float) -> Pair:
    """Every headline metric of two cells side by side; none unless both finished. Goodput
    computed under two different SLOs is set side by side but not judged ("n/a")."""
    if not (finished(before) and finished(after)):
        return Pair(name, before, after, ())
    other_slo = _slo(before) != _slo(after)
    changes = []
    for m in METRICS:
        ch = change_of(m, get(before.summary, m.name), get(after.summary, m.name),
                       same_within_pct)
        if other_slo and m.name in SLO_METRICS:
            ch = Change(m, ch.before, ch.after, ch.change_pct, "n/a")
        changes.append(ch)
    return Pair(name, before, after, tuple(changes))


def _names(cells: Sequence[CellResult]) -> str:
    return ", ".join(c.name for c in cells) or "none"


def run_checks(pair: Pair, checks: Sequence[Check], *,
               same_within_pct: float = DEFAULT_SAME_WITHIN_PCT) -> list[FailedCheck]:
    """The checks ``pair`` fails. An after side that did not finish fails every check (its
    metrics cannot be checked), whatever the before side did: a night whose runs all crashed
    must not pass because the night before crashed too. A before side that did not finish,
    beside an after side that did, leaves nothing to regress from, and fails none.
    ``same_within_pct``: the "same" tolerance, which a change is written beside as in the
    table (``limits_beside``)."""
    if not checks:
        return []
    if not finished(pair.after):
        reason = reason_of(pair.after)
        return [FailedCheck(pair.name, c, f"cannot be checked: after {state_of(pair.after)}"
                            + (f" ({reason})" if reason else ""))
                for c in checks]
    if not finished(pair.before):
        return []
    by_metric = {ch.metric.name: ch for ch in pair.changes}
    failed = []
    for check in checks:
        ch = by_metric[check.metric.name]
        reason = _check_failure(check, ch,
                                limits_beside(check.metric, checks, same_within_pct))
        if reason:
            failed.append(FailedCheck(pair.name, check, reason, ch.before, ch.after,
                                      ch.change_pct))
    return failed


def unapplied_checks(pair: Pair, checks: Sequence[Check]) -> list[UnappliedCheck]:
    """The checks that could not be applied to ``pair`` and pass for it (``run_checks``):
    its before side did not finish while its after side did, or the metric has no value
    before (goodput of a run without an SLO)."""
    if not checks or not finished(pair.after):
        return []  # an after side that did not finish fails them: applied
    if not finished(pair.before):
        state = state_of(pair.before).replace("_", " ")
        reason = reason_of(pair.before)
        why = (f"before {state} ({reason})" if pair.before.ok  # figures of part of its trace
               else f"before has no summary ({state}" + (f": {reason})" if reason else ")"))
        return [UnappliedCheck(pair.name, c, f"has nothing to regress from: {why}")
                for c in checks]
    by_metric = {ch.metric.name: ch for ch in pair.changes}
    out = []
    for check in checks:
        if by_metric[check.metric.name].before is None:
            no_slo = check.metric.name in SLO_METRICS and not _slo(pair.before)
            out.append(UnappliedCheck(pair.name, check, "has nothing to regress from: no "
                                      "value before" + (" (no SLO)" if no_slo else "")))
    return out


def limits_beside(metric: Metric, checks: Sequence[Check], same_within_pct: float
                  ) -> tuple[float, ...]:
    """The percentages a change of ``metric`` is written beside (``pct_text``), in the table
    and in a failed check's line alike: the "same" tolerance (not a count's, judged exactly)
    and the limit of each of its checks."""
    return ((() if metric.is_count else (same_within_pct,))
            + tuple(c.max_worse_pct for c in checks if c.metric == metric))


def _check_failure(check: Check, ch: Change, beside: Sequence[float]) -> str:
    """Why ``ch`` fails ``check`` ('' when it passes), the change written with digits enough
    to read on its side of each of ``beside`` (``limits_beside``: the check's limit among
    them). The check reads the change itself, not the "same" tolerance: a limit below it is
    the user's to set."""
    m = ch.metric
    if ch.before is None:
        return ""  # nothing to regress from
    if ch.after is None:
        return f"has no value after (before: {m.text(ch.before)})"
    if ch.judgement == "n/a":
        return "cannot be checked: the two runs' goodput was computed under different SLOs"
    if not ch.moved_worse:
        return ""
    span = " -> ".join(m.texts(ch.before, ch.after))
    limit = f"limit {check.max_worse_pct:g}%"
    if ch.change_pct is None:
        return f"got worse from 0 ({span}; {limit})"
    if not beyond(ch.change_pct, check.max_worse_pct):
        return ""  # (1.0 -> 1.1 is 10.000000000000009% in floating point: within 10)
    # as many digits as it takes to read above the limit: 10.04%, not 10.0%, beside 10%
    return f"worse by {pct_text(ch.change_pct, beside)}% ({span}; {limit})"


# ---------------------------------------------------------------- comparability


def differences(cell: str, before: CellResult, after: CellResult) -> list[Difference]:
    """What differs between two runs that a regression test holds fixed: the trace, whether
    the timings are predicted or measured, the engine and its version, its knobs and
    configuration, model, GPU, batchlab's version, SLO and load; and a side that ended early,
    was stopped early by an early-stop rule (compared all the same: its figures cover part of
    its trace) or was made from an earlier definition of its cell."""
    out: list[Difference] = []
    for side, c in (("before", before), ("after", after)):
        if not c.manifest and (c.run_dir / MANIFEST_FILE).exists():
            # (damaged: not JSON, or not an object; read as no manifest)
            out.append(Difference(cell, "manifest", None, None,
                                  f"{side}'s {MANIFEST_FILE} cannot be read as a manifest: "
                                  "what it ran is not known"))
        elif not c.manifest:
            out.append(Difference(cell, "manifest", None, None,
                                  f"{side} has no manifest.json: what it ran is not known"))
        if c.unread:
            out.append(Difference(cell, "manifest", None, None,
                                  f"{side}'s {wrong_text(c.unread)}: read as absent, so what "
                                  "it recorded is not known"))
        if c.ended_early:
            out.append(Difference(cell, "ended_early", None, None,
                                  f"{side} ended early: {c.ended_early}"))
        if c.ok and get(c.summary, "status") == "stopped":  # by a rule asked for: compared
            why = get(c.summary, "stopped_early")
            out.append(Difference(cell, "stopped_early", None, None,
                                  f"{side} was stopped early"
                                  + (f" ({why})" if isinstance(why, str) and why else "")
                                  + ": its figures cover only the part of its trace it ran"))
        if c.stale:
            out.append(Difference(cell, "stale", None, None,
                                  f"{side} was made from an earlier definition of the cell "
                                  "than its scenario's last sweep (left by --only or --resume)"))
    if not (before.manifest and after.manifest):
        return out

    def known(*fields: str) -> bool:
        """Neither side's manifest.json (or cell.json) had these fields of the wrong type (said
        above): what they would differ in is not known."""
        return not (before.unread_in(*fields) or after.unread_in(*fields))

    def differ(aspect: str, what: str, b: Any, a: Any, *, unknown: bool = False) -> None:
        """``unknown``: None on one side is a value that side did not record, not another."""
        if b != a and not (unknown and (b is None or a is None)):
            out.append(Difference(cell, aspect, b, a,
                                  f"different {what} ({_short(b)} -> {_short(a)})"))

    b_scheme, a_scheme = (_digest_scheme(c) for c in (before, after))
    # digests made two ways: equal traces need not have equal ones
    if known("trace") and b_scheme != a_scheme:
        out.append(Difference(cell, "trace", b_scheme, a_scheme,
                              f"trace digests made two ways (scheme {b_scheme} -> {a_scheme}, "
                              "a batchlab upgrade): whether the traces are the same is not "
                              "known"))
    elif known("trace"):
        differ("trace", "trace digest", trace_digest(before), trace_digest(after))
    b_pred, a_pred = is_prediction(before.manifest), is_prediction(after.manifest)
    if b_pred != a_pred and known("engine"):
        out.append(Difference(cell, "kind", _kind(b_pred), _kind(a_pred),
                              f"before {_kind(b_pred)}, after {_kind(a_pred)}"))
    if known("engine"):
        differ("engine", "engine", before.engine, after.engine)
        differ("engine_version", "engine version", before.engine_version,
               after.engine_version)
    knobs = _changed(before.knobs, after.knobs) if known("knobs") else {}
    if knobs:
        out.append(Difference(cell, "knobs", {k: b for k, (b, _) in knobs.items()},
                              {k: a for k, (_, a) in knobs.items()},
                              "different knobs: " + _changes_text(knobs)))
    b_config, a_config = (engine_config(c) for c in (before, after))
    # a key one side did not record is not known to differ (a served reference's /version
    # gives fewer keys than a simulated run's configuration)
    config = {k: v for k, v in _changed(b_config, a_config).items()
              if k not in knobs and k in b_config and k in a_config}
    # a setting derived from one said to differ above (a knob, or another key here) is not
    # said again: it is that change's consequence, not a second one
    listed = {CONFIG_NAMES.get(k, k) for k in knobs} | set(config)
    config = {k: v for k, v in config.items()
              if not (listed & DERIVED_CONFIG.get(k, set())
                      and not any(_given(c, k) for c in (before, after)))}
    if config:
        out.append(Difference(cell, "engine_config", {k: b for k, (b, _) in config.items()},
                              {k: a for k, (_, a) in config.items()},
                              "different engine configuration: " + _changes_text(config)))
    differ("model", "model", before.manifest.get("model"), after.manifest.get("model"))
    differ("gpu", "GPU", before.manifest.get("gpu"), after.manifest.get("gpu"), unknown=True)
    differ("batchlab_version", "batchlab version", before.manifest.get("batchlab_version"),
           after.manifest.get("batchlab_version"))
    if known("slo"):
        differ("slo", "SLO", _slo(before), _slo(after))
    if known("load", "replay", "trace"):  # what each ran at: ``CellResult.run_load_point``
        differ("load", "load", before.run_load, after.run_load)
    b_client, a_client = (_client_settings(c) for c in (before, after))
    client = _changed(b_client, a_client) if b_client and a_client else {}
    if client:
        out.append(Difference(cell, "client", {k: b for k, (b, _) in client.items()},
                              {k: a for k, (_, a) in client.items()},
                              "different replay client settings: " + _changes_text(client)))
    for side, c in (("before", before), ("after", after)):
        if client_limited(c):
            out.append(Difference(
                cell, "client_limited", None, None,
                f"{side} was client-limited (send lag p99 "
                f"{fmt_seconds(get(c.summary, 'send_lag_s.p99'))}): its latencies include the "
                "client's own delay"))
    return out


# The reference engine's configuration keys (``ReferenceConfig.as_dict``) that the settings
# named derive, unless given (``_given``): num_gpu_blocks is what the GPU's memory
# x gpu_memory_utilization leaves after the weights and the activations of the largest step
# (``CostModel.kv_budget``: max_num_batched_tokens tokens, fp32 logits for max_num_seqs
# sequences, a fixed reserve from the cost model), in blocks of block_size tokens.
DERIVED_CONFIG: dict[str, set[str]] = {
    "num_gpu_blocks": {"model", "gpu", "tp", "weights_dtype", "kv_cache_dtype", "block_size",
                       "gpu_memory_utilization", "max_num_batched_tokens", "max_num_seqs",
                       "cost_model_digest"},
}
CONFIG_NAMES = {"tensor_parallel_size": "tp"}  # a knob's name where the configuration's differs


def _given(c: CellResult, key: str) -> bool:
    """Whether the run was given ``key`` rather than deriving it: its scenario engine's
    setting (``cell.json``), or the option on ``simulate``'s command line."""
    engine = c.cell.get("engine")
    if isinstance(engine, Mapping) and engine.get(key) is not None:
        return True
    command = c.manifest.get("command")
    flag = "--" + key.replace("_", "-")
    return isinstance(command, list) and any(
        isinstance(arg, str) and (arg == flag or arg.startswith(flag + "=")) for arg in command)


# A live run's replay settings that change the load an engine sees or what is measured: a
# regression test holds them fixed (``manifest.json`` ``replay``). The rest (the prompt salt,
# a path, the seed of a synthetic trace already in its digest) do not.
CLIENT_SETTINGS = ("max_concurrency", "protocol", "timeout_s", "length_control",
                   "http_client")


def _client_settings(c: CellResult) -> dict[str, Any]:
    replay = c.manifest.get("replay")
    if not isinstance(replay, Mapping):
        return {}  # a simulated run: no client
    return {k: replay.get(k) for k in CLIENT_SETTINGS}


def _digest_scheme(c: CellResult) -> int:
    """How the run's trace digest was made: 1 (the source bytes and options) in manifests
    written before the scheme was recorded, 2 (the requests) since."""
    trace = c.manifest.get("trace")
    scheme = trace.get("digest_scheme") if isinstance(trace, Mapping) else None
    return scheme if isinstance(scheme, int) and not isinstance(scheme, bool) else 1


def _kind(predicted: bool) -> str:
    return "predicted (reference engine)" if predicted else "measured"


def _slo(c: CellResult) -> Any:
    """The SLO the run's goodput was computed under: its summary's (``batchlab summarize
    --slo`` may have changed it since the run, which the manifest does not follow), else the
    manifest's."""
    if isinstance(c.summary, Mapping) and "slo" in c.summary:
        return c.summary["slo"] or None
    return c.manifest.get("slo") or None


def _changed(before: Mapping[str, Any], after: Mapping[str, Any]
             ) -> dict[str, tuple[Any, Any]]:
    """``{key: (before, after)}`` for the keys whose values differ as a scenario spells them
    (no extra argument reads the same however a run recorded it)."""
    def text(key: str, value: Any) -> str:
        if key == "extra_args" and value in (None, [], ()):
            return "[]"
        return value_text(value)

    keys = list(dict.fromkeys([*before, *after]))
    return {k: (before.get(k), after.get(k)) for k in keys
            if text(k, before.get(k)) != text(k, after.get(k))}


def _changes_text(changes: Mapping[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{k} {value_text(b)} -> {value_text(a)}" for k, (b, a) in changes.items())


def _short(value: Any) -> str:
    """A digest cut to 12 characters, anything else as a scenario would spell it."""
    text = value_text(value) if not isinstance(value, Mapping) else ", ".join(
        f"{k}={value_text(v)}" for k, v in value.items())
    return text[:12] if len(text) == 64 and text.isalnum() else text


# ---------------------------------------------------------------- plain text (CI logs)


def render_text(comparison: Comparison) -> str:
    """The comparison as CI logs show it: ``header_lines``, then ``render_body``. Warnings are
    ``warning_lines``: ``batchlab compare`` prints them between the two."""
    return "\n".join([*header_lines(comparison), render_body(comparison)])


def header_lines(comparison: Comparison) -> list[str]:
    """The two folders compared."""
    return [f"before: {comparison.before}", f"after:  {comparison.after}"]


def render_body(comparison: Comparison) -> str:
    """One line per cell and metric, then what was added, removed or not compared, and the
    checks' outcome."""
    lines = [f"a change within {comparison.same_within_pct:g}% is \"same\"", ""]
    limits: dict[str, list[float]] = {}  # each metric's, --fail-if given more than once
    for c in comparison.checks:
        limits.setdefault(c.metric.name, []).append(c.max_worse_pct)
    failed: dict[tuple[str, str], list[float]] = {}
    for f in comparison.failed_checks:
        failed.setdefault((f.cell, f.check.metric.name), []).append(f.check.max_worse_pct)
    headers = ["cell", "metric", "before", "after", "change", ""]
    if limits:
        headers.append("check")
    rows = []
    for pair in comparison.pairs:
        for ch in pair.changes:
            if ch.before is None and ch.after is None:
                continue  # neither side has it (goodput without an SLO)
            asked = limits.get(ch.metric.name, [])
            broke = failed.get((pair.name, ch.metric.name))
            # with digits enough to read on its side of the tolerance and of every limit
            beside = limits_beside(ch.metric, comparison.checks, comparison.same_within_pct)
            # a change judged worse or better, or failing a check, never reads as two equal
            # figures
            texts = (ch.metric.texts(ch.before, ch.after) if ch.judgement != "same" or broke
                     else (ch.metric.text(ch.before), ch.metric.text(ch.after)))
            row = [pair.name, ch.metric.name, *texts, ch.change_text_beside(*beside),
                   ch.judgement]
            if limits:  # the tightest limit it failed, else the tightest it passed
                row.append("" if not asked else f"FAIL (limit {min(broke):g}%)" if broke
                           else f"ok (limit {min(asked):g}%)")
            rows.append(row)
    lines += _columns(headers, rows) if rows else ["no pair of finished cells to compare"]
    not_compared = [p for p in comparison.pairs if not p.compared]
    if not_compared or comparison.added or comparison.removed:
        lines.append("")
    for p in not_compared:
        sides = [f"{side} {state_of(c)}" + (f" ({reason_of(c)})" if reason_of(c) else "")
                 for side, c in (("before", p.before), ("after", p.after)) if not finished(c)]
        lines.append(f"not compared: {p.name}: {'; '.join(sides)}")
    if comparison.removed:
        lines.append("removed (before only): " + ", ".join(c.name for c in comparison.removed))
    if comparison.added:
        lines.append("added (after only): " + ", ".join(c.name for c in comparison.added))
    predicted = prediction_lines(comparison)
    if predicted:
        lines += ["", *predicted]
    if comparison.checks:
        lines.append("")
        lines += [f"check failed: {f.text()}" for f in comparison.failed_checks]
        lines += [f"check not applied: {u.text()}" for u in comparison.unapplied_checks]
        lines.append(checks_line(comparison))
    return "\n".join(lines)


def checks_line(comparison: Comparison) -> str:
    """The checks' outcome in one line: how many failed, and how many of the checks of each
    pair could not be applied, with nothing to regress from (they pass, as documented, but
    are not said to have passed: a night compared with one that has no summary checked
    nothing)."""
    num_checks, num_pairs = len(comparison.checks), len(comparison.pairs)
    asked = (f"{num_checks} check{'s' if num_checks > 1 else ''} "
             f"on {num_pairs} pair{'s' if num_pairs > 1 else ''}")
    num_unapplied = len(comparison.unapplied_checks)
    if num_unapplied == num_checks * num_pairs:
        return f"checks: none applied ({asked}: nothing to regress from)"
    if num_unapplied:
        asked += (f"; {num_unapplied} of {num_checks * num_pairs} not applied: nothing to "
                  "regress from")
    failed = len(comparison.failed_checks)
    return f"checks: {failed} failed ({asked})" if failed else f"checks: passed ({asked})"


def prediction_lines(comparison: Comparison) -> list[str]:
    """Which compared figures are predictions, and how accurate that kind of prediction was
    measured to be (``simulate``'s words for its run): one line per prediction, naming the
    side and cells it concerns ("every cell" when it concerns all that were compared)."""
    by_words: dict[str, dict[str, list[str]]] = {}
    compared = [p for p in comparison.pairs if p.compared]
    for p in compared:
        for side, cell in (("before", p.before), ("after", p.after)):
            words = prediction_words(cell.manifest)
            if words is not None:
                by_words.setdefault(words, {}).setdefault(side, []).append(p.name)
    return [f"{_whose(sides, len(compared))}: {words}" for words, sides in by_words.items()]


def _whose(sides: Mapping[str, Sequence[str]], num_compared: int) -> str:
    """"both sides, every cell", "before", "after fcfs, static": the cells of each side."""
    if len(sides) == 2 and all(len(names) == num_compared for names in sides.values()):
        return "both sides" + (", every cell" if num_compared > 1 else "")
    return "; ".join(side if num_compared == 1 else
                     f"{side}, every cell" if len(names) == num_compared else
                     f"{side} {', '.join(names)}" for side, names in sides.items())


def warning_lines(comparison: Comparison) -> list[str]:
    """One line per kind of difference, naming the pairs it concerns ("every pair" when it
    concerns all of them)."""
    grouped: dict[str, list[str]] = {}
    for d in comparison.differences:
        grouped.setdefault(d.text, []).append(d.cell)
    every = len(comparison.pairs)
    return [f"not comparable as a regression test: {text}: "
            + ("every pair" if len(cells) == every and every > 1 else ", ".join(cells))
            for text, cells in grouped.items()]


def _columns(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned text columns, two spaces apart; numbers right-aligned."""
    widths = [max(len(str(r[i])) for r in (headers, *rows)) for i in range(len(headers))]
    right = {2, 3, 4}  # before, after, change

    def line(row: Sequence[str]) -> str:
        cells = [str(v).rjust(w) if i in right else str(v).ljust(w)
                 for i, (v, w) in enumerate(zip(row, widths, strict=True))]
        return "  ".join(cells).rstrip()

    return [line(headers), *(line(r) for r in rows)]
