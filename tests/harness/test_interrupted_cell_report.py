"""A sweep's cell that measured part of its trace before it was interrupted (or its engine
exited) is shown with its figures, as having ended early, and never compared as a whole run.

It used to be dropped from the report: a sweep interrupted in its only cell reported "No cell
produced results" while that cell's summary of the requests it served was on disk.

A cell is run again by its sweep's --resume; a ``simulate`` or ``replay`` run interrupted has
no --resume, and is told the command its manifest recorded instead."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from harness.sim import run as sim_run

REPO = Path(__file__).resolve().parents[2]


def interrupt(cell: Path, *, state: str = "interrupted") -> None:
    """What the sweep leaves in a cell stopped part way: its status, manifest and summary
    say so (harness/scenario/runner.py)."""
    said = "interrupted while its results were written: some requests never sent"
    status = json.loads((cell / "status.json").read_text())
    (cell / "status.json").write_text(json.dumps({**status, "state": state, "reason": said}))
    manifest = json.loads((cell / "manifest.json").read_text())
    (cell / "manifest.json").write_text(json.dumps({**manifest, "status": state,
                                                    "error": said}))
    summary = json.loads((cell / "summary.json").read_text())
    (cell / "summary.json").write_text(json.dumps({**summary, "status": state}))


def test_an_interrupted_cell_is_shown_as_ended_early_and_not_compared(tmp_path: Path) -> None:
    scenario = REPO / "tests" / "data" / "scenario_small.yaml"
    assert main(["run", str(scenario), "--out", str(tmp_path)]) == 0
    folder = next(p for p in tmp_path.iterdir() if p.is_dir())
    cells = json.loads((folder / "scenario.json").read_text())["cells"]
    assert len(cells) >= 2
    interrupt(folder / cells[1])
    assert main(["report", str(folder)]) == 0
    text = (folder / "report.md").read_text()
    assert "No cell produced results" not in text
    assert f"`{cells[1]}` did not run to its end: interrupted while its results" in text
    assert "ended early: interrupted while its results were written" in text  # cells table
    assert "(--resume runs it again)" in text  # which it does
    findings = text.split("## Key findings", 1)[1].split("\n## ", 1)[0]
    compared = [line for line in findings.splitlines()
                if f"`{cells[1]}`" in line and f"`{cells[0]}`" in line]
    assert not compared, compared  # partial figures are never compared with a whole run's
    latency = text.split("## Latency", 1)[1].split("\n## ", 1)[0]
    assert f"`{cells[1]}`" in latency  # its figures are shown


def test_a_sweep_interrupted_in_its_only_cell_shows_what_it_measured(tmp_path: Path) -> None:
    scenario = REPO / "tests" / "data" / "scenario_small.yaml"
    assert main(["run", str(scenario), "--out", str(tmp_path)]) == 0
    folder = next(p for p in tmp_path.iterdir() if p.is_dir())
    cells = json.loads((folder / "scenario.json").read_text())["cells"]
    for name in cells[1:]:
        shutil.rmtree(folder / name)
    interrupt(folder / cells[0])
    assert main(["report", str(folder)]) == 0
    text = (folder / "report.md").read_text()
    assert "No cell produced results" not in text
    assert f"`{cells[0]}` did not run to its end" in text


def test_an_interrupted_baseline_is_no_baseline(tmp_path: Path) -> None:
    """The baseline cell interrupted: every other cell's delta was against its partial
    figures, and it was said to have "no results"."""
    scenario = REPO / "tests" / "data" / "scenario_small.yaml"
    assert main(["run", str(scenario), "--out", str(tmp_path)]) == 0
    folder = next(p for p in tmp_path.iterdir() if p.is_dir())
    cells = json.loads((folder / "scenario.json").read_text())["cells"]
    interrupt(folder / cells[0])
    assert main(["report", str(folder)]) == 0
    text = (folder / "report.md").read_text()
    assert (f"| Baseline | `{cells[1]}` (requested `{cells[0]}`: ended early) |"
            in text)
    assert (f"The requested baseline `{cells[0]}` ended early: nothing is compared with its "
            f"partial figures; `{cells[1]}` is used instead.") in text
    latency = text.split("### TTFT", 1)[1].split("\n### ", 1)[0]
    row = next(line for line in latency.splitlines() if line.startswith(f"| `{cells[0]}`"))
    assert "(" not in row  # no delta: compared with nothing


def test_an_interrupted_simulate_run_is_told_its_command_not_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``report`` and ``compare`` said "--resume runs it again" of any interrupted folder;
    ``simulate`` and ``replay`` have no --resume."""
    trace = str(REPO / "harness" / "data" / "azure_conv_excerpt.csv")
    done, cut = tmp_path / "done", tmp_path / "cut"
    assert main(["simulate", "--trace", trace, "--limit", "20", "--no-report", "--out",
                 str(done)]) == 0

    def interrupt_summary(*_args: Any, **_kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sim_run, "summarize", interrupt_summary)  # before summary.json
    argv = ["simulate", "--trace", trace, "--limit", "20", "--no-report", "--out", str(cut)]
    monkeypatch.setattr(sys, "argv", ["batchlab", *argv])  # the manifest's command
    assert main(argv) == 130
    monkeypatch.undo()
    assert json.loads((cut / "manifest.json").read_text())["status"] == "interrupted"
    again = "(the `batchlab simulate` command its manifest.json records runs it again)"
    out = tmp_path / "cmp" / "report.md"
    assert main(["report", str(done), str(cut), "-o", str(out)]) == 0
    text = out.read_text()
    assert "--resume" not in text
    assert "`cut` did not finish: interrupted while its results were written" in text
    assert again in text
    assert shlex.join(["batchlab", *argv]) in text  # under Reproduce
    capsys.readouterr()
    assert main(["compare", str(done), str(cut)]) == 0
    said = capsys.readouterr().out
    assert "--resume" not in said and again in said
    # a manifest without the command: the command that made it, by name
    manifest = json.loads((cut / "manifest.json").read_text())
    (cut / "manifest.json").write_text(json.dumps({**manifest, "command": None}))
    assert main(["compare", str(done), str(cut)]) == 0
    said = capsys.readouterr().out
    assert "--resume" not in said
    assert "(the `batchlab simulate` command that made it runs it again)" in said
