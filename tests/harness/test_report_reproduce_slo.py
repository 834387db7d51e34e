"""A run folder summarised again under another SLO (`batchlab summarize DIR --slo ...`): its
report's goodput is under the new SLO, so the commands that reproduce the report end with
that summarize step, and say what SLO the run itself was given."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from harness.cli import main as cli_main
from harness.live.testing import server_in_thread
from harness.report.format import display_path

SMALL_TRACE = ["--trace", "synthetic", "--num-requests", "6", "--rate", "20",
               "--prompt-tokens", "16", "--output-tokens", "4"]
MODEL = ["--model", "llama-3.1-8b", "--gpu", "h100-sxm"]


def _batchlab(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    """``batchlab ARGS`` in this process, its command line recorded as typed."""
    monkeypatch.setattr(sys, "argv", ["batchlab", *args])
    return cli_main(list(args))


def _reproduce(report: Path) -> str:
    return report.read_text().split("## Reproduce\n", 1)[1]


def _commands(reproduce: str) -> list[str]:
    """The shell lines of the first code block of the reproduce section."""
    return [line for line in reproduce.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
            if line and not line.startswith("#")]


def test_a_live_run_summarised_under_another_slo_says_so_where_it_is_reproduced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue case: the report's SLO row and goodput were under TTFT ≤ 1 s, TPOT ≤ 100 ms, and
    "Run it again" gave only the replay, with --slo ttft_s=0.5,tpot_s=0.05."""
    run = tmp_path / "live"
    with server_in_thread(ttft_s=0.01, itl_s=0.01) as server:
        assert _batchlab(monkeypatch, "replay", "--target", server.url, *SMALL_TRACE,
                         "--slo", "ttft_s=0.5,tpot_s=0.05", "--out", str(run)) == 0
    assert _batchlab(monkeypatch, "report", str(run)) == 0
    report = run / "report.md"
    assert "batchlab summarize" not in _reproduce(report)  # as the run gave it: nothing to add
    assert _batchlab(monkeypatch, "summarize", str(run), "--slo", "ttft_s=1,tpot_s=0.1") == 0
    assert _batchlab(monkeypatch, "report", str(run)) == 0
    text = report.read_text()
    assert "| SLO | TTFT ≤ 1 s, TPOT ≤ 100 ms |" in text
    commands = _commands(_reproduce(report))
    assert len(commands) == 2 and "--slo ttft_s=0.5,tpot_s=0.05" in commands[0]
    assert shlex.split(commands[1]) == ["batchlab", "summarize", display_path(str(run)),
                                        "--slo", "ttft_s=1,tpot_s=0.1"]
    assert ("Goodput and SLO attainment were summarised again since the run, under another "
            "SLO than the run was given, by `batchlab summarize DIR --slo ...` (in the "
            "commands above): `live` under TTFT ≤ 1 s, TPOT ≤ 100 ms.") in _reproduce(report)
    # summarised again under the run's own SLO: the replay alone reproduces it
    assert _batchlab(monkeypatch, "summarize", str(run), "--slo", "ttft_s=0.5,tpot_s=0.05") == 0
    assert "batchlab summarize" not in _reproduce(report)


def test_a_simulated_run_given_an_slo_afterwards_is_reproduced_with_the_summarize_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A simulated run given no SLO, summarised with one: its report (re-rendered by
    summarize) reproduces that goodput; the step's --slo reads back as the same SLO."""
    run = tmp_path / "sim"
    assert _batchlab(monkeypatch, "simulate", *SMALL_TRACE, *MODEL, "--out", str(run)) == 0
    assert _batchlab(monkeypatch, "summarize", str(run), "--slo", "ttft_s=0.25,e2e_s=3") == 0
    reproduce = _reproduce(run / "report.md")
    assert _commands(reproduce)[0].startswith("batchlab simulate ")
    assert _commands(reproduce)[1] == (f"batchlab summarize {display_path(str(run))} "
                                       "--slo ttft_s=0.25,e2e_s=3")
    assert "`sim` under TTFT ≤ 250 ms, E2E ≤ 3 s (its run was given none)" in reproduce


def test_compared_run_folders_each_end_with_their_own_summarize_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`batchlab report A B`: each cell's command is listed; only the one summarised again
    under another SLO is followed by its summarize step."""
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        assert _batchlab(monkeypatch, "simulate", *SMALL_TRACE, *MODEL, "--slo", "tpot_s=0.05",
                         "--out", str(run), "--no-report") == 0
    assert _batchlab(monkeypatch, "summarize", str(runs[1]), "--slo", "tpot_s=0.02") == 0
    out = tmp_path / "comparison" / "report.md"
    assert _batchlab(monkeypatch, "report", *map(str, runs), "-o", str(out)) == 0
    block = _reproduce(out).split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    assert block[0] == "# a" and block[1].startswith("batchlab simulate ")
    assert block[2] == "# b" and block[3].startswith("batchlab simulate ")
    assert block[4] == f"batchlab summarize {display_path(str(runs[1]))} --slo tpot_s=0.02"
    assert len(block) == 5
    assert "(in the commands above): `b` under TPOT ≤ 20 ms." in _reproduce(out)


def test_a_summarize_stopped_before_it_draws_the_report_leaves_no_report_of_the_old_slo(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue case: `batchlab summarize DIR --slo ...` killed (Ctrl-C, a closed pipe) once the
    new summary.json was written, before report.md was drawn again from it, left report.md
    quoting the old SLO's goodput beside a summary under the new one, and nothing said so.
    The report now says it is out of date until it is drawn again; summarize run again (or
    `batchlab report DIR`) draws it."""
    run = tmp_path / "sim"
    assert _batchlab(monkeypatch, "simulate", *SMALL_TRACE, *MODEL, "--slo",
                     "ttft_s=0.5,tpot_s=0.05", "--out", str(run)) == 0
    report = run / "report.md"
    assert "| SLO | TTFT ≤ 500 ms, TPOT ≤ 50 ms |" in report.read_text()

    def interrupted(*_args: object) -> None:  # Ctrl-C once the new summary is on disk
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr("harness.cli.live.print_live_headline", interrupted)
        assert _batchlab(monkeypatch, "summarize", str(run), "--slo", "ttft_s=1,tpot_s=0.1") == 130
    assert json.loads((run / "summary.json").read_text())["slo"]["ttft_s"] == 1.0
    stale = report.read_text()
    assert "500 ms" not in stale and "## Key findings" not in stale  # no figure of either
    assert "This report is out of date: `batchlab summarize` was rewriting the summary.json" \
        in stale
    assert f"`batchlab report {display_path(str(run))}` draws it again" in stale
    assert _batchlab(monkeypatch, "summarize", str(run), "--slo", "ttft_s=1,tpot_s=0.1") == 0
    assert "| SLO | TTFT ≤ 1 s, TPOT ≤ 100 ms |" in report.read_text()
