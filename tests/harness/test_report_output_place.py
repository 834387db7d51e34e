"""``batchlab report ... -o FILE`` never writes into a run's folder: the report's figures
(latency_cdf.png, engine_state.png, throughput.png) would replace the run's own, and a later
run into that folder would refuse it as holding files batchlab did not write. Nor into a
scenario's or a capacity search's folder, whose report.md and figures `batchlab run` or
`batchlab capacity` wrote. A scenario folder's own report.md and a run folder's own report.md
are still written where they belong."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from harness import scenario as sc
from harness.cli import main

REPO = Path(__file__).resolve().parents[2]
TRACE = str(REPO / "harness" / "data" / "azure_conv_excerpt.csv")
FIGURES = ("latency_cdf.png", "engine_state.png", "throughput.png")
SCENARIO = """\
name: place
question: Where does the report go?
trace: {path: azure_conv_excerpt.csv, limit: 10}
model: llama-3.1-8b
gpu: h100-sxm
engines:
  - {name: fcfs, engine: reference}
"""


def simulate(out: Path, *extra: str) -> Path:
    assert main(["simulate", "--trace", TRACE, "--limit", "40", "--no-report", "--out",
                 str(out), *extra]) == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("runs")
    return simulate(root / "a"), simulate(root / "b", "--max-num-seqs", "4")


def refused(capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and err.count("\n") == 0, err
    for needle in needles:
        assert needle in err, err
    return err


def test_a_report_inside_a_compared_run_folder_is_refused(
        runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = (shutil.copytree(r, tmp_path / r.name) for r in runs)
    before = sorted(p.name for p in a.iterdir())
    capsys.readouterr()
    assert main(["report", str(a), str(b), "-o", str(a / "compare.md")]) == 2
    refused(capsys, f"-o {a / 'compare.md'}: {a} is a run folder this report compares "
            "(its manifest.json)", "the report's figures (latency_cdf.png, engine_state.png, "
            "throughput.png) would replace that run's own",
            "write the report to a folder of its own")
    assert main(["report", str(a), str(b), "-o", str(b / "compare.md")]) == 2
    refused(capsys, f"{b} is a run folder this report compares")
    # under it, too: nothing is made there
    assert main(["report", str(a), str(b), "-o", str(a / "cmp" / "compare.md")]) == 2
    refused(capsys, f"{a / 'cmp'} is inside", "a run folder this report compares",
            "files batchlab did not write")
    assert sorted(p.name for p in a.iterdir()) == before
    assert not any((a / f).exists() for f in FIGURES)
    # so a later run into the folder still takes it
    assert main(["simulate", "--trace", TRACE, "--limit", "20", "--no-report", "--out", str(a),
                 "--overwrite"]) == 0


def test_a_report_in_a_folder_of_its_own_is_written(
        runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = runs
    out = tmp_path / "cmp" / "compare.md"
    assert main(["report", str(a), str(b), "-o", str(out)]) == 0
    assert out.exists() and all((out.parent / f).exists() for f in FIGURES)
    assert not (a / "compare.md").exists() and not any((a / f).exists() for f in FIGURES)


def test_another_run_folder_and_a_summary_only_folder_are_refused(
        runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = runs
    other = simulate(tmp_path / "other")
    capsys.readouterr()
    assert main(["report", str(a), str(b), "-o", str(other / "cmp.md")]) == 2
    refused(capsys, f"{other} is another run's folder (its manifest.json)")
    summary_only = tmp_path / "summary-only"
    summary_only.mkdir()
    shutil.copy(a / "summary.json", summary_only / "summary.json")
    assert main(["report", str(a), str(b), "-o", str(summary_only / "cmp.md")]) == 2
    refused(capsys, "another run's folder (its summary.json)")
    assert sorted(p.name for p in summary_only.iterdir()) == ["summary.json"]


def test_a_run_folders_own_report_is_still_written(
        runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = shutil.copytree(runs[0], tmp_path / "a")
    assert main(["report", str(a)]) == 0
    first = (a / "report.md").read_text()
    assert first.startswith("# Run a\n")
    (a / "report.md").unlink()
    assert main(["report", str(a), "-o", str(a / "report.md")]) == 0  # the same report
    assert (a / "report.md").read_text() == first
    assert f"report: {a / 'report.md'}" in capsys.readouterr().out
    # any other file in it is refused
    assert main(["report", str(a), "-o", str(a / "other.md")]) == 2
    refused(capsys, f"{a} is a run folder this report compares")


def sweep(root: Path) -> Path:
    """The folder of scenario ``place``, run into ``root/out``, without its report."""
    path = root / "place.yaml"
    path.write_text(SCENARIO)
    result = sc.run_scenario(sc.load_scenario(path), root / "out", write_report=False,
                             progress=sc.SweepProgress(1, stream=io.StringIO(), tty=False))
    assert [o.state for o in result.outcomes] == ["done"]
    return root / "out" / "place"


def test_a_scenario_folders_own_report_is_still_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = sweep(tmp_path)
    assert main(["report", str(folder)]) == 0
    assert (folder / "report.md").read_text().startswith("# Scenario place\n")
    assert main(["report", str(folder), "-o", str(folder / "report.md")]) == 0
    assert main(["report", str(folder), "-o", str(folder / "again.md")]) == 0
    assert (folder / "again.md").exists()
    # a cell of it is a run folder
    capsys.readouterr()
    assert main(["report", str(folder), "-o", str(folder / "fcfs" / "cmp.md")]) == 2
    refused(capsys, f"{folder / 'fcfs'} is another run's folder (its manifest.json)")


def test_a_comparison_into_a_scenario_or_capacity_folder_is_refused(
        runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It replaced the report.md and figures `batchlab run` (or `batchlab capacity`) wrote
    there: only a run's own folder was refused."""
    a, b = runs
    folder = sweep(tmp_path)
    assert main(["report", str(folder)]) == 0
    capacity = shutil.copytree(folder, tmp_path / "capacity")  # a search's folder, as written
    (capacity / "capacity.json").write_text('{"settings": []}')
    for place, by in ((folder, "scenario place (scenario.json)"),
                      (capacity, "a capacity search (capacity.json)")):
        before = {p.name: p.read_bytes() for p in place.iterdir() if p.is_file()}
        assert "report.md" in before and all(f in before for f in FIGURES)
        capsys.readouterr()
        for name in ("report.md", "compare.md"):
            assert main(["report", str(a), str(b), "-o", str(place / name)]) == 2
            refused(capsys, f"-o {place / name}: {place} is the folder of {by}",
                    "its report.md and figures are written by `batchlab "
                    + ("run`" if place == folder else "capacity`"), "choose another -o")
        # nor as the report of another such folder
        other = capacity if place == folder else folder
        assert main(["report", str(other), "-o", str(place / "report.md")]) == 2
        refused(capsys, f"{place} is the folder of {by}")
        assert {p.name: p.read_bytes() for p in place.iterdir() if p.is_file()} == before
    # a folder of its own in one is the report's, and its own report.md is still its own
    assert main(["report", str(a), str(b), "-o", str(folder / "cmp" / "report.md")]) == 0
    assert main(["report", str(folder), "-o", str(folder / "report.md")]) == 0


def test_a_comparison_into_a_cell_or_a_settings_search_is_refused(
        runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A cell not run yet (its cell.json only) and one setting's search (search.json): the
    sweep or search that runs them again refuses files batchlab did not write there."""
    a, b = runs
    cell, search = tmp_path / "cell", tmp_path / "search"
    for place, marker in ((cell, "cell.json"), (search, "search.json")):
        place.mkdir()
        (place / marker).write_text("{}")
        capsys.readouterr()
        assert main(["report", str(a), str(b), "-o", str(place / "sub" / "cmp.md")]) == 2
        refused(capsys, f"{place / 'sub'} is inside {place}, ", f"({marker})",
                "files batchlab did not write")
        assert sorted(p.name for p in place.iterdir()) == [marker]
