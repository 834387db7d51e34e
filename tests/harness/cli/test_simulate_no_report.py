"""`batchlab simulate --no-report`: every result file, no report and no report process; the
report written later from the folder is the one the run would have written."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main
from harness.sim import report_process

EXCERPT = Path(__file__).resolve().parents[3] / "harness" / "data" / "azure_conv_excerpt.csv"
RESULTS = {"manifest.json", "summary.json", "requests.parquet", "chunks.parquet",
           "steps.parquet"}


def test_no_report_writes_every_result_and_no_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    started = []
    monkeypatch.setattr(report_process.ReportProcess, "start",
                        classmethod(lambda cls: started.append(cls) or None))
    args = ["simulate", "--trace", str(EXCERPT), "--limit", "30"]
    assert main([*args, "--no-report", "--out", str(tmp_path / "bare")]) == 0
    assert not started  # no child process was started for a report
    assert {p.name for p in (tmp_path / "bare").iterdir()} == RESULTS
    out = capsys.readouterr().out
    assert f"no report: `batchlab report {tmp_path / 'bare'}` writes it" in out

    # Written later, it is the report the run would have written (minus the folder's name).
    assert main(["report", str(tmp_path / "bare")]) == 0
    monkeypatch.undo()
    assert main([*args, "--out", str(tmp_path / "run-at-once")]) == 0
    later = (tmp_path / "bare" / "report.md").read_text()
    at_once = (tmp_path / "run-at-once" / "report.md").read_text()
    assert _same_run(later, "bare") == _same_run(at_once, "run-at-once")


def _same_run(text: str, name: str) -> list[str]:
    """The report with its folder's name replaced, without the lines quoting the command."""
    return [line.replace(name, "RUN") for line in text.splitlines()
            if "batchlab simulate" not in line]


def test_simulate_says_which_requests_failed_and_why(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # TensorRT-LLM's profile prefills whole and rejects prompts over its step budget: the
    # command line must say so, not only that fewer requests completed
    mooncake = EXCERPT.with_name("mooncake_conversation_excerpt.jsonl")
    assert main(["simulate", "--trace", str(mooncake), "--limit", "12", "--on-too-long", "clip",
                 "--profile", "trtllm-h100-sxm", "--no-report",
                 "--out", str(tmp_path / "trt")]) == 0
    lines = capsys.readouterr().out.splitlines()
    failures = [line for line in lines if line.startswith("failures: rejected ")]
    assert len(failures) == 1 and int(failures[0].split()[-1]) > 0
    first = next(line for line in lines if line.startswith("first error: request "))
    assert "rejected: prompt (" in first and "exceed max_num_batched_tokens (8192)" in first
    assert main(["simulate", "--trace", str(EXCERPT), "--limit", "12", "--no-report",
                 "--out", str(tmp_path / "ok")]) == 0
    assert not any(line.startswith(("failures:", "first error:"))
                   for line in capsys.readouterr().out.splitlines())
