"""Prediction fidelity: the comparison, its JSON shape and its markdown section."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pytest

from harness.metrics import summarize
from harness.report.fidelity import (
    METRICS,
    PERCENTILES,
    batch_size_comparison,
    compare,
    fidelity,
    per_request_errors,
    render_fidelity_markdown,
)
from harness.timeline import RequestTimeline
from harness.traces import Trace, TraceRequest
from harness.validate import as_sent


def timeline(rid: str, start: float, ttft: float, itl: float, n: int, *,
             sent: float | None = None, error: str | None = None) -> RequestTimeline:
    t0 = start if sent is None else sent
    times = tuple(t0 + ttft + i * itl for i in range(n))
    return RequestTimeline(rid, start, 100, n, sent_s=sent, chunk_times_s=times,
                           chunk_num_tokens=(1,) * n, finished_s=times[-1],
                           error_kind=error, num_output_tokens=n)


def run(ttft: float, itl: float) -> list[RequestTimeline]:
    return [timeline(f"r{i}", float(i), ttft * (1 + i / 10), itl, 11) for i in range(10)]


def test_compare_is_signed_relative_to_measured() -> None:
    assert compare(1.1, 1.0) == {"predicted": 1.1, "measured": 1.0,
                                 "relative_error": pytest.approx(0.1)}
    assert compare(0.5, 1.0)["relative_error"] == pytest.approx(-0.5)
    assert compare(1.0, None)["relative_error"] is None
    assert compare(1.0, 0.0)["relative_error"] is None
    assert compare(math.nan, 1.0) == {"predicted": None, "measured": 1.0, "relative_error": None}


def test_fidelity_has_every_metric_and_percentile() -> None:
    predicted, measured = run(0.2, 0.05), run(0.25, 0.04)
    fid = fidelity(summarize(predicted), summarize(measured), predicted, measured)
    for metric in METRICS:
        for pct in PERCENTILES:
            c = fid[metric][pct]
            assert set(c) == {"predicted", "measured", "relative_error"}
            assert c["relative_error"] == pytest.approx((c["predicted"] - c["measured"])
                                                        / c["measured"])
    assert fid["ttft_s"]["p50"]["relative_error"] == pytest.approx(-0.2)
    assert fid["tpot_s"]["p50"]["relative_error"] == pytest.approx(0.25)
    assert set(fid["output_tokens_per_s"]) == {"predicted", "measured", "relative_error"}
    per = fid["per_request"]
    assert per["num_matched"] == 10
    assert per["ttft_s"]["median_abs"] == pytest.approx(0.2)
    assert per["ttft_s"]["median"] == pytest.approx(-0.2)  # signed: predicted too low
    assert per["tpot_s"]["median"] == pytest.approx(0.25)
    assert "running_batch_size" not in fid  # no steps / telemetry given
    # both runs have the same sends; predicted requests end later (longer TPOT)
    in_flight = fid["in_flight_requests"]
    assert in_flight["mean"]["predicted"] > in_flight["mean"]["measured"] > 0


def test_per_request_errors_match_by_id_and_skip_failures() -> None:
    predicted = [timeline("a", 0, 0.1, 0.01, 5), timeline("b", 0, 0.1, 0.01, 5),
                 timeline("c", 0, 0.1, 0.01, 5)]
    measured = [timeline("b", 0, 0.2, 0.01, 5), timeline("a", 0, 0.05, 0.01, 5),
                timeline("c", 0, 0.1, 0.01, 5, error="stream_cut"),
                timeline("z", 0, 0.1, 0.01, 5)]
    table = per_request_errors(predicted, measured).to_pylist()
    assert [r["request_id"] for r in table] == ["b", "a"]
    assert table[0]["ttft_s_relative_error"] == pytest.approx(-0.5)
    assert table[1]["ttft_s_relative_error"] == pytest.approx(1.0)
    assert table[0]["tpot_s_measured"] == pytest.approx(0.01)


def test_live_latencies_count_from_the_send() -> None:
    """A late client send is not an engine latency: TTFT runs from sent_s."""
    late = timeline("a", 0.0, 0.1, 0.01, 3, sent=0.5)
    assert late.ttft_s() == pytest.approx(0.1)
    trace = Trace((TraceRequest("a", 0.0, 100, 3), TraceRequest("b", 0.2, 100, 3)),
                  source="t.csv", format="azure", digest="d")
    shifted = as_sent(trace, [late, timeline("b", 0.2, 0.1, 0.01, 3)])
    assert [(r.request_id, r.arrival_s) for r in shifted.requests] == [("b", 0.2), ("a", 0.5)]
    assert shifted.digest == "d" and shifted.source == "t.csv"


def test_requests_the_live_engine_refused_are_not_simulated() -> None:
    """A prompt over the live server's max_model_len is answered 400: it never ran there.
    Simulated, it loaded the requests compared beside it (a TPOT predicted 3 times the one
    measured)."""
    from dataclasses import replace

    from harness.validate import refused_live

    ok = timeline("a", 0.0, 0.1, 0.01, 3)
    refused = replace(timeline("b", 0.1, 0.1, 0.01, 1), chunk_times_s=(), chunk_num_tokens=(),
                      finished_s=None, error_kind="http_error", num_output_tokens=0)
    cut = replace(timeline("c", 0.2, 0.1, 0.01, 2), error_kind="stream_cut")  # it ran
    trace = Trace(tuple(TraceRequest(r, t, 100, 3) for r, t in (("a", 0.0), ("b", 0.1),
                                                                   ("c", 0.2))),
                  source="t.csv", format="azure", digest="d")
    assert refused_live([ok, refused, cut]) == {"b"}
    assert [r.request_id for r in as_sent(trace, [ok, refused, cut]).requests] == ["a", "c"]


def test_running_batch_size_compares_steps_with_telemetry() -> None:
    steps = pa.table({"t_s": [0.0, 1.0, 2.0, 5.0], "duration_s": [1.0, 1.0, 1.0, 1.0],
                      "num_running": [2, 4, 4, 2]})  # idle from 3 s to 5 s
    telemetry = pa.table({"t_s": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
                          "num_running": [2.0, 4.0, 4.0, 0.0, 0.0, 2.0, 0.0]})
    got = batch_size_comparison(steps, telemetry, grid_s=0.5)
    assert got is not None
    assert got["mean"]["relative_error"] == pytest.approx(0.0)
    assert got["max"] == {"predicted": 4.0, "measured": 4.0, "relative_error": 0.0}
    assert got["mean_abs_difference"] == pytest.approx(0.0)
    assert len(got["series"]["t_s"]) == len(got["series"]["measured"])
    half = pa.table({"t_s": [0.0, 1.0], "num_running": [1.0, 1.0]})
    assert batch_size_comparison(steps, half)["mean"]["relative_error"] > 0
    assert batch_size_comparison(steps, pa.table({"t_s": [0.0]})) is None


def test_markdown_section_shows_errors_and_dashes() -> None:
    predicted, measured = run(0.2, 0.05), run(0.25, 0.04)
    fid = fidelity(summarize(predicted), summarize(measured), predicted, measured)
    fid["e2e_s"]["p99"] = compare(None, 1.0)
    text = render_fidelity_markdown(fid)
    assert text.startswith("## Prediction fidelity\n")
    assert "| TTFT p50 | " in text and "-20.0%" in text and "+25.0%" in text
    assert "| E2E latency p99 | – | 1 s | – |" in text
    assert "Per request (10 matched)" in text
    sub = render_fidelity_markdown(fid, title="`sim` predicting `live`", level=3, intro=False)
    assert sub.startswith("### `sim` predicting `live`\n\n| metric |")


def test_fidelity_compares_only_requests_completed_on_both_sides() -> None:
    """The live engine died after 3 of 10 requests: percentiles and throughput of 10 predicted
    against 3 measured would compare different requests (and different loads)."""
    predicted = run(0.2, 0.05)
    measured = run(0.2, 0.05)[:3] + [timeline(f"r{i}", float(i), 0.2, 0.05, 11,
                                              error="connect_error") for i in range(3, 10)]
    m_summary = summarize(measured)
    fid = fidelity(summarize(predicted), m_summary, predicted, measured,
                   common_requests_only=True)
    assert fid["num_completed"] == {"predicted": 10, "measured": 3}
    assert fid["requests_compared"]["basis"] == "completed on both sides"
    assert fid["requests_compared"]["num_compared"] == 3
    for metric in METRICS:
        for pct in PERCENTILES:
            assert fid[metric][pct]["relative_error"] == pytest.approx(0.0), (metric, pct)
    # the same tokens, each over its own run's duration
    assert fid["output_tokens_per_s"]["measured"] == pytest.approx(33 / m_summary["duration_s"])
    text = render_fidelity_markdown(fid)
    assert "**Compared on 3 requests only**: the live run completed 3 requests" in text
    # the same requests on both sides: nothing restricted, nothing said
    same = fidelity(summarize(predicted), summarize(predicted), predicted, predicted,
                    common_requests_only=True)
    assert same["requests_compared"] == {"basis": "all completed", "num_compared": 10,
                                         "note": None}
    assert "Compared on" not in render_fidelity_markdown(same)


def test_validate_says_what_it_assumed_when_the_engine_hides_its_kv_cache() -> None:
    from adapters.base import Knobs
    from harness.calibrate import KvCacheInfo, reference_config
    from harness.validate import _kv_cache, assumed_kv_warning

    kv = KvCacheInfo(block_size=16, num_blocks=160)
    assert _kv_cache(kv, {}) == (kv, "engine")
    recorded = {"engine": {"block_size": 16, "num_kv_blocks": 160}}
    assert _kv_cache(None, recorded) == (kv, "profile")
    assert _kv_cache(None, {"engine": {"block_size": None}}) == (None, "assumed")
    # a shipped profile names its engine (a string): it records no KV cache
    assert _kv_cache(None, {"engine": "vllm"}) == (None, "assumed")
    config = reference_config("llama-3.1-8b", Knobs(max_num_seqs=8), "h100-sxm")
    warning = assumed_kv_warning(config)
    blocks = config.resolved_num_gpu_blocks()
    assert "vllm:cache_config_info" in warning and f"{blocks:,} blocks of 16 tokens" in warning
    predicted = run(0.2, 0.05)
    fid = fidelity(summarize(predicted), summarize(predicted), predicted, predicted)
    fid["warnings"] = [warning]
    assert f"Warning: {warning}." in render_fidelity_markdown(fid)


def test_validate_keeps_out_of_run_folders_and_replaces_an_earlier_one_only_when_asked(
        tmp_path: Path) -> None:
    """It wrote into any folder: over an earlier validation without a word (one stopped part
    way then left the earlier fidelity.json beside its new live run), into a simulate run's."""
    from harness.cli import main
    from harness.cli.calibration import prepare_validation_out
    from harness.cli.common import UserError

    excerpt = Path(__file__).resolve().parents[2] / "harness" / "data" / "azure_conv_excerpt.csv"
    run = tmp_path / "sim"
    assert main(["simulate", "--trace", str(excerpt), "--limit", "3", "--no-report",
                 "--out", str(run)]) == 0
    with pytest.raises(UserError, match="is the run folder of a simulate run"):
        prepare_validation_out(run, overwrite=True)
    earlier = tmp_path / "v"
    assert main(["simulate", "--trace", str(excerpt), "--limit", "3", "--no-report",
                 "--out", str(earlier / "simulated")]) == 0
    (earlier / "fidelity.json").write_text("{}")
    with pytest.raises(UserError, match=r"holds an earlier validation \(fidelity.json, "
                                        r"simulated\); pass --overwrite"):
        prepare_validation_out(earlier, overwrite=False)
    prepare_validation_out(earlier, overwrite=True)
    assert not (earlier / "fidelity.json").exists() and not (earlier / "simulated").exists()
    prepare_validation_out(tmp_path / "new", overwrite=False)  # nothing there: fine


def test_throughput_over_common_requests_stays_over_each_runs_own_duration() -> None:
    """Restricted to the requests both sides completed, throughput is their tokens over each
    run's own duration_s (docs/metrics.md), not over the span of the requests kept: the
    live run's timeouts took time the engine spent."""
    predicted = run(0.2, 0.05)
    measured = run(0.2, 0.05)[:3] + [timeline(f"r{i}", float(i), 30.0, 0.05, 11,
                                              error="timeout") for i in range(3, 10)]
    p_summary, m_summary = summarize(predicted), summarize(measured)
    fid = fidelity(p_summary, m_summary, predicted, measured, common_requests_only=True)
    tput = fid["output_tokens_per_s"]
    assert tput["measured"] == pytest.approx(3 * 11 / m_summary["duration_s"])
    assert tput["predicted"] == pytest.approx(3 * 11 / p_summary["duration_s"])
    assert m_summary["duration_s"] > p_summary["duration_s"]
    assert "over each run's own duration" in render_fidelity_markdown(fid)
