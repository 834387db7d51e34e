"""A run whose requests.parquet cannot be read has no pace check: its report says that whether
it fell behind its arrivals is not known, where the key finding used to go missing without a
word (as if it had kept pace)."""

from __future__ import annotations

import shutil
from pathlib import Path

from harness.cli import main
from harness.report import render_run_report
from harness.report.runs import load_run

EXCERPT = Path(__file__).resolve().parents[2] / "harness" / "data" / "azure_conv_excerpt.csv"
BEHIND = "fell behind its arrivals"
UNKNOWN = "kept pace with its arrivals (or fell behind them, its queue growing for the " \
          "whole run) could not be checked: its `requests.parquet` cannot be read ("


def findings(report: Path) -> str:
    return report.read_text().split("## Key findings")[1].split("\n## ")[0]


def test_an_unreadable_requests_file_says_the_pace_was_not_checked(tmp_path: Path) -> None:
    over = tmp_path / "over"  # 8 sequences at 10 req/s: behind
    assert main(["simulate", "--trace", str(EXCERPT), "--limit", "100", "--model",
                 "llama-3.1-8b", "--gpu", "h100-sxm", "--max-num-seqs", "8", "--rate", "10",
                 "--no-report", "--out", str(over)]) == 0
    render_run_report(over)
    assert f"The engine {BEHIND}" in findings(over / "report.md")
    assert load_run(over).pace_unread is None
    damaged = shutil.copytree(over, tmp_path / "damaged", ignore=shutil.ignore_patterns("*.md"))
    (damaged / "requests.parquet").write_bytes((over / "requests.parquet").read_bytes()[:200])
    assert load_run(damaged).pace is None
    render_run_report(damaged)
    said = findings(damaged / "report.md")
    assert BEHIND not in said
    assert f"- Whether the engine {UNKNOWN}" in said
    # beside another run, the cell is named
    out = tmp_path / "cmp" / "report.md"
    assert main(["report", str(over), str(damaged), "-o", str(out)]) == 0
    assert f"- Whether `damaged` {UNKNOWN}" in findings(out)


def test_a_closed_loop_has_no_pace_check_to_miss(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    assert main(["simulate", "--trace", str(EXCERPT), "--limit", "20", "--mode", "closed",
                 "--concurrency", "4", "--no-report", "--out", str(closed)]) == 0
    (closed / "requests.parquet").write_bytes(b"not parquet")
    assert load_run(closed).pace_unread is None
