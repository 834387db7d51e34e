"""A sweep's cell that measured part of its trace before it was interrupted (or its engine
exited) is shown with its figures, as having ended early, and never compared as a whole run.

It used to be dropped from the report: a sweep interrupted in its only cell reported "No cell
produced results" while that cell's summary of the requests it served was on disk."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from harness.cli import main

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
