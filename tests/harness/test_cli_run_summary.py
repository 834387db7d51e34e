"""`batchlab run` prints each cell's answer before the report's path: a terminal or a nightly
job's log used to show nothing but that path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_run_prints_each_cells_figures_and_that_they_are_predicted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(REPO / "scenarios" / "quickstart.yaml"), "--out",
                 str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["cell", "state", "output", "tok/s", "TTFT", "p90", "TPOT",
                                "p90", "SLO", "met", "kept", "pace"]
    rows = {line.split()[0]: line for line in lines[1:4]}
    assert set(rows) == {"static", "continuous", "continuous-chunked"}
    for name, line in rows.items():  # the figures are those of the cell's summary.json
        summary = json.loads((tmp_path / "quickstart" / name / "summary.json").read_text())
        tok_s = summary["throughput"]["output_tokens_per_s"]
        assert f" {tok_s:,.0f} " in line, line
    assert rows["static"].endswith("fell behind")  # static batching cannot keep up here
    assert rows["continuous"].endswith("yes")
    assert lines[4].startswith("predicted: every cell (by the reference engine")
    assert lines[-1] == f"report: {tmp_path / 'quickstart' / 'report.md'}"


def test_a_cell_that_did_not_run_is_a_row_without_figures(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(REPO / "scenarios" / "quickstart.yaml"), "--out", str(tmp_path),
                 "--only", "static"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:4]}
    assert rows["continuous"] == ["not", "run"] and rows["continuous-chunked"] == ["not", "run"]
    assert lines[4].startswith("predicted: static (by the reference engine")


def test_simulates_first_line_says_its_figures_are_predicted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`batchlab simulate | head -1` showed figures with nothing to say they are predictions
    (the line saying so came two lines later)."""
    assert main(["simulate", "--trace", str(REPO / "harness" / "data" / "azure_conv_excerpt.csv"),
                 "--limit", "20", "--no-report", "--out", str(tmp_path / "sim")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("predicted: 20/20 requests completed in ")


def test_capacitys_table_names_its_unit_and_its_help_the_exit_statuses(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["capacity", "--help"])
    assert "exit status: 0 when every setting's search ran to an answer" in \
        capsys.readouterr().out
    assert main(["capacity", "--trace", str(REPO / "harness" / "data" / "azure_conv_excerpt.csv"),
                 "--limit", "100", "--max-probes", "2", "--slo", "ttft_s=1",
                 "--out", str(tmp_path / "cap")]) == 0
    out = capsys.readouterr().out
    [head] = [line for line in out.splitlines() if line.startswith("setting ")]
    assert head.split() == ["setting", "capacity", "(req/s)", "bracket", "(pass", "..",
                            "fail)", "probes", "status"]
