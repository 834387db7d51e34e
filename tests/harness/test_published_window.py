"""Closed-loop rows: simulated as a closed loop, measured over the row's window."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from adapters.reference.cost_model import CostModelParams
from harness.metrics import summarize
from harness.published.profiles import read_profile
from harness.published.replay import metric_value, predict_row, row_workload, window_summary
from harness.published.rows import MEASUREMENTS_CSV, PublishedRow, RowError, load_rows
from harness.sim import simulate
from harness.target import ClosedLoop
from harness.timeline import RequestTimeline


def _row(**kw: object) -> PublishedRow:
    base: dict[str, object] = dict(
        row_id="w", source_id="synthetic", source="test", source_date="2026-01-01",
        engine="vllm", engine_version="test", gpu="h100-sxm", model="llama-3.1-8b",
        weights_dtype="bf16", kv_cache_dtype="bf16", tensor_parallel_size=1,
        input_tokens=256, output_tokens=32, dataset="synthetic-fixed", num_requests=24,
        arrival="concurrency", arrival_value=4.0, metric="ttft_mean_s", value=1.0,
        window="run", engine_settings="", notes="")
    base.update(kw)
    return PublishedRow(**base)  # type: ignore[arg-type]


def _tl(i: int, sent: float, first: float, end: float) -> RequestTimeline:
    return RequestTimeline(f"r{i}", sent, 8, 3, chunk_times_s=(first, (first + end) / 2, end),
                           chunk_num_tokens=(1, 1, 1), finished_s=end, num_output_tokens=3)


def test_a_steady_window_leaves_out_the_ramp_and_the_drain() -> None:
    # two users, eight requests: r0, r1 are the ramp, r6, r7 the drain
    timelines = [_tl(0, 0.0, 5.0, 6.0), _tl(1, 0.0, 5.0, 7.0)]
    for i in range(2, 8):
        sent = float(i + 4)
        timelines.append(_tl(i, sent, sent + 1.0, sent + 2.0))
    row = _row(arrival_value=2.0, window="steady")
    summary = window_summary(list(reversed(timelines)), row)  # order does not matter
    assert summary["num_requests"] == 4  # r2..r5
    assert summary["ttft_s"]["mean"] == pytest.approx(1.0)  # the ramp's 5 s TTFTs left out
    # window: from r2's send (6 s) to r6's send (10 s); tokens of every request inside it
    t0, t1 = 6.0, 10.0
    tokens = sum(t0 <= t < t1 for tl in timelines for t in tl.chunk_times_s)
    done = sum(t0 <= tl.finished_s < t1 for tl in timelines if tl.finished_s is not None)
    assert summary["throughput"]["output_tokens_per_s"] == pytest.approx(tokens / (t1 - t0))
    assert summary["throughput"]["requests_per_s"] == pytest.approx(done / (t1 - t0))
    # the whole run, for comparison
    whole = window_summary(timelines, replace(row, window="run"))
    assert whole["num_requests"] == 8 and whole["ttft_s"]["mean"] > 1.0


def test_a_steady_window_needs_three_rounds_of_requests() -> None:
    timelines = [_tl(i, float(i), i + 1.0, i + 2.0) for i in range(5)]
    with pytest.raises(ValueError, match="at least 3 x 2 requests"):
        window_summary(timelines, _row(arrival_value=2.0, window="steady"))


def test_a_concurrency_row_is_simulated_as_a_closed_loop() -> None:
    row = _row()
    profile = read_profile("vllm-h100-sxm")
    work = row_workload(row, profile)
    timelines = simulate(work.requests, work.config, closed_loop=ClosedLoop(4)).timelines
    expected = metric_value(summarize(timelines, by_priority=False), row.metric)
    assert predict_row(row, profile).predicted == pytest.approx(expected, rel=1e-12)
    # never more than 4 requests in the system
    events = sorted([(tl.start_s, 1) for tl in timelines]
                    + [(tl.finished_s or 0.0, -1) for tl in timelines], key=lambda e: (e[0], e[1]))
    in_flight = peak = 0
    for _, delta in events:
        in_flight += delta
        peak = max(peak, in_flight)
    assert peak <= 4


def test_the_fit_can_still_ask_for_its_emulated_loop() -> None:
    row = _row(metric="tpot_mean_s")
    profile = read_profile("vllm-h100-sxm")
    simulated = predict_row(row, profile, CostModelParams()).predicted
    emulated = predict_row(row, profile, CostModelParams(), emulate_closed_loop=True).predicted
    assert emulated == pytest.approx(simulated, rel=0.2)  # same loop, two models of it


def test_only_closed_loops_have_a_steady_window(tmp_path: Path) -> None:
    lines = MEASUREMENTS_CSV.read_text().splitlines()
    header = lines[0].split(",")
    offline = next(i for i, ln in enumerate(lines) if ",offline,," in ln)
    bad = lines[offline].replace(",run,", ",steady,", 1)
    (tmp_path / "m.csv").write_text("\n".join([lines[0], bad]) + "\n")
    assert "window" in header
    with pytest.raises(RowError, match=r"m\.csv:2: window 'steady' needs arrival"):
        load_rows(tmp_path / "m.csv")


def test_the_nim_rows_are_steady_windows_and_the_rest_whole_runs() -> None:
    rows = load_rows()
    steady = {r.source_id for r in rows if r.window == "steady"}
    assert steady == {"nim-llama-3.3-70b-1.8.0"}
    assert all(r.arrival == "concurrency" for r in rows if r.window == "steady")
