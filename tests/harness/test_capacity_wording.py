"""What a capacity report says of the bracket's failing probe when it also failed the pace
check: "met the SLO but ..." only when its SLO attainment reached the target; a probe below
the target is said to have failed on its attainment (and on its pace too), never to have met
the SLO. A small search through the command line (a few seconds, simulated), then its
``search.json`` changed by hand for the cases the trace does not produce."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from harness.metrics import attainment_text

TRACE = str(Path(__file__).resolve().parents[2] / "harness" / "data" / "azure_conv_excerpt.csv")
FELL_BEHIND = ("fell behind: completed 11.2 req/s of 15.9 arriving over the second half of "
               "its arrivals")


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 req/s passes, 16 fails: half its requests miss the SLO, and its 300 requests arrive
    in too short a time to show a steady state."""
    out = tmp_path_factory.mktemp("capacity") / "run"
    code = main(["capacity", "--trace", TRACE, "--limit", "300",
                 "--max-num-seqs", "64", "--slo", "ttft_s=0.5,tpot_s=0.03", "--start", "8",
                 "--max-probes", "2", "--out", str(out)])
    assert code == 0
    return out


@pytest.fixture
def run(searched: Path, tmp_path: Path) -> Path:
    """A copy of the search's folder, free to change."""
    return Path(shutil.copytree(searched, tmp_path / "run"))


def _search_file(run: Path) -> Path:
    return run / "reference" / "search.json"


def _failing_probe(search: dict[str, Any]) -> dict[str, Any]:
    failing = search["bracket"]["failing"]
    probe: dict[str, Any] = next(p for p in search["probes"] if p["load"] == failing)
    return probe


def _capacity_evidence(run: Path) -> str:
    """The capacity table's row of the setting."""
    text = (run / "report.md").read_text()
    rows = [line for line in text.splitlines()
            if line.startswith("| `reference` |") and "search (" in line]
    assert len(rows) == 1, rows
    return rows[0]


def _set_failing_probe(run: Path, attainment: float, behind: str) -> str:
    """Give the bracket's failing probe this attainment and pace, re-render the report, and
    return the failing load as the report writes it."""
    path = _search_file(run)
    search = json.loads(path.read_text())
    probe = _failing_probe(search)
    probe.update(attainment=attainment, behind=behind, passed=False)
    path.write_text(json.dumps(search))
    assert main(["report", str(run)]) == 0
    return f"{probe['load']:g}"


def test_a_probe_below_the_target_failed_on_attainment(run: Path) -> None:
    search = json.loads(_search_file(run).read_text())
    probe = _failing_probe(search)
    assert probe["attainment"] < search["target_attainment"]  # what the test is about
    assert str(probe["behind"]).startswith("too short")
    row = _capacity_evidence(run)
    assert (f"; {probe['load']:g} failed on SLO attainment "
            f"({attainment_text(probe['attainment'])}, under the 99.0% target) "
            f"and was {probe['behind']}") in row
    assert "met the SLO" not in row


def test_a_probe_that_met_the_slo_fell_behind(run: Path) -> None:
    load = _set_failing_probe(run, 1.0, FELL_BEHIND)
    row = _capacity_evidence(run)
    assert f"; {load} met the SLO but {FELL_BEHIND}" in row
    assert "failed on SLO attainment" not in row


def test_a_probe_below_the_target_that_also_fell_behind(run: Path) -> None:
    load = _set_failing_probe(run, 0.9, FELL_BEHIND)
    row = _capacity_evidence(run)
    assert (f"; {load} failed on SLO attainment (90.0%, under the 99.0% target) "
            f"and {FELL_BEHIND}") in row
    assert "met the SLO" not in row


def test_a_probe_at_the_target_met_the_slo(run: Path) -> None:
    """Exactly the target is met (attainment >= target, as the search judges it)."""
    search = json.loads(_search_file(run).read_text())
    load = _set_failing_probe(run, float(search["target_attainment"]), FELL_BEHIND)
    assert f"; {load} met the SLO but {FELL_BEHIND}" in _capacity_evidence(run)


def test_a_target_of_99_9_percent_is_not_asked_as_100(tmp_path: Path) -> None:
    """The search's question rounded its target to a whole percent: --target 0.999 asked
    for "at least 100% of requests"."""
    out = tmp_path / "cap"
    assert main(["capacity", "--trace", TRACE, "--limit", "40", "--slo", "ttft_s=5",
                 "--target", "0.999", "--max-probes", "2", "--out", str(out)]) in (0, 1)
    question = json.loads((out / "scenario.json").read_text())["question"]
    assert "at least 99.9% of requests" in question


def test_a_negative_think_time_is_bad_input(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It failed the search ("search failed: ValueError", exit 1) instead of being refused."""
    assert main(["capacity", "--trace", TRACE, "--limit", "40", "--slo", "ttft_s=1",
                 "--search", "concurrency", "--think-time-s", "-1",
                 "--out", str(tmp_path / "cap")]) == 2
    assert "--think-time-s: expected seconds >= 0, got -1" in capsys.readouterr().err


def test_a_minimum_the_trace_cannot_judge_is_said_to_be_lowered(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The cap of one user per few requests lowered --min-load and --start without a word:
    the search reported "below_min < 10 users" for a minimum the user had set at 100."""
    main(["capacity", "--trace", TRACE, "--limit", "40", "--slo", "ttft_s=1", "--search",
          "concurrency", "--min-load", "100", "--start", "100", "--max-probes", "2",
          "--out", str(tmp_path / "cap")])
    assert ("--start 100 and --min-load 100 lowered to 10 users, the most this trace can "
            "judge" in capsys.readouterr().err)
