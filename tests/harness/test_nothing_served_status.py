"""A run that sent requests and served none is a failure in its own files too: a job that
reads only summary.json or manifest.json must not take it for a finished run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main as cli_main

EXCERPT = Path(__file__).resolve().parents[2] / "harness" / "data" / "azure_conv_excerpt.csv"


def test_a_simulation_that_served_nothing_says_failed_in_its_summary_and_manifest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every request rejected (no prompt fits the KV cache): exit 1, and the run folder says
    failed with the reason, as a replay that reached no server does."""
    out = tmp_path / "none"
    assert cli_main(["simulate", "--trace", str(EXCERPT), "--limit", "5", "--model",
                     "llama-3.1-8b", "--gpu", "h100-sxm", "--num-gpu-blocks", "2",
                     "--no-report", "--out", str(out)]) == 1
    summary = json.loads((out / "summary.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    assert summary["status"] == manifest["status"] == "failed"
    assert manifest["error"].startswith("none of the 5 requests completed (rejected 5)")
    assert manifest["error"] in capsys.readouterr().err


SCENARIO = f"""\
name: failcell
question: a cell that cannot serve
trace: {{path: {EXCERPT}, limit: 5}}
model: llama-3.1-8b
gpu: h100-sxm
engines:
  - {{name: tiny, engine: reference, num_gpu_blocks: 2}}
"""


def test_a_scenario_cell_that_served_nothing_says_failed_in_its_summary_and_manifest(
        tmp_path: Path) -> None:
    """Its status.json said failed, its summary.json and manifest.json "finished"."""
    path = tmp_path / "fail.yaml"
    path.write_text(SCENARIO)
    assert cli_main(["run", str(path), "--out", str(tmp_path / "out")]) == 1
    cell = tmp_path / "out" / "failcell" / "tiny"
    assert json.loads((cell / "status.json").read_text())["state"] == "failed"
    summary = json.loads((cell / "summary.json").read_text())
    manifest = json.loads((cell / "manifest.json").read_text())
    assert summary["status"] == manifest["status"] == "failed"
    assert manifest["error"].startswith("none of the 5 requests completed (rejected 5)")


def test_a_capacity_probe_that_served_nothing_says_failed_in_its_summary_and_manifest(
        tmp_path: Path) -> None:
    path = tmp_path / "fail.yaml"
    path.write_text(SCENARIO)
    assert cli_main(["capacity", str(path), "--slo", "ttft_s=2",
                     "--out", str(tmp_path / "cap")]) != 0
    probes = [p.parent for p in (tmp_path / "cap").rglob("summary.json")]
    assert probes
    for probe in probes:
        summary = json.loads((probe / "summary.json").read_text())
        manifest = json.loads((probe / "manifest.json").read_text())
        assert summary["status"] == manifest["status"] == "failed", probe
        assert manifest["error"].startswith("none of the 5 requests completed"), probe
