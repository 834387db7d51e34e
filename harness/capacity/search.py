"""The capacity search: bracket the highest load that meets the SLO, then bisect it.

Pure logic: a probe is a function ``load -> ProbeOutcome`` that the caller supplies (a recorded
run in ``harness.capacity.probe``, a fake in tests). Loads are request rates (req/s) or
closed-loop users. Attainment is assumed to fall as load rises::

    bracket   start ─► x2 ─► x2 ─► ... until a probe fails     (or /2 until one passes)
                       pass   pass   FAIL
    bisect    between the highest pass and the lowest fail, until they are ``precision`` apart
              (rates: geometric midpoints, hi/lo - 1 <= precision; users: integers, hi - lo <=
              precision), so the answer is the highest load that passed and the true capacity
              lies in [pass, fail).

Probes already done (``known``, from a resumed search) are reused, never re-run: the sequence
of loads depends only on the outcomes, so a resumed search walks the same path.

A probe stopped early (``harness.capacity.saturation``: its backlog rose at every check of a
window) failed on evidence a burst in the trace can also give. The answer's bracket must not
rest on it: when the lowest failing load was stopped early, it is run again to its end
(``confirm``). If that run passes, the load passed, and the search goes on above it::

    6.107 stopped early ─► 6.107 run to its end: passed ─► bisect 6.107 .. next failing load
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

LoadKind = Literal["rate", "concurrency"]
# trace_too_short: found, but the lowest failing load failed only as too short a trace to show
# a steady state (``harness.capacity.run``): the capacity is a lower bound set by the trace;
# none and not known when that load was the lowest (a below_min the trace set)
Status = Literal["found", "below_min", "at_least_max", "max_probes", "trace_too_short"]
LOAD_UNITS = {"rate": "req/s", "concurrency": "users"}
DEFAULT_TARGET = 0.99
MIN_RATE_PRECISION = 0.002  # two steps of a rate named to 4 significant digits, at worst


def load_text(kind: LoadKind, load: float) -> str:
    """One load in words: "4.5 req/s", "1 user", "16 users"."""
    if kind == "concurrency":
        return f"{load:g} user" + ("" if load == 1 else "s")
    return f"{load:g} {LOAD_UNITS[kind]}"


@dataclass(frozen=True, slots=True)
class SearchSpec:
    """How to search: the load axis, the attainment to keep, where to start, how exactly."""

    kind: LoadKind = "rate"
    target: float = DEFAULT_TARGET  # fraction of requests meeting every SLO, at least
    start: float = 1.0  # the first probe's load
    precision: float = 0.05  # rate: relative bracket width; concurrency: users
    min_load: float | None = None  # lowest load tried (rate 0.01 req/s, concurrency 1)
    max_load: float | None = None  # highest load tried (rate 10,000 req/s, concurrency 4,096)
    growth: float = 2.0  # bracketing factor
    max_probes: int = 40

    @property
    def lowest(self) -> float:
        return self.min_load if self.min_load is not None else (
            0.01 if self.kind == "rate" else 1.0)

    @property
    def highest(self) -> float:
        return self.max_load if self.max_load is not None else (
            10_000.0 if self.kind == "rate" else 4096.0)

    def validate(self) -> None:
        """Raises ValueError naming the field."""
        if self.kind not in LOAD_UNITS:
            raise ValueError(f"kind: {self.kind!r} is not rate or concurrency")
        if not 0 < self.target <= 1:
            raise ValueError(f"target: SLO attainment must be in (0, 1], got {self.target!r}")
        if not (math.isfinite(self.start) and self.start > 0):
            raise ValueError(f"start: must be a positive load, got {self.start!r}")
        if not (math.isfinite(self.precision) and self.precision > 0):
            raise ValueError(f"precision: must be positive, got {self.precision!r}")
        if self.kind == "rate" and self.precision < MIN_RATE_PRECISION:
            raise ValueError(f"precision: at least {MIN_RATE_PRECISION:g} ("
                             f"{MIN_RATE_PRECISION:.1%}) for a rate search, whose loads are "
                             f"named to 4 significant digits; got {self.precision:g}")
        if self.kind == "concurrency":
            loads = {"precision": self.precision, "start": self.start,
                     "min_load": self.min_load, "max_load": self.max_load}
            fractional = [k for k, v in loads.items() if v is not None and v != int(v)]
            if fractional:
                raise ValueError(f"{', '.join(fractional)}: whole numbers of users for a "
                                 "concurrency search")
        if not (math.isfinite(self.lowest) and self.lowest > 0):
            raise ValueError(f"min_load: must be a positive load, got {self.lowest:g}")
        if not math.isfinite(self.highest):
            raise ValueError(f"max_load: must be a finite load, got {self.highest:g}")
        if not self.lowest <= self.start <= self.highest:
            raise ValueError(f"min_load <= start <= max_load is needed, got {self.lowest:g} <= "
                             f"{self.start:g} <= {self.highest:g}")
        if not self.growth > 1:
            raise ValueError(f"growth: must be above 1, got {self.growth!r}")
        if self.max_probes < 2:
            raise ValueError(f"max_probes: must be at least 2, got {self.max_probes!r}")

    def precision_text(self) -> str:
        """How far above the answer the lowest failing load may lie."""
        if self.kind == "rate":
            return f"within {self.precision * 100:g}%"
        return f"within {self.precision:g} user{'s' if self.precision != 1 else ''}"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(unit=LOAD_UNITS[self.kind], min_load=self.lowest, max_load=self.highest,
                   precision_relative=self.kind == "rate", precision_text=self.precision_text())
        return out


@dataclass(frozen=True, slots=True)
class ProbeOutcome:
    """One probe: the load, its SLO attainment, whether it met the target and why not."""

    load: float
    attainment: float | None  # None when nothing could be measured
    passed: bool
    num_failed: int | None = None  # requests that failed (refused, errors), of those sent
    num_requests: int | None = None  # requests sent
    stopped: str | None = None  # why the probe stopped early (over-saturated), if it did
    run_dir: str | None = None  # the probe's run folder, relative to the search folder
    output_tokens_per_s: float | None = None
    ttft_p90_s: float | None = None
    tpot_p90_s: float | None = None
    resumed: bool = False  # taken from an earlier run of the search
    full: bool = False  # run to its end without the early stop, to confirm a stopped probe
    # rate probes: whether the engine kept pace with the arrivals, the rates compared and why
    # not (``harness.metrics.pace``)
    due_per_s: float | None = None
    completed_per_s: float | None = None
    kept_pace: bool | None = None
    behind: str | None = None
    # closed-loop probes: the users' first requests, all sent at the start, which the
    # attainment above leaves out (``harness.results.attainment_after_warm_up``)
    num_warm_up: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProbeOutcome:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True, slots=True)
class LoadCap:
    """The highest load a search could try, when something other than its ``max_load`` set
    it, and why (a concurrency search: the trace's length, ``harness.capacity.run``)."""

    max_load: float
    why: str  # search.json's ``load_cap``

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SearchResult:
    """The answer: the highest load that met the target, the final bracket, every probe."""

    status: Status
    capacity: float | None  # highest passing load (None: even the lowest load failed)
    passing: float | None  # bracket: highest load that passed
    failing: float | None  # bracket: lowest load that failed (None: none failed)
    probes: tuple[ProbeOutcome, ...] = field(default_factory=tuple)
    # set by the caller when the highest load tried was not the spec's ``max_load``: an
    # ``at_least_max`` is then "at least the most that could be tried", not "at least max_load"
    load_cap: LoadCap | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "capacity": self.capacity,
                "bracket": {"passing": self.passing, "failing": self.failing},
                "probes": [p.as_dict() for p in self.probes],
                **({"load_cap": self.load_cap.as_dict()} if self.load_cap else {})}


def normal_load(kind: LoadKind, load: float) -> float:
    """Loads as probes name them: whole users, or rates to 4 significant digits."""
    if kind == "concurrency":
        return float(max(1, round(load)))
    return float(f"{load:.4g}")


def _grow(spec: SearchSpec, load: float) -> float:
    up = load * spec.growth
    if spec.kind == "concurrency":
        up = max(load + 1, math.floor(up))
    return min(normal_load(spec.kind, up), spec.highest)


def _shrink(spec: SearchSpec, load: float) -> float:
    down = load / spec.growth
    if spec.kind == "concurrency":
        down = min(load - 1, math.ceil(down))
    return max(normal_load(spec.kind, down), spec.lowest)


def _midpoint(spec: SearchSpec, lo: float, hi: float) -> float:
    if spec.kind == "concurrency":
        return float((int(lo) + int(hi)) // 2)
    return normal_load(spec.kind, math.sqrt(lo * hi))


def converged(spec: SearchSpec, lo: float, hi: float) -> bool:
    if spec.kind == "concurrency":
        return hi - lo <= spec.precision
    return hi / lo - 1 <= spec.precision


def search(
    spec: SearchSpec,
    probe: Callable[[float], ProbeOutcome],
    *,
    known: Mapping[float, ProbeOutcome] | None = None,
    on_probe: Callable[[ProbeOutcome], None] | None = None,
    confirm: Callable[[float], ProbeOutcome] | None = None,
    known_full: Mapping[float, ProbeOutcome] | None = None,
) -> SearchResult:
    """Find the highest load whose probe meets the target, to ``spec.precision``.

    ``known`` maps loads (``normal_load``) to outcomes of an earlier run of the same search,
    ``known_full`` those of its confirming runs; ``on_probe`` is called after each probe (to
    record progress). ``confirm`` runs a load to its end without the early stop: the lowest
    failing load, when its probe was stopped early, is confirmed by it (module doc).
    """
    spec.validate()
    known = dict(known or {})
    known_full = dict(known_full or {})
    probes: list[ProbeOutcome] = []
    deciding: dict[float, ProbeOutcome] = {}  # per load: the confirming run's, else the probe's

    def run(load: float, *, full: bool = False) -> bool:
        load = normal_load(spec.kind, load)
        outcome = (known_full if full else known).get(load)
        if outcome is None:
            outcome = confirm(load) if full and confirm is not None else probe(load)
        else:
            outcome = _as_resumed(outcome)
        probes.append(outcome)
        if full or not deciding.get(load, outcome).full:
            deciding[load] = outcome
        if on_probe is not None:
            on_probe(outcome)
        return outcome.passed

    def result(status: Status, lo: float | None, hi: float | None) -> SearchResult:
        return SearchResult(status, lo, lo, hi, tuple(probes))

    lo: float | None = None  # highest load that passed
    hi: float | None = None  # lowest load that failed
    load = normal_load(spec.kind, spec.start)
    while lo is None or hi is None:  # bracket
        if len(probes) >= spec.max_probes:
            return result("max_probes", lo, hi)
        if run(load):
            lo = load
            if hi is None:  # still going up
                if load >= spec.highest:
                    return result("at_least_max", lo, hi)
                load = _grow(spec, load)
        else:
            hi = load
            if lo is None:  # still going down
                if load <= spec.lowest:
                    failing = deciding[load]
                    if confirm is None or not failing.stopped or failing.full:
                        return result("below_min", lo, hi)
                    if len(probes) >= spec.max_probes:
                        return result("max_probes", lo, hi)
                    if not run(load, full=True):  # as below: never end on an early stop
                        return result("below_min", lo, hi)
                    lo = load
                    above = [x for x, o in deciding.items() if x > lo and not o.passed]
                    hi = min(above) if above else None
                    if hi is None:  # nothing failed above it: bracket upwards
                        if lo >= spec.highest:
                            return result("at_least_max", lo, hi)
                        load = _grow(spec, lo)
                    continue
                load = _shrink(spec, load)
    while True:
        while not converged(spec, lo, hi):  # bisect
            mid = _midpoint(spec, lo, hi)
            if mid in (lo, hi):
                break  # the loads cannot be told apart more finely
            if len(probes) >= spec.max_probes:
                return result("max_probes", lo, hi)
            if run(mid):
                lo = mid
            else:
                hi = mid
        failing = deciding[hi]
        if confirm is None or not failing.stopped or failing.full:
            return result("found", lo, hi)
        if len(probes) >= spec.max_probes:
            return result("max_probes", lo, hi)
        if not run(hi, full=True):
            return result("found", lo, hi)  # it fails run to its end too
        lo = hi  # a burst stopped it, not a backlog: the search goes on above
        above = [x for x, o in deciding.items() if x > lo and not o.passed]
        hi = min(above) if above else None
        while hi is None:  # nothing failed above it yet: bracket upwards again
            if lo >= spec.highest:
                return result("at_least_max", lo, hi)
            if len(probes) >= spec.max_probes:
                return result("max_probes", lo, hi)
            load = _grow(spec, lo)
            if run(load):
                lo = load
            else:
                hi = load


def _as_resumed(outcome: ProbeOutcome) -> ProbeOutcome:
    if outcome.resumed:
        return outcome
    d = outcome.as_dict()
    d["resumed"] = True
    return ProbeOutcome.from_dict(d)
