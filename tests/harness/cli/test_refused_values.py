"""Values a command cannot use are refused by name, in one line, before anything runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.cli import main

REPO = Path(__file__).resolve().parents[3]
EXCERPT = REPO / "harness" / "data" / "azure_conv_excerpt.csv"


def test_a_port_out_of_range_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "reference", "--port", "99999"]) == 2
    assert "--port: expected a port from 0 to 65535, got 99999" in capsys.readouterr().err


def test_a_baseline_that_names_no_cell_of_a_scenario_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(REPO / "tests" / "data" / "scenario_small.yaml"), "--only",
                 "static*", "--out", str(tmp_path)]) == 0
    assert main(["report", str(tmp_path / "small"), "--baseline", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "--baseline 'nosuch': no such cell; cells: static__max_num_seqs-4" in err


def test_a_damaged_summary_is_said_to_be_unreadable_not_a_run_never_made(
        tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main(["simulate", "--trace", str(EXCERPT), "--limit", "5", "--no-report",
                 "--out", str(run)]) == 0
    (run / "summary.json").write_text('{"broken')
    assert main(["report", str(run)]) == 0
    text = (run / "report.md").read_text()
    finding = next(ln for ln in text.splitlines() if ln.startswith("- `run` did not finish"))
    assert "summary.json cannot be read as a summary; `batchlab summarize" in finding
    assert "not run" not in text
    assert main(["summarize", str(run)]) == 0  # as it says
    shutil.rmtree(run)


def test_a_server_whose_cache_cannot_hold_its_max_model_len_does_not_start(
        capsys: pytest.CaptureFixture[str]) -> None:
    """As vLLM refuses to start: it would advertise a length no request could run at."""
    assert main(["serve", "reference", "--port", "0", "--num-gpu-blocks", "100"]) == 2
    assert ("the model's max_model_len (131072) is larger than the KV cache holds (1600 tokens)"
            in capsys.readouterr().err)


def test_a_misspelt_gpu_or_policy_gets_the_close_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--gpu", "h200x", "--trace", str(EXCERPT), "--limit", "3",
                 "--out", str(tmp_path / "run")]) == 2
    assert "unknown GPU 'h200x' (did you mean 'h200'?)" in capsys.readouterr().err
    # a family name: every GPU of it, not the other GPU one letter away
    assert main(["simulate", "--gpu", "h100", "--trace", str(EXCERPT), "--limit", "3",
                 "--out", str(tmp_path / "run")]) == 2
    assert "unknown GPU 'h100' (did you mean 'h100-pcie' or 'h100-sxm'?)" in \
        capsys.readouterr().err
    scenario = tmp_path / "s.yaml"
    scenario.write_text((REPO / "tests" / "data" / "scenario_small.yaml").read_text()
                        .replace("policy: fcfs,", "policy: fcsf,")
                        .replace("path: azure_conv_excerpt.csv", f"path: {EXCERPT}"))
    assert main(["run", str(scenario), "--list"]) == 2
    assert ("knobs.policy: 'fcsf' is not one of fcfs, priority, static; did you mean 'fcfs'?"
            in capsys.readouterr().err)
