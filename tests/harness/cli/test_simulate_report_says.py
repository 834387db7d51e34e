"""What a `batchlab simulate` run's manifest and report say about how it ran: its load (a
rate, a time scale, users), requests the trace loader changed, and that its figures are
predicted, including the ones computed from predicted latencies (goodput)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from harness.cli import main

EXCERPT = Path(__file__).resolve().parents[3] / "harness" / "data" / "azure_conv_excerpt.csv"


def _run(tmp_path: Path, name: str, *args: str) -> tuple[dict, str]:
    out = tmp_path / name
    assert main(["simulate", "--trace", str(EXCERPT), "--limit", "40", *args,
                 "--out", str(out)]) == 0
    return json.loads((out / "manifest.json").read_text()), (out / "report.md").read_text()


def _cells_row(report: str, name: str) -> str:
    return next(ln for ln in report.splitlines() if ln.startswith(f"| `{name}` |"))


def test_the_manifest_and_report_say_the_load_a_run_had(tmp_path: Path) -> None:
    manifest, report = _run(tmp_path, "rate", "--rate", "8")
    assert manifest["load"] == {
        "mode": "open", "arrivals": "the trace's requests at a mean rate of 8.0 req/s",
        "kind": "rate", "value": 8.0}
    assert manifest["trace"]["timing"] == {"kind": "rate", "value": 8.0}
    assert _cells_row(report, "rate").endswith("| 8 req/s |")
    # what loads the same requests again, wherever the command ran
    assert manifest["trace"]["options"] == {"limit": 40, "rate": 8.0}
    assert manifest["trace"]["path"] == str(EXCERPT.resolve())
    assert manifest["trace"]["file_sha256"] == hashlib.sha256(EXCERPT.read_bytes()).hexdigest()
    summary = json.loads((tmp_path / "rate" / "summary.json").read_text())
    assert (summary["status"], summary["num_planned"], summary["num_not_sent"]) == (
        "finished", 40, 0)

    manifest, report = _run(tmp_path, "slow", "--time-scale", "2")
    assert manifest["load"]["kind"] == "time_scale" and manifest["load"]["value"] == 2.0
    assert "time × 2 (rate × 0.5)" in _cells_row(report, "slow")

    manifest, report = _run(tmp_path, "users", "--mode", "closed", "--concurrency", "4",
                            "--think-time-s", "1")
    assert manifest["load"]["kind"] == "concurrency" and manifest["load"]["value"] == 4
    assert _cells_row(report, "users").endswith("| 4 users, 1 s think time |")

    manifest, report = _run(tmp_path, "own", "--slo", "ttft_s=1,tpot_s=0.1")
    assert manifest["load"] == {"mode": "open", "arrivals": "the trace's arrival times"}
    assert manifest["trace"]["timing"] is None
    assert "| load |" not in report  # the trace's own timing: no load column


def test_the_report_says_its_figures_are_predicted_and_which_requests_were_changed(
        tmp_path: Path) -> None:
    _, report = _run(tmp_path, "clip", "--max-model-len", "1024", "--on-too-long", "clip",
                     "--slo", "ttft_s=1,tpot_s=0.1")
    trace = next(ln for ln in report.splitlines() if ln.startswith("| Trace |"))
    assert ("clipped 8 requests to max_model_len 1024 (the prompt truncated from the left "
            "first)") in trace
    findings = report.split("## Key findings\n\n", 1)[1]
    assert findings.startswith("Every figure here is **predicted** by the reference engine, "
                               "not measured on hardware")
    goodput = report.split("## Goodput and SLO attainment", 1)[1].split("\n## ", 1)[0]
    assert ("Goodput and SLO attainment of every cell are predicted: they count the requests "
            "whose predicted TTFT and TPOT met the SLO") in goodput
    plots = report.split("## Plots", 1)[1]
    assert "Every figure here is **predicted**" in plots.split("![", 1)[0]


def test_the_findings_say_what_the_prefix_cache_skipped(tmp_path: Path) -> None:
    out = tmp_path / "cached"
    mooncake = EXCERPT.parent / "mooncake_conversation_excerpt.jsonl"
    assert main(["simulate", "--trace", str(mooncake), "--limit", "60", "--prefix-caching",
                 "--max-model-len", "32768", "--on-too-long", "clip", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())["prefix_cache"]
    assert summary["hits_tokens"] > 0
    findings = (out / "report.md").read_text().split("## Key findings", 1)[1].split("## ", 1)[0]
    assert (f"Prefill the prefix cache skipped: `cached` {summary['hits_tokens']:,} prompt "
            "tokens at admission") in findings


def test_a_plot_that_leaves_a_cell_out_says_why(tmp_path: Path) -> None:
    out = tmp_path / "cut"
    assert main(["simulate", "--trace", str(EXCERPT), "--limit", "40", "--no-report",
                 "--out", str(out)]) == 0
    requests = out / "requests.parquet"
    requests.write_bytes(requests.read_bytes()[:200])  # a truncated file
    assert main(["report", str(out)]) == 0
    plots = (out / "report.md").read_text().split("## Plots", 1)[1]
    assert ("`cut`'s lines in `engine_state.png` and `throughput.png` count time from its "
            "clock's start, not its first arrival: its `requests.parquet` is unreadable") in plots
    assert "`cut` is left out of `latency_cdf.png`: its `requests.parquet` is unreadable" \
        in plots


def test_a_closed_loop_needs_no_rate_and_says_it_ignores_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Users send as requests finish: --rate used to be demanded of a trace without
    timestamps, and silently ignored on one with them."""
    cap = capsys
    repo = Path(__file__).resolve().parents[3]
    closed = ["--mode", "closed", "--concurrency", "4", "--no-report"]
    assert main(["simulate", "--trace", str(repo / "harness/data/sharegpt_lengths_excerpt.csv"),
                 "--limit", "12", *closed, "--out", str(tmp_path / "lengths")]) == 0
    assert main(["simulate", "--trace", "synthetic", "--num-requests", "12", "--prompt-tokens",
                 "64", "--output-tokens", "8", *closed, "--out", str(tmp_path / "syn")]) == 0
    assert "note:" not in cap.readouterr().err
    assert main(["simulate", "--trace", str(repo / "harness/data/azure_conv_excerpt.csv"),
                 "--limit", "12", "--rate", "5", *closed, "--out", str(tmp_path / "rate")]) == 0
    assert ("note: --rate: no effect with --mode closed (each user sends its next request when "
            "its last one ends; arrival times are not used)") in cap.readouterr().err
    summary = json.loads((tmp_path / "syn" / "summary.json").read_text())
    assert summary["num_completed"] == 12
