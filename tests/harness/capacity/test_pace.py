"""A rate probe passes only when the engine kept pace with its arrivals; and the capacity
command line refuses what it would ignore, keeps the scenario's baseline, and writes nothing
before it refuses a --resume."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.capacity import SEARCH_FILE
from harness.capacity.probe import outcome_from_summary
from harness.cli import main as cli_main
from harness.metrics import PACE_TOLERANCE
from harness.results import pace_of

REPO = Path(__file__).resolve().parents[3]
SMALL = REPO / "tests" / "data" / "scenario_small.yaml"


def write_requests(run_dir: Path, arrival: np.ndarray, finished: np.ndarray) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"arrival_s": arrival, "finished_s": finished,
                             "e2e_s": finished - arrival,
                             "error_kind": pa.array([None] * arrival.size, pa.string())}),
                   run_dir / "requests.parquet")
    return run_dir


def served_in_order(arrival: np.ndarray, service_s: float) -> np.ndarray:
    """One request at a time, each taking ``service_s``: the finish instants."""
    finished, free = [], 0.0
    for t in arrival:
        free = max(free, t) + service_s
        finished.append(free)
    return np.array(finished)


ARRIVALS = np.arange(200) * 0.1  # 10 req/s for 20 s


def test_an_engine_faster_than_the_arrivals_keeps_pace(tmp_path: Path) -> None:
    pace = pace_of(write_requests(tmp_path / "r", ARRIVALS, served_in_order(ARRIVALS, 0.08)))
    assert pace is not None and pace.kept and pace.why is None
    assert pace.completed_per_s == pytest.approx(10, rel=0.05)


def test_an_engine_slower_than_the_arrivals_falls_behind(tmp_path: Path) -> None:
    # 8 req/s served of 10 arriving: the backlog grows by 2 a second (for 100 s: enough
    # requests that the shortfall is not chance)
    arrival = np.arange(1000) * 0.1
    pace = pace_of(write_requests(tmp_path / "r", arrival, served_in_order(arrival, 0.125)))
    assert pace is not None and not pace.kept
    assert pace.completed_per_s == pytest.approx(8, rel=0.05)
    assert pace.completed_per_s < (1 - PACE_TOLERANCE) * pace.due_per_s
    assert pace.why is not None and pace.why.startswith("fell behind: completed 8")


def test_a_burst_shorter_than_its_requests_shows_no_steady_state(tmp_path: Path) -> None:
    arrival = np.arange(20) * 0.05  # all within 1 s
    pace = pace_of(write_requests(tmp_path / "r", arrival, arrival + 3.0))
    assert pace is not None and not pace.kept
    assert pace.why == ("too short to show a steady state: its arrivals last 0.95 s, under "
                        "4 times its E2E p90 (3 s)")
    # however many requests met the SLO, the probe fails
    summary = {"goodput": {"slo_attainment": 1.0}, "throughput": {}}
    outcome = outcome_from_summary(20.0, summary, 0.99, pace=pace)
    assert not outcome.passed and outcome.behind == pace.why and outcome.kept_pace is False


def test_a_short_trace_does_not_claim_a_burst_as_capacity(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before the pace check, 100 requests at 30 req/s passed (the whole trace fitted in one
    batch), and the search reported about 30 req/s from a 3 s trace."""
    out = tmp_path / "cap"
    assert cli_main(["capacity", "--trace", str(REPO / "harness/data/azure_conv_excerpt.csv"),
                     "--limit", "100", "--max-num-seqs", "64", "--start", "32",
                     "--slo", "ttft_s=0.5,tpot_s=0.03", "--out", str(out)]) == 0
    search = json.loads((out / "reference" / SEARCH_FILE).read_text())
    first = search["probes"][0]
    assert first["load"] == 32 and not first["passed"]
    assert first["behind"].startswith("too short")  # one burst
    assert search["capacity"] < 8
    # only the trace's length stopped it: a lower bound, said so where the answer is read
    assert search["status"] == "trace_too_short"
    report = (out / "report.md").read_text()
    finding = report.split("## Key findings")[1].split("\n- ")[1]
    assert f"`reference` ≥ {search['capacity']:.4g} req/s (the trace too short to test more)" \
        in finding
    assert "the trace was too short to show a steady state; a trace with more requests may " \
        "show more" in report
    printed = capsys.readouterr().out
    assert f"≥ {search['capacity']:g}" in printed and "trace_too_short" in printed


def test_a_concurrency_search_stops_where_each_user_still_sends_4_requests(
        tmp_path: Path) -> None:
    """100 requests for 81 users is one burst of first requests, not the steady load of 81
    users: the search stops at 4 requests a user (review case: 81 users found on 100
    requests, 89 on 1,000) and says why."""
    out = tmp_path / "cap"
    assert cli_main(["capacity", "--trace", "synthetic", "--num-requests", "48",
                     "--prompt-tokens", "64", "--output-tokens", "8", "--search",
                     "concurrency", "--slo", "ttft_s=30", "--out", str(out)]) == 0
    search = json.loads((out / "reference" / SEARCH_FILE).read_text())
    assert search["status"] == "at_least_max" and search["capacity"] == 12
    assert max(p["load"] for p in search["probes"]) == 12
    assert search["load_cap"].startswith("one user per 4 requests of the trace (48 requests: "
                                         "12 users)")


def test_a_scenario_search_refuses_the_options_it_would_ignore(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(["capacity", str(SMALL), "--gpu", "h200", "--max-num-seqs", "8",
                     "--limit", "10", "--out", str(tmp_path / "cap")])
    assert code == 2
    err = capsys.readouterr().err
    assert "--gpu, --limit, --max-num-seqs: not with a scenario file" in err
    # refused when given, even at the value a flag has when not given
    assert cli_main(["capacity", str(SMALL), "--model", "llama-3.1-8b", "--seed", "0",
                     "--out", str(tmp_path / "cap")]) == 2
    assert "--model, --seed: not with a scenario file" in capsys.readouterr().err
    assert not (tmp_path / "cap").exists()


def test_a_scenario_search_keeps_the_scenarios_baseline(tmp_path: Path) -> None:
    # scenario_small.yaml's baseline is the engine `static`
    out = tmp_path / "cap"
    assert cli_main(["capacity", str(SMALL), "--only", "*-4", "--max-probes", "3",
                     "--out", str(out)]) == 0
    meta = json.loads((out / "scenario.json").read_text())
    assert meta["baseline"].startswith("static__max_num_seqs-4/")
    report = (out / "report.md").read_text()
    # the search was cut short: the capacity is only a lower bound
    assert "not within 5%: stopped by --max-probes" in report


def test_a_refused_resume_rewrites_nothing(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cap"
    args = ["capacity", "--trace", "synthetic", "--num-requests", "20", "--prompt-tokens",
            "64", "--output-tokens", "8", "--max-probes", "2", "--slo", "ttft_s=1",
            "--out", str(out)]
    assert cli_main(args) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    # another target, then the early stop turned off: other rules, refused
    for other in (["--target", "0.95"], ["--no-early-stop"]):
        assert cli_main([*args, *other, "--resume"]) == 2
        assert "made with other settings" in capsys.readouterr().err
        assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_a_search_started_over_leaves_no_probe_of_the_earlier_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cap"
    args = ["capacity", "--trace", "synthetic", "--num-requests", "20", "--prompt-tokens",
            "64", "--output-tokens", "8", "--max-probes", "3", "--out", str(out)]
    assert cli_main([*args, "--slo", "ttft_s=1"]) == 0
    first = {p.name for p in (out / "reference").iterdir() if p.is_dir()}
    assert cli_main([*args, "--slo", "ttft_s=2", "--start", "3", "--overwrite"]) == 0
    search = json.loads((out / "reference" / SEARCH_FILE).read_text())
    probes = {p["label"] for p in search["probes"]}
    assert {p.name for p in (out / "reference").iterdir() if p.is_dir()} == probes
    assert first - probes  # the earlier search had folders this one did not make
    assert f"removed {len(first)} probe folder(s) of an earlier search" in capsys.readouterr().err


def test_capacities_closer_than_the_search_precision_are_not_called_different() -> None:
    from harness.report.curves import CapacityRow, within_precision

    def row(cap: float, source: str = "search", kind: str = "rate",
            precision: float = 0.05) -> CapacityRow:
        return CapacityRow("s", kind, cap, "=", source, "", (), "", precision)

    assert within_precision(row(10.4), row(10.0))  # 4% apart, 5% precision
    assert not within_precision(row(10.6), row(10.0))
    assert not within_precision(row(10.4, source="interpolated"), row(10.0))
    assert within_precision(row(17, kind="concurrency", precision=1),
                            row(16, kind="concurrency", precision=1))
    assert not within_precision(row(18, kind="concurrency", precision=1),
                                row(16, kind="concurrency", precision=1))


def test_a_setting_that_refuses_every_request_fails_at_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A KV cache that holds no request alone: every probe would refuse every request, at any
    load, so the search fails at its first probe with the engine's words, not halving on."""
    out = tmp_path / "cap"
    assert cli_main(["capacity", "--trace", str(REPO / "harness/data/azure_conv_excerpt.csv"),
                     "--limit", "20", "--num-gpu-blocks", "1", "--slo", "ttft_s=1",
                     "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert ("search failed: none of the 20 requests completed (rejected 20); "
            "the first: request ") in err
    assert err.rstrip().endswith("the engine refuses these requests at any load")
    assert len([d for d in (out / "reference").iterdir() if d.is_dir()]) == 1  # one probe


def test_a_minimum_load_of_zero_is_refused_for_what_it_is(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["capacity", "--trace", str(REPO / "harness/data/azure_conv_excerpt.csv"),
                     "--limit", "20", "--min-load", "0", "--slo", "ttft_s=1",
                     "--out", str(tmp_path / "cap")]) == 2
    assert "--min-load: must be a positive load, got 0" in capsys.readouterr().err


def test_a_short_run_whose_queue_plainly_grew_is_said_to_have_fallen_behind() -> None:
    """Too short to show a steady state (requests decode for 30 s, arrivals last 20 s), yet
    served one at a time at a fifth of the arrival rate: the wait for a first token grows by
    far more than a tenth of the span, which the edges of a short run cannot do."""
    from harness.metrics import pace

    arrival = np.arange(200) * 0.1  # 10 req/s for 20 s
    decode_s = 30.0
    first = np.empty_like(arrival)
    free = 0.0
    for i, t in enumerate(arrival):  # a first token every 0.5 s: 2 req/s
        first[i] = free = max(free, t) + 0.5
    finished = first + decode_s
    swamped = pace(arrival, finished, finished - arrival, np.ones(200, bool), first)
    assert swamped is not None and swamped.settled is False and swamped.fell_behind
    assert swamped.queue_growth_s is not None and swamped.queue_growth_s > 0.1 * 19.9
    assert swamped.swamped and swamped.overloaded
    # the same short run keeping up: every first token 0.5 s after its arrival, no growth
    first = arrival + 0.5
    finished = first + decode_s
    kept = pace(arrival, finished, finished - arrival, np.ones(200, bool), first)
    assert kept is not None and kept.settled is False
    assert kept.queue_growth_s == pytest.approx(0.0)
    assert not kept.swamped and not kept.overloaded


def test_a_rising_arrival_rate_with_long_requests_is_no_backlog(tmp_path: Path) -> None:
    """The shipped Azure excerpt's arrivals speed up over the trace (24, 36, 61 and 79 per
    quarter of its first 200) and its decode times have a long tail. At 8.354 req/s no
    request ever waits (the engine's waiting queue stays empty), yet the arrivals of one
    median decode time earlier outnumbered the completions by more than the tolerance (long
    requests arriving late finish after the last arrival, and late arrivals are more): a
    capacity search called this load fallen behind, and reported half the capacity. Counted
    where each request was due, its own decode time after its arrival, the two agree."""
    import pyarrow.parquet as pq

    from harness.metrics import pace

    run = tmp_path / "run"
    assert cli_main(["simulate", "--trace", str(REPO / "harness/data/azure_conv_excerpt.csv"),
                     "--limit", "200", "--rate", "8.354", "--no-report",
                     "--out", str(run)]) == 0
    assert max(pq.read_table(run / "steps.parquet").column("num_waiting").to_pylist()) == 0
    r = pq.read_table(run / "requests.parquet").to_pydict()
    arrival, finished, first = (np.array(r[k], dtype=float)
                                for k in ("arrival_s", "finished_s", "first_token_s"))
    ok = np.isfinite(finished)
    kept = pace(arrival, finished, finished - arrival, ok, first)
    assert kept is not None and kept.settled and kept.kept and not kept.fell_behind
    # the premise: the old count fell short by more than chance and the tolerance allow
    start, end = float(arrival.min()), float(arrival.max())
    mid = (start + end) / 2
    lag = min(float(np.median(finished - first)), (end - start) / 4)
    arrived = np.count_nonzero((arrival > mid - lag) & (arrival <= end - lag))
    done = np.count_nonzero((finished > mid) & (finished <= end))
    assert arrived - done > max(PACE_TOLERANCE * arrived, 2 * np.sqrt(arrived))
    # the same arrivals with a wait that grows, 20 ms more for each request served
    first = first + 0.02 * np.arange(arrival.size)
    finished = finished + 0.02 * np.arange(arrival.size)
    behind = pace(arrival, finished, finished - arrival, ok, first)
    assert behind is not None and behind.fell_behind and behind.overloaded


def test_a_closed_loop_is_judged_once_its_users_are_under_way(tmp_path: Path) -> None:
    """72 users on the quickstart's trace: their first requests, all sent at once at the
    start, miss the TTFT SLO as no steady load of 72 users would, and decided a concurrency
    capacity alone (README review case: 58 users found, every miss of the probe at 59 among
    its users' first requests). The attainment a probe is judged by leaves them out."""
    from harness.capacity.probe import outcome_from_summary
    from harness.metrics import Slo
    from harness.results import attainment_after_warm_up

    run = tmp_path / "run"
    slo = Slo(ttft_s=1.0, tpot_s=0.05)
    assert cli_main(["simulate", "--trace", str(REPO / "harness/data/azure_conv_excerpt.csv"),
                     "--limit", "400", "--mode", "closed", "--concurrency", "72",
                     "--slo", "ttft_s=1,tpot_s=0.05", "--no-report", "--out", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    under_way = attainment_after_warm_up(run, slo)
    assert under_way is not None
    attainment, num_first = under_way
    assert num_first == 72  # one per user: sent before any request completed
    whole = summary["goodput"]["slo_attainment"]
    assert whole < 0.99 <= attainment  # the burst alone fails the probe
    r = pq.read_table(run / "requests.parquet").to_pydict()
    first_done = min(f for f, e in zip(r["finished_s"], r["error_kind"], strict=True)
                     if e is None)
    burst = [i for i, a in enumerate(r["arrival_s"]) if a < first_done]
    assert len(burst) == 72 and all(r["arrival_s"][i] == 0.0 for i in burst)
    # the probe's outcome: judged by it, and saying how many it left out
    outcome = outcome_from_summary(72, summary, 0.99, warm_up=under_way)
    assert outcome.passed and outcome.attainment == attainment and outcome.num_warm_up == 72
    assert not outcome_from_summary(72, summary, 0.99).passed


def test_a_wait_that_plainly_grew_fails_the_pace_whatever_the_counts(tmp_path: Path) -> None:
    """At 3.512 req/s with 8 slots, the excerpt's waiting queue grows from none to dozens
    over the run, and TTFT from about 10 ms to 12 s; yet the completions fell short of the
    due requests by less than the 2 sigma a Poisson count of them allows, and a capacity
    search found this load (review case). A wait that grew by more than a tenth of the
    arrivals' span fails it, as it flags a run too short to count on."""
    from harness.results import pace_of

    run = tmp_path / "run"
    assert cli_main(["simulate", "--trace", str(REPO / "harness/data/azure_conv_excerpt.csv"),
                     "--limit", "400", "--max-num-seqs", "8", "--rate", "3.512",
                     "--no-report", "--out", str(run)]) == 0
    pace = pace_of(run)
    assert pace is not None and pace.settled and pace.fell_behind and not pace.kept
    assert pace.queue_growth_s is not None and pace.span_s is not None
    assert pace.queue_growth_s > 0.1 * pace.span_s
    assert pace.why is not None and pace.why.startswith("fell behind: those arriving last")
    # the premise: the counts alone were within chance
    n = pace.due_per_s * pace.span_s / 2
    assert (pace.due_per_s - pace.completed_per_s) * pace.span_s / 2 < 2 * np.sqrt(n)
