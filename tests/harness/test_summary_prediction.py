"""summary.json says when its figures are predictions: a job that reads only the summary can
tell a simulation, or the reference engine served over HTTP, from a measured engine."""

from __future__ import annotations

import json
from pathlib import Path

from harness.cli import main as cli_main
from harness.live.rundir import with_engine_counters
from harness.prediction import summary_prediction

EXCERPT = Path(__file__).resolve().parents[2] / "harness" / "data" / "azure_conv_excerpt.csv"


def test_a_simulated_run_says_its_summary_is_predicted(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    assert cli_main(["simulate", "--trace", str(EXCERPT), "--limit", "20", "--model",
                     "llama-3.1-8b", "--gpu", "h100-pcie", "--no-report",
                     "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    prediction = summary["prediction"]
    assert prediction["served"] is False
    assert prediction["record"] == manifest["engine"]["prediction"]
    assert prediction["text"].startswith("predicted by the reference engine with the catalog's")
    # no published figure is of an H100 PCIe: the summary says its error was never measured
    assert "GPU h100-pcie" in prediction["record"]["coverage_note"]
    assert prediction["record"]["coverage_note"] in prediction["text"]


def _live_folder(folder: Path, engine: dict) -> Path:
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"kind": "live", "engine": engine}))
    return folder


def test_a_served_reference_replay_says_so_and_a_measured_engine_does_not(
        tmp_path: Path) -> None:
    record = {"kind": "profile", "profile": "vllm-h100-sxm", "accuracy": None}
    served = _live_folder(tmp_path / "served", {
        "name": "openai", "version_probe": {"body": {"prediction": record}}})
    summary = with_engine_counters({}, served)
    assert summary["prediction"]["served"] is True
    assert summary["prediction"]["record"] == record
    assert "served over HTTP" in summary["prediction"]["text"]
    measured = _live_folder(tmp_path / "measured", {
        "name": "vllm", "version_probe": {"body": {"version": "0.11.0"}}})
    assert "prediction" not in with_engine_counters({}, measured)
    assert summary_prediction(None) is None

