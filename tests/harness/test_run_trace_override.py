"""``batchlab run FILE --trace PATH`` records ``--trace PATH`` in every command it writes down
(scenario.json, each cell's manifest, the report's "Reproduce" section): they used to give the
file alone, which runs the scenario on its own trace, another sweep."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_the_recorded_commands_give_the_trace_that_replaced_the_files(tmp_path: Path) -> None:
    trace = tmp_path / "other.csv"
    shutil.copy(REPO / "harness" / "data" / "azure_conv_excerpt.csv", trace)
    scenario = REPO / "tests" / "data" / "scenario_small.yaml"
    out = tmp_path / "out"
    assert main(["run", str(scenario), "--trace", str(trace), "--only", "static*",
                 "--out", str(out)]) == 0
    folder = next(p for p in out.iterdir() if p.is_dir())
    meta = json.loads((folder / "scenario.json").read_text())
    assert meta["command"][3:5] == ["--trace", str(trace)]
    cell = next(p for p in folder.iterdir() if p.is_dir())
    manifest = json.loads((cell / "manifest.json").read_text())
    assert ["--trace", str(trace)] == manifest["command"][3:5]
    assert f"--trace {trace}" in (folder / "report.md").read_text()


def test_a_relative_trace_is_recorded_so_that_it_runs_from_anywhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Typed relative to where the command ran, it was recorded as typed, next to a scenario
    path recorded from the repository: the command ran from neither folder."""
    shutil.copy(REPO / "harness" / "data" / "azure_conv_excerpt.csv", tmp_path / "other.csv")
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(REPO / "tests" / "data" / "scenario_small.yaml"), "--trace",
                 "other.csv", "--only", "static*", "--out", str(tmp_path / "out")]) == 0
    folder = next(p for p in (tmp_path / "out").iterdir() if p.is_dir())
    command = json.loads((folder / "scenario.json").read_text())["command"]
    assert command[2:5] == ["tests/data/scenario_small.yaml", "--trace",
                            str((tmp_path / "other.csv").resolve())]
