"""``batchlab summarize`` on a run folder whose summary.json is gone says how the run ended, as
the lost summary did: its manifest's ``status`` and ``stopped_early``, and how much of its trace
it sent (``num_planned``, ``num_not_sent``; a simulated run's manifest has its trace's count)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main as cli_main

REPO = Path(__file__).resolve().parents[3]
EXCERPT = REPO / "harness" / "data" / "azure_conv_excerpt.csv"
# and, for a simulated run, that its figures are predictions, and how many steps it ran
ENDED = ("status", "stopped_early", "num_planned", "num_not_sent", "num_requests",
         "prediction", "num_steps")


def _summary(folder: Path) -> dict[str, Any]:
    return dict(json.loads((folder / "summary.json").read_text()))


def test_a_simulated_runs_rebuilt_summary_says_how_it_ended(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cap"
    # two simulated probes: 64 req/s stopped early, 32 req/s run to its end
    assert cli_main(["capacity", "--trace", str(EXCERPT), "--limit", "200", "--slo",
                     "ttft_s=0.5,tpot_s=0.03", "--start", "64", "--max-probes", "2",
                     "--out", str(out)]) == 0
    for probe, status in (("rate-64", "stopped"), ("rate-32", "finished")):
        original = _summary(out / "reference" / probe)
        copy = tmp_path / probe
        shutil.copytree(out / "reference" / probe, copy)
        (copy / "summary.json").unlink()
        assert cli_main(["summarize", str(copy)]) == 0
        rebuilt = _summary(copy)
        assert rebuilt["status"] == original["status"] == status
        assert {k: rebuilt.get(k) for k in ENDED} == {k: original.get(k) for k in ENDED}
        assert rebuilt["num_planned"] == 200
        assert rebuilt["prediction"]["record"]["kind"] == "catalog" and rebuilt["num_steps"] > 0
        assert rebuilt["num_not_sent"] == 200 - rebuilt["num_requests"]
    assert _summary(tmp_path / "rate-64")["num_not_sent"] > 0
    assert "stopped_early" not in _summary(tmp_path / "rate-32")
    capsys.readouterr()
