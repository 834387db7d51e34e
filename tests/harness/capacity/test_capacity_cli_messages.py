"""``batchlab capacity`` saying what happened in the user's terms: Ctrl-C while the report is
drawn says the searches are complete and how to draw it; a load range refused names only the
flags given and which bounds are defaults; --resume with --overwrite is refused as a
contradiction; a failed search gives its reason without a class name, and no prediction; one
user is one user."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main as cli_main
from harness.prediction import CAPACITY_CAVEAT
from harness.runfolder import LOCK_FILE

REPO = Path(__file__).resolve().parents[3]
EXCERPT = str(REPO / "harness" / "data" / "azure_conv_excerpt.csv")
SMALL = ["capacity", "--trace", "synthetic", "--num-requests", "16", "--prompt-tokens", "64",
         "--output-tokens", "8", "--start", "4", "--max-probes", "2", "--slo", "ttft_s=1"]


def test_ctrl_c_while_the_report_is_drawn_says_the_searches_are_complete(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue case: the table printed, then "interrupted; results measured so far are on
    disk", beside a capacity.json saying "finished" and no report.md."""
    import harness.report as report_module

    real = report_module.render_scenario_report

    def interrupted(*args: object, **kwargs: object) -> Path:
        raise KeyboardInterrupt

    monkeypatch.setattr(report_module, "render_scenario_report", interrupted)
    out = tmp_path / "cap"
    assert cli_main([*SMALL, "--out", str(out)]) == 130
    said = capsys.readouterr()
    assert "bracket (pass .. fail)" in said.out  # the table came first
    assert said.err.strip().splitlines()[-1] == (
        f"batchlab capacity: interrupted; the searches are complete and listed in "
        f"{out / 'capacity.json'}, but report.md was not written; `batchlab report {out}` "
        "renders it")
    assert json.loads((out / "capacity.json").read_text())["status"] == "finished"
    assert not (out / "report.md").exists()
    monkeypatch.setattr(report_module, "render_scenario_report", real)
    assert cli_main(["report", str(out)]) == 0  # as it says
    assert (out / "report.md").is_file()


@pytest.mark.parametrize(("extra", "said"), [
    (["--max-load", "0.001"], "--max-load 0.001 is below the lowest load (--min-load, "
                              "default 0.01)"),
    (["--min-load", "20000"], "--min-load 20000 is above the highest load (--max-load, "
                              "default 10000)"),
    (["--start", "0.001"], "--start 0.001 is below the lowest load (--min-load, default 0.01)"),
    (["--start", "20000"], "--start 20000 is above the highest load (--max-load, default "
                           "10000)"),
    (["--start", "0.5", "--min-load", "1"], "--start 0.5 is below --min-load 1"),
    (["--start", "8", "--max-load", "5"], "--start 8 is above --max-load 5"),
    (["--start", "0.001", "--max-load", "0.005"],
     "--max-load 0.005 is below the lowest load (--min-load, default 0.01)"),
    (["--max-load", "-1"], "--max-load: must be a positive load, got -1"),
    (["--search", "concurrency", "--max-load", "0.5"],
     "--max-load 0.5 is below the lowest load (--min-load, default 1)"),
    (["--search", "concurrency", "--start", "5000"],
     "--start 5000 is above the highest load (--max-load, default 4096)"),
])
def test_a_load_out_of_range_names_only_the_flags_given(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str],
        said: str) -> None:
    """Issue case: `--max-load 0.001` alone was refused as "--min-load <= --start <=
    --max-load is needed, got 0.01 <= 0.001 <= 0.001": a --start nobody gave, clamped."""
    base = [arg for arg in SMALL if arg not in ("--start", "4")]
    assert cli_main([*base, *extra, "--out", str(tmp_path / "cap")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"batchlab capacity: error: {said}"
    assert not (tmp_path / "cap").exists()


def test_resume_with_overwrite_is_refused_as_a_contradiction(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue case: --resume --overwrite into another search's folder was told "drop --resume
    and pass --overwrite to start over", --overwrite given."""
    out = tmp_path / "cap"
    assert cli_main([*SMALL, "--out", str(out)]) == 0
    before = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*"))
              if p.is_file() and p.name != LOCK_FILE}
    capsys.readouterr()
    assert cli_main([*SMALL, "--max-num-seqs", "8", "--out", str(out), "--resume",
                     "--overwrite"]) == 2
    assert capsys.readouterr().err.strip() == (
        "batchlab capacity: error: --resume and --overwrite contradict each other: --resume "
        "goes on with the search in --out, --overwrite replaces another search there and "
        "starts over; give one")
    assert {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != LOCK_FILE} == before


def test_a_failed_search_says_its_reason_alone_and_predicts_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue case: "failed: NothingServed: 10 of 100 requests are refused ...", then
    "reference: predicted by the reference engine ..." for a setting with no capacity."""
    out = tmp_path / "cap"
    assert cli_main(["capacity", "--trace", EXCERPT, "--limit", "60", "--num-gpu-blocks", "10",
                     "--slo", "ttft_s=0.5", "--out", str(out)]) == 1
    printed = capsys.readouterr()
    said = printed.out
    assert "reference: search failed: 54 of 60 requests are refused" in printed.err  # the log
    assert "NothingServed" not in printed.err
    row = next(line for line in said.splitlines() if line.startswith("reference "))
    assert row.endswith("failed: 54 of 60 requests are refused at any load (they can never "
                        "fit the KV cache): SLO attainment cannot reach 99.0%, whatever the "
                        "load")
    assert "NothingServed" not in said
    assert "predicted by" not in said and CAPACITY_CAVEAT not in said


def test_a_bracket_of_one_user_says_user(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A concurrency search that fails at its lowest load, 1 user: "– .. 1 user", not
    "1 users"."""
    out = tmp_path / "cap"
    assert cli_main(["capacity", "--trace", "synthetic", "--num-requests", "16",
                     "--prompt-tokens", "512", "--output-tokens", "16", "--search",
                     "concurrency", "--start", "1", "--max-load", "2", "--slo", "ttft_s=0.001",
                     "--out", str(out)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("reference "))
    assert "– .. 1 user " in row and "below_min" in row


def test_the_conditions_said_without_their_class_are_the_classes_raised() -> None:
    """The console, the log and the report drop the class of an engine's or a trace's
    condition by its name: the names must stay those of the classes raised."""
    from adapters.process import EngineExited
    from harness.results import CONDITION_ERRORS, NothingServed, failure_reason
    from harness.scenario.attached import ServerRestarted, ServerStoppedAnswering

    assert set(CONDITION_ERRORS) == {c.__name__ for c in (
        NothingServed, EngineExited, ServerStoppedAnswering, ServerRestarted)}
    assert failure_reason("EngineExited: the engine exited (code 1)") == \
        "the engine exited (code 1)"
    assert failure_reason("KeyError: 'x'") == "KeyError: 'x'"  # a fault: its class kept
