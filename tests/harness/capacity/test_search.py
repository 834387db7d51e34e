"""The capacity search's logic with an injected probe, and the over-saturation check."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from harness.capacity import ProbeOutcome, SaturationMonitor, SearchSpec, search
from harness.capacity.saturation import interval_for
from harness.target import LoadState


def probe_below(capacity: float, calls: list[float] | None = None
                ) -> Callable[[float], ProbeOutcome]:
    """A fake engine whose attainment is 1 up to ``capacity`` and 0.5 above."""
    def probe(load: float) -> ProbeOutcome:
        if calls is not None:
            calls.append(load)
        ok = load <= capacity
        return ProbeOutcome(load=load, attainment=1.0 if ok else 0.5, passed=ok)
    return probe


@pytest.mark.parametrize("capacity", [0.37, 3.0, 7.3, 123.4])
def test_rate_search_brackets_then_bisects_to_its_precision(capacity: float) -> None:
    spec = SearchSpec(kind="rate", start=1.0, precision=0.05)
    result = search(spec, probe_below(capacity))
    assert result.status == "found"
    assert result.passing is not None and result.failing is not None
    assert result.passing <= capacity < result.failing
    assert result.failing / result.passing - 1 <= 0.05
    assert result.capacity == result.passing
    # every probe is kept in order; the first ones double (or halve) from the start
    loads = [p.load for p in result.probes]
    assert loads[0] == 1.0
    assert loads[1] in (2.0, 0.5)


@pytest.mark.parametrize("capacity", [1, 5, 17, 64])
def test_concurrency_search_is_exact_in_whole_users(capacity: int) -> None:
    spec = SearchSpec(kind="concurrency", start=4, precision=1)
    result = search(spec, probe_below(capacity))
    assert (result.status, result.capacity, result.failing) == ("found", capacity, capacity + 1)
    assert all(p.load == int(p.load) for p in result.probes)


def test_search_at_the_edges_of_its_range() -> None:
    high = search(SearchSpec(kind="rate", start=1, max_load=16), probe_below(1000))
    assert (high.status, high.capacity, high.failing) == ("at_least_max", 16, None)
    assert [p.load for p in high.probes] == [1, 2, 4, 8, 16]
    low = search(SearchSpec(kind="rate", start=1, min_load=0.25), probe_below(0.01))
    assert (low.status, low.capacity, low.failing) == ("below_min", None, 0.25)
    capped = search(SearchSpec(kind="rate", start=1, max_probes=3), probe_below(100))
    assert capped.status == "max_probes" and len(capped.probes) == 3


def stopped_by_a_burst(capacity: float, burst: tuple[float, float]
                       ) -> tuple[Callable[[float], ProbeOutcome], Callable[[float], ProbeOutcome]]:
    """A fake engine of ``capacity`` whose early stop also fires, wrongly, on loads within
    ``burst`` (a burst in the trace); run to its end, such a load passes. (probe, confirm)."""
    def probe(load: float) -> ProbeOutcome:
        if burst[0] <= load <= burst[1] or load > capacity:
            return ProbeOutcome(load=load, attainment=0.8, passed=False,
                                stopped="over-saturated: ...")
        return ProbeOutcome(load=load, attainment=1.0, passed=True)

    def confirm(load: float) -> ProbeOutcome:
        ok = load <= capacity
        return ProbeOutcome(load=load, attainment=1.0 if ok else 0.5, passed=ok, full=True)
    return probe, confirm


@pytest.mark.parametrize("start", [0.7, 1.0, 3.0, 6.107])
def test_an_early_stop_never_sets_the_answer(start: float) -> None:
    """The search's answer must not depend on where it started because an early stop fired
    on a load that passes (review case: 6.107 req/s stopped, 6.266 passed)."""
    probe, confirm = stopped_by_a_burst(7.3, (5.9, 6.2))
    result = search(SearchSpec(kind="rate", start=start, precision=0.05), probe,
                    confirm=confirm)
    assert result.status == "found"
    assert result.passing is not None and result.failing is not None
    assert result.passing <= 7.3 < result.failing
    assert result.failing / result.passing - 1 <= 0.05
    # the failing end of the bracket was run to its end, or failed without an early stop
    deciding = [p for p in result.probes if p.load == result.failing]
    assert deciding[-1].full or not deciding[-1].stopped


def test_below_the_lowest_load_never_rests_on_an_early_stop() -> None:
    """Halving down to --min-load, the lowest load stopped early by a burst is run to its
    end too: it passes, and the search goes on above it (review case: "< 4" after a single
    probe stopped early, where 4 req/s passes)."""
    probe, confirm = stopped_by_a_burst(7.3, (3.9, 4.1))
    result = search(SearchSpec(kind="rate", start=4, min_load=4), probe, confirm=confirm)
    assert result.status == "found"
    assert result.passing is not None and result.passing <= 7.3 < (result.failing or 0)
    plain = search(SearchSpec(kind="rate", start=4, min_load=4), probe)
    assert plain.status == "below_min"  # without a confirming run, what the stop said


def test_a_confirmed_failure_ends_the_search() -> None:
    """An early stop on a load that fails run to its end too: one more run, same answer."""
    probe, confirm = stopped_by_a_burst(7.3, (0.0, 0.0))
    plain = search(SearchSpec(start=1.0), probe)
    confirmed = search(SearchSpec(start=1.0), probe, confirm=confirm)
    assert (confirmed.passing, confirmed.failing) == (plain.passing, plain.failing)
    assert [p.full for p in confirmed.probes] == [False] * len(plain.probes) + [True]


def test_known_probes_are_reused_not_rerun() -> None:
    """A resumed search walks the same loads and runs only those not done before."""
    first_calls: list[float] = []
    full = search(SearchSpec(start=1.0), probe_below(7.3, first_calls))
    known = {p.load: p for p in full.probes[:4]}
    calls: list[float] = []
    resumed = search(SearchSpec(start=1.0), probe_below(7.3, calls), known=known)
    assert [p.load for p in resumed.probes] == first_calls
    assert calls == first_calls[4:]
    assert [p.resumed for p in resumed.probes] == [True] * 4 + [False] * (len(calls))
    assert (resumed.passing, resumed.failing) == (full.passing, full.failing)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("target", 1.5, "target"), ("start", 0.0, "start"), ("precision", -1.0, "precision"),
    ("growth", 1.0, "growth"), ("max_probes", 1, "max_probes"),
])
def test_bad_spec_names_the_field(field: str, value: float, message: str) -> None:
    spec = SearchSpec(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        spec.validate()
    with pytest.raises(ValueError, match="whole numbers"):
        SearchSpec(kind="concurrency", start=2.5).validate()


# ---------------------------------------------------------------- over-saturation


def test_saturation_needs_a_backlog_that_rises_at_every_check() -> None:
    monitor = SaturationMonitor(interval_s=1.0, num_rising=3, min_backlog=10)
    reasons = [monitor(LoadState(t_s=t, num_sent=0, num_done=0, num_waiting=w))
               for t, w in [(0, 2), (0.5, 99), (1, 6), (2, 11), (3, 20), (4, 31)]]
    # (0.5 s is between checks and ignored); 2 -> 6 -> 11 -> 20: three rises, >= 10
    assert reasons[:4] == [None, None, None, None]
    assert reasons[4] is not None and "waiting queue" in reasons[4]
    assert "from 2 to 20" in reasons[4]


def test_saturation_goes_on_while_the_engine_keeps_up() -> None:
    monitor = SaturationMonitor(interval_s=1.0, num_rising=3, min_backlog=10)
    for t, w in enumerate([5, 40, 50, 45, 60, 70, 65]):  # a fall in every window
        assert monitor(LoadState(t_s=t, num_sent=0, num_done=0, num_waiting=w)) is None
    small = SaturationMonitor(interval_s=1.0, num_rising=3, min_backlog=100)
    for t, w in enumerate([1, 2, 3, 4, 5, 6]):  # rising, but never a real backlog
        assert small(LoadState(t_s=t, num_sent=0, num_done=0, num_waiting=w)) is None


def test_saturation_without_telemetry_counts_requests_in_flight_and_send_lag() -> None:
    monitor = SaturationMonitor(interval_s=1.0, num_rising=2, min_backlog=5)
    states = [LoadState(t_s=t, num_sent=10 * (t + 1), num_done=7 * (t + 1)) for t in range(3)]
    assert [monitor(s) for s in states][-1] is not None  # 3, 6, 9 in flight
    lag = SaturationMonitor(interval_s=1.0, num_rising=2, min_backlog=10**6,
                            max_send_lag_s=0.5)
    out = [lag(LoadState(t_s=t, num_sent=1, num_done=0, send_lag_s=v))
           for t, v in enumerate([0.1, 0.4, 0.9])]
    assert out[:2] == [None, None] and out[2] is not None and "send lag" in out[2]


def test_check_interval_scales_with_the_run() -> None:
    assert interval_for(3.0) == pytest.approx(0.1)
    assert interval_for(1e6) == 5.0
    assert interval_for(0.0) == 0.05
