"""`batchlab simulate` cut short after the simulation: what the folder and the command say.

A run interrupted while its results are written keeps, in its manifest, what ran (engine and
its prediction record, profile, model, GPU, knobs, trace), so that reading it later still
says its figures are predicted. A report renderer that dies leaves complete results, a
one-line error that says so, and exit status 1, not a traceback."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from harness.sim import report_process
from harness.sim import run as sim_run

EXCERPT = Path(__file__).resolve().parents[3] / "harness" / "data" / "azure_conv_excerpt.csv"
ARGS = ["simulate", "--trace", str(EXCERPT), "--limit", "20", "--profile", "vllm-h100-sxm"]


def test_interrupted_while_results_are_written_the_manifest_says_what_ran(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def cut(*_args: Any, **_kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sim_run, "summarize", cut)  # after the tables, before summary.json
    out = tmp_path / "run"
    assert main([*ARGS, "--no-report", "--out", str(out)]) == 128 + signal.SIGINT
    assert "interrupted while the results were written" in capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    assert "interrupted while its results were written" in manifest["error"]
    engine = manifest["engine"]
    assert engine["mode"] == "simulated" and engine["prediction"]["profile"] == "vllm-h100-sxm"
    assert engine["num_kv_blocks_total"] == engine["config"]["num_gpu_blocks"] > 0
    assert (manifest["model"], manifest["gpu"]) == ("llama-3.1-8b", "h100-sxm")
    assert manifest["knobs"]["max_num_seqs"] > 0
    assert manifest["trace"]["num_requests"] == 20
    assert not (out / "summary.json").exists()


def test_a_finished_run_keeps_the_manifest_it_started_with(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main([*ARGS, "--no-report", "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "finished" and "error" not in manifest
    assert manifest["engine"]["num_kv_blocks_total"] == manifest["engine"]["config"][
        "num_gpu_blocks"]


def test_a_report_renderer_killed_leaves_results_and_a_one_line_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    start = report_process.ReportProcess.start.__func__  # type: ignore[attr-defined]

    def start_then_kill(cls: type[report_process.ReportProcess]
                        ) -> report_process.ReportProcess | None:
        reporter = start(cls)
        assert reporter is not None
        os.kill(reporter.pid, signal.SIGKILL)  # as the kernel's OOM killer would
        return reporter

    monkeypatch.setattr(report_process.ReportProcess, "start", classmethod(start_then_kill))
    out = tmp_path / "run"
    assert main([*ARGS, "--out", str(out)]) == 1
    said = capsys.readouterr()
    assert "Traceback" not in said.err
    errors = [line for line in said.err.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: report.md was not written: the report renderer exited with "
                      f"status -{int(signal.SIGKILL)} without an answer; the results are "
                      f"complete: `batchlab report {out}` writes it"]
    assert f"no report: `batchlab report {out}` writes it" in said.out
    assert "output tok/s" in said.out  # the headline of the complete results
    assert json.loads((out / "summary.json").read_text())["num_completed"] == 20
    assert json.loads((out / "manifest.json").read_text())["status"] == "finished"
    assert not (out / "report.md").exists()
    assert main(["report", str(out)]) == 0 and (out / "report.md").exists()
