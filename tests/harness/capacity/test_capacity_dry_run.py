"""``batchlab capacity --dry-run`` prints the engine's launch plan and starts nothing: it was
ignored, and the search tried to start the engine (a real one where it is installed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.process import ServerProcess
from harness.cli import main

REPO = Path(__file__).resolve().parents[3]
EXCERPT = REPO / "harness" / "data" / "azure_conv_excerpt.csv"


def test_a_dry_run_prints_the_plan_and_starts_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: ServerProcess) -> None:
        raise AssertionError("a dry run must not start anything")

    monkeypatch.setattr(ServerProcess, "start", refuse)
    model = tmp_path / "tiny"
    model.mkdir()
    out = tmp_path / "cap"
    assert main(["capacity", "--engine", "trtllm", "--launch", "--model-path", str(model),
                 "--model", "tiny", "--max-model-len", "2048", "--trace", str(EXCERPT),
                 "--limit", "4", "--slo", "ttft_s=1", "--dry-run", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert '"trtllm-serve",' in said and "knob mapping:" in said
    assert said.rstrip().endswith("nothing started or written")
    assert not out.exists()


def test_a_dry_run_of_the_simulated_engine_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", "--trace", str(EXCERPT), "--limit", "4", "--slo", "ttft_s=1",
                 "--dry-run", "--out", str(tmp_path / "cap")]) == 2
    assert "--dry-run: only with --engine NAME" in capsys.readouterr().err
    assert not (tmp_path / "cap").exists()
