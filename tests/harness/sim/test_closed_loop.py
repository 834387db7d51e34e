"""Closed-loop simulation: N users on the virtual clock, each sending when its last request ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters.reference import ReferenceConfig
from harness.sim import simulate
from harness.target import ClosedLoop, LoadState, RunOptions, TargetSpec
from harness.targets import make_target
from harness.timeline import RequestTimeline
from harness.traces import Trace, TraceRequest

CONFIG = ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm", policy="fcfs")


def _requests(n: int, *, arrival_gap_s: float = 0.0) -> list[TraceRequest]:
    # Varied lengths so that finishes never line up by accident.
    return [TraceRequest(f"r{i}", i * arrival_gap_s, 64 + 37 * (i % 5), 3 + (i * 7) % 11)
            for i in range(n)]


def _in_flight(timelines: list[RequestTimeline], t: float) -> int:
    """Requests a user has sent and not yet seen finish at instant ``t``."""
    return sum(1 for tl in timelines
               if tl.arrival_s <= t and (tl.finished_s is None or tl.finished_s > t))


@pytest.mark.parametrize("concurrency", [1, 3, 8])
def test_exactly_n_in_flight_until_the_trace_runs_out(concurrency: int) -> None:
    result = simulate(_requests(40), CONFIG, closed_loop=ClosedLoop(concurrency),
                      check_invariants=True)
    timelines = result.timelines
    assert [tl.request_id for tl in timelines] == [f"r{i}" for i in range(40)]
    assert all(tl.ok for tl in timelines)
    last_arrival = max(tl.arrival_s for tl in timelines)
    events = sorted({tl.arrival_s for tl in timelines} | {tl.finished_s for tl in timelines
                                                           if tl.finished_s is not None})
    # Between events nothing changes, so checking every event instant checks all of time.
    for t in events:
        if t < last_arrival:
            assert _in_flight(timelines, t) == concurrency, t
    # At the last arrival the trace runs out: users freed then get no more requests.
    assert 1 <= _in_flight(timelines, last_arrival) <= concurrency
    # Then the users run out of requests and the count falls to 0.
    assert _in_flight(timelines, max(tl.finished_s or 0.0 for tl in timelines)) == 0


def test_one_user_sends_each_request_when_the_last_one_ends() -> None:
    """By hand: one user, think time 0.25 s. r0 goes at 0; r1 at r0's finish + 0.25; r2 at
    r1's finish + 0.25. Each request runs alone, so its TTFT is one prefill step."""
    reqs = [TraceRequest("r0", 5.0, 100, 4), TraceRequest("r1", 0.0, 100, 4),
            TraceRequest("r2", 0.0, 100, 4)]
    r0, r1, r2 = simulate(reqs, CONFIG, closed_loop=ClosedLoop(1, think_time_s=0.25)).timelines
    assert r0.arrival_s == 5.0  # the first user starts at the trace's first arrival
    assert r0.finished_s is not None and r1.finished_s is not None
    assert r1.arrival_s == r0.finished_s + 0.25
    assert r2.arrival_s == r1.finished_s + 0.25
    # Identical requests served alone take identical times.
    assert r1.finished_s - r1.arrival_s == pytest.approx(r0.finished_s - r0.arrival_s)


def test_two_users_the_next_request_goes_to_the_first_user_free() -> None:
    reqs = [TraceRequest("long", 0.0, 100, 40), TraceRequest("short", 0.0, 100, 2),
            TraceRequest("third", 0.0, 100, 2)]
    long, short, third = simulate(reqs, CONFIG, closed_loop=ClosedLoop(2)).timelines
    assert long.arrival_s == short.arrival_s == 0.0
    assert short.finished_s is not None and long.finished_s is not None
    assert third.arrival_s == short.finished_s < long.finished_s


def test_decode_spans_match_step_by_step_in_a_closed_loop() -> None:
    reqs = _requests(60)
    loop = ClosedLoop(6, think_time_s=0.01)
    fast = simulate(reqs, CONFIG, closed_loop=loop)
    slow = simulate(reqs, CONFIG, closed_loop=loop, decode_spans=False)
    assert fast.timelines == slow.timelines
    assert fast.steps.equals(slow.steps)


def test_bad_closed_loop_is_refused() -> None:
    with pytest.raises(ValueError, match="concurrency: must be a positive integer"):
        simulate(_requests(2), CONFIG, closed_loop=ClosedLoop(0))
    with pytest.raises(ValueError, match="think_time_s"):
        simulate(_requests(2), CONFIG, closed_loop=ClosedLoop(2, think_time_s=-1.0))


def test_early_stop_ends_an_over_saturated_run() -> None:
    """200 requests at once: the waiting queue is long from the start; the check says stop."""
    seen: list[LoadState] = []

    def stop(state: LoadState) -> str | None:
        seen.append(state)
        return "queue too long" if state.num_waiting and state.num_waiting > 50 else None

    small = ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm", policy="fcfs",
                            max_num_seqs=4)
    reqs = [TraceRequest(f"r{i}", i * 0.001, 200, 50) for i in range(200)]
    result = simulate(reqs, small, early_stop=stop)
    assert result.stopped_reason == "queue too long"
    assert seen and seen[-1].num_waiting is not None and seen[-1].num_waiting > 50
    assert len(result.timelines) + result.num_not_sent == 200
    assert result.num_not_sent > 0
    assert any(tl.error_kind == "not_finished" for tl in result.timelines)
    full = simulate(reqs, small)
    assert full.stopped_reason is None and len(full.timelines) == 200


def test_simulated_target_runs_a_closed_loop_into_a_run_folder(tmp_path: Path) -> None:
    trace = Trace(tuple(_requests(12, arrival_gap_s=100.0)), source="t", format="synthetic",
                  digest="d")
    target = make_target(TargetSpec("reference", "simulate"))
    summary = target.run(trace, tmp_path, RunOptions(closed_loop=ClosedLoop(4),
                                                     write_report=False))
    assert summary["num_completed"] == 12
    # The trace's 100 s gaps are not used: the run takes far less than 1,100 s.
    assert summary["duration_s"] < 10
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["load"] == {"mode": "closed", "concurrency": 4, "think_time_s": 0.0,
                                "kind": "concurrency", "value": 4}
    assert manifest["roofline"]["ridge_flop_per_byte"] > 0


def test_a_scenario_sweeps_concurrency_on_the_simulated_reference(tmp_path: Path) -> None:
    """``load: {concurrencies: [...]}`` for a simulated cell: N users on the virtual clock, and
    the report draws the setting's curve across the two load points."""
    import io

    from harness.scenario import load_scenario, run_scenario
    from harness.scenario.runner import SweepProgress

    path = tmp_path / "conc.yaml"
    path.write_text(
        "name: conc\nquestion: how many users?\n"
        "trace: {path: azure_conv_excerpt.csv, limit: 24, prompt_tokens: 256,"
        " output_tokens: 16}\n"
        "load: {concurrencies: [2, 8]}\nmodel: llama-3.1-8b\ngpu: h100-sxm\n"
        "slo: {ttft_s: 0.05, tpot_s: 0.05}\n"
        "engines:\n  - {name: fcfs, engine: reference, knobs: {policy: fcfs}}\n")
    result = run_scenario(load_scenario(path), tmp_path / "out",
                          progress=SweepProgress(2, stream=io.StringIO(), tty=False))
    assert [o.state for o in result.outcomes] == ["done", "done"]
    folder = tmp_path / "out" / "conc"
    for users in (2, 8):
        manifest = json.loads((folder / f"fcfs__conc-{users}" / "manifest.json").read_text())
        assert manifest["load"] == {"mode": "closed", "concurrency": users,
                                    "think_time_s": 0.0, "kind": "concurrency", "value": users}
    report = (folder / "report.md").read_text()
    assert "### `fcfs`" in report.split("## Throughput–latency curves")[1]
    assert "| 2 users |" in report and "| 8 users |" in report
