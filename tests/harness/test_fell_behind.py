"""A run whose engine fell behind its arrivals says so, on the terminal and in its report: its
TTFT and E2E are then those of the trace's length, not of a steady state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.behind import fell_behind_warning
from harness.cli import main as cli_main
from harness.metrics import PACE_TOLERANCE, Pace
from harness.report import render_run_report
from harness.report.findings import _behind_finding, _offered_load_finding
from harness.report.runs import CellResult, load_run

REPO = Path(__file__).resolve().parents[2]
EXCERPT = REPO / "harness" / "data" / "azure_conv_excerpt.csv"
SIM = ["simulate", "--trace", str(EXCERPT), "--limit", "300", "--model", "llama-3.1-8b",
       "--gpu", "h100-sxm", "--max-num-seqs", "32", "--no-report"]
BEHIND = "fell behind its arrivals"


def _simulate(out: Path, *extra: str) -> None:
    assert cli_main([*SIM, *extra, "--out", str(out)]) == 0


def test_an_overloaded_run_says_it_fell_behind(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    # 32 sequences of llama-3.1-8b serve about 10 req/s of this trace: 10 req/s is too many
    _simulate(tmp_path / "over", "--rate", "10")
    err = capsys.readouterr().err
    # its rates are predictions, and the warning says so first
    assert f"warning: predicted: the engine {BEHIND}" in err
    pace = load_run(tmp_path / "over").pace
    assert pace is not None and pace.fell_behind and not pace.kept
    # a scenario cell's warning is the same words as the command's
    assert f"warning: {fell_behind_warning(tmp_path / 'over')}\n" in err
    assert pace.completed_per_s < pace.due_per_s
    render_run_report(tmp_path / "over")
    report = (tmp_path / "over" / "report.md").read_text()
    findings = report.split("## Key findings")[1].split("\n## ")[0]
    assert f"The engine {BEHIND}" in findings
    assert f"it completed {pace.completed_per_s:.3g} req/s while" in findings


def test_a_run_that_keeps_pace_and_a_closed_loop_say_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _simulate(tmp_path / "light", "--rate", "2")
    pace = load_run(tmp_path / "light").pace
    assert pace is not None and pace.kept
    # a closed loop at any load: its arrivals wait for completions, so no pace is checked
    _simulate(tmp_path / "closed", "--mode", "closed", "--concurrency", "200")
    assert load_run(tmp_path / "closed").pace is None
    assert BEHIND not in capsys.readouterr().err
    for name in ("light", "closed"):
        render_run_report(tmp_path / name)
        assert BEHIND not in (tmp_path / name / "report.md").read_text()


def test_a_run_that_did_not_finish_is_not_judged_on_its_pace(tmp_path: Path) -> None:
    _simulate(tmp_path / "over", "--rate", "10")
    manifest_path = tmp_path / "over" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "status": "interrupted"}))
    assert load_run(tmp_path / "over").pace is None


def test_a_comparison_names_each_cell_that_fell_behind(tmp_path: Path) -> None:
    _simulate(tmp_path / "r2", "--rate", "2")
    _simulate(tmp_path / "r10", "--rate", "10")
    out = tmp_path / "cmp.md"
    assert cli_main(["report", str(tmp_path / "r2"), str(tmp_path / "r10"),
                     "-o", str(out)]) == 0
    findings = out.read_text().split("## Key findings")[1].split("\n## ")[0]
    assert ("`r10` fell behind its arrivals, so its TTFT and E2E are those of this trace's "
            "length") in findings
    assert "Over the second half of its arrivals it completed" in findings
    assert "`r2`" not in findings.split("fell behind")[0].splitlines()[-1]
    # the one that kept pace served all it was offered: its throughput ratio is a lower bound
    assert ("- `r2` kept pace with its arrivals, serving all the load offered: a throughput "
            "ratio between it and a cell that fell behind is a lower bound") in findings


def _cell(name: str, pace: Pace) -> CellResult:
    cell = CellResult(name=name, run_dir=Path(name), state="done", summary={})
    cell.__dict__["pace"] = pace  # what CellResult.pace would have read from its folder
    return cell


def test_a_cell_just_as_short_as_one_that_fell_behind_is_named_beside_it() -> None:
    """Two cells 9% short of their arrivals, one just past what chance explains: the finding
    does not set them apart as if one kept pace."""
    behind = Pace(12.45, 11.24, False, "fell behind: ...", fell_behind=True, settled=True)
    near = Pace(12.40, 11.24, True, settled=True)
    kept = Pace(10.0, 9.8, True, settled=True)
    text = _behind_finding([_cell("fcfs", near), _cell("priority", behind),
                            _cell("light", kept)])[0]
    assert text.startswith("`priority` fell behind its arrivals")
    assert "by no more than chance explains: `fcfs` (completed 11.24 req/s while 12.40 req/s " \
           "were due, 9.4% short)" in text
    assert "`light`" not in text
    # nothing fell behind: nothing is said, however short a cell was
    assert _behind_finding([_cell("fcfs", near), _cell("light", kept)]) == []
    # nor is the short one said, in the next finding, to have served all the load offered
    # (the prefix-caching report said both of one cell)
    assert _offered_load_finding([_cell("fcfs", near), _cell("priority", behind),
                                  _cell("light", kept)]) == [
        "`light` kept pace with its arrivals, serving all the load offered: a throughput "
        "ratio between it and a cell that fell behind is a lower bound on the difference in "
        "what they can serve; `batchlab capacity` finds the highest load each keeps pace with."]


def test_every_cell_short_within_chance_is_not_called_some() -> None:
    """All four cells short of their arrivals within chance: the finding said "some fell
    short" and then listed every cell."""
    near = Pace(12.40, 11.24, True, settled=True)
    (text,) = _offered_load_finding([_cell("a", near), _cell("b", near)])
    assert text.startswith("No cell fell behind its arrivals, though every one fell short of "
                           "them by more than 5.0%")
    kept = Pace(10.0, 9.8, True, settled=True)
    (text,) = _offered_load_finding([_cell("a", near), _cell("light", kept)])
    # one of two: named, not "some"
    assert text.startswith("No cell fell behind its arrivals, though `a` (9.4%) fell short of "
                           "them by more than 5.0%, by no more than chance explains: each")
    (text,) = _offered_load_finding([_cell("a", near), _cell("b", near), _cell("light", kept)])
    assert "though `a` (9.4%), `b` (9.4%) fell short of them" in text


def test_a_run_too_short_to_tell_is_not_said_to_have_fallen_behind(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """40 requests over 10 s, each about 5 s long: the run is not long enough to tell (its
    arrivals last under 4 times its requests' decode time p90), so nothing is said. Its
    requests still decoding when the arrivals end once made the counts differ, though no
    queue grew; each is now counted where it was due, its own decode time after its arrival,
    and the counts agree."""
    assert cli_main(["simulate", "--trace", str(EXCERPT), "--limit", "40", "--rate", "4",
                     "--model", "llama-3.1-70b", "--gpu", "a100-80gb", "--tp", "4",
                     "--no-report", "--out", str(tmp_path / "short")]) == 0
    pace = load_run(tmp_path / "short").pace
    assert pace is not None and not pace.fell_behind and pace.settled is False
    assert pace.completed_per_s == pytest.approx(pace.due_per_s, rel=PACE_TOLERANCE)
    assert not pace.overloaded
    assert BEHIND not in capsys.readouterr().err


def test_a_cell_too_short_to_tell_is_not_said_to_be_within_chance() -> None:
    """A cell whose counts fell short, on a run too short to tell, is not flagged; nor is it
    said to be short "by no more than chance explains", which it is not."""
    behind = Pace(12.45, 8.0, False, "fell behind: ...", fell_behind=True, settled=True)
    short = Pace(10.0, 7.0, False, "too short ...", fell_behind=True, settled=False)
    text = _behind_finding([_cell("a", behind), _cell("b", short)])[0]
    assert "`b`" not in text


def test_the_most_overloaded_runs_are_flagged_too(tmp_path: Path) -> None:
    """The arrivals are counted one decode time earlier, not one E2E: an overloaded run's E2E
    is mostly its queue, and moved the window before the first arrival, so that the heaviest
    overloads went unflagged. Every rate past the engine's (about 6.3 req/s here) is."""
    for rate in ("10", "30"):
        assert cli_main(["simulate", "--trace", "synthetic", "--num-requests", "300",
                         "--prompt-tokens", "6000", "--output-tokens", "5", "--rate", rate,
                         "--no-report", "--out", str(tmp_path / rate)]) == 0
        pace = load_run(tmp_path / rate).pace
        assert pace is not None and pace.overloaded, rate
        assert pace.due_per_s == pytest.approx(float(rate), rel=0.1)
        assert pace.completed_per_s == pytest.approx(6.3, rel=0.1)


def test_rejected_requests_are_no_queue(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """45 of 50 requests rejected (a KV cache of 10 blocks): they never waited, so the run is
    not said to have fallen behind; its failures are said instead."""
    assert cli_main([*SIM, "--num-gpu-blocks", "10", "--limit", "50",
                     "--out", str(tmp_path / "rej")]) == 0
    assert BEHIND not in capsys.readouterr().err


def test_a_live_closed_loop_is_not_judged_on_its_pace(tmp_path: Path) -> None:
    """A live replay says its closed loop at the top of its manifest (``mode``), a simulated
    one under ``load``: neither is judged, its arrivals waiting for completions."""
    from harness.results import run_pace

    _simulate(tmp_path / "over", "--rate", "10")
    summary = json.loads((tmp_path / "over" / "summary.json").read_text())
    assert run_pace(tmp_path / "over", summary, {"mode": "open"}) is not None
    assert run_pace(tmp_path / "over", summary, {"mode": "closed"}) is None
    assert run_pace(tmp_path / "over", summary, {"load": {"mode": "closed"}}) is None


def test_cells_behind_one_arrival_rate_are_said_in_one_short_sentence() -> None:
    """Six cells of one sweep fell behind the same arrivals: the finding repeated the arrival
    rate and the queue's growth for each, 1,200 characters ahead of the sweep's answers."""
    cells = [_cell(f"c{n}", Pace(87.3, done, False, "fell behind: ...", fell_behind=True,
                                 settled=False, queue_growth_s=grew, span_s=4.6))
             for n, done, grew in ((1, 1.5, 556.0), (4, 4.14, 144.0), (16, 12.0, 40.1))]
    text = _behind_finding(cells)[0]
    assert text.startswith(
        "3 of 3 cells fell behind their arrivals, so their TTFT and E2E are those of this "
        "trace's length (a longer trace would wait longer), not of a steady state; `batchlab "
        "capacity` finds the highest load each keeps pace with. Over the second half of the "
        "arrivals, 87.3 req/s were due while they completed (req/s) `c1` 1.5, `c4` 4.14, `c16` "
        "12; each too short to show a steady state, yet those arriving last waited 40.1 s to "
        "556 s longer for a first token than the first, their queues growing for the whole "
        "run. These completion rates count the requests finished from the arrivals' midpoint "
        "to the last arrival (2.3 s), not the Throughput table's whole-run requests/s")
    assert text.count("87.3") == 1


def test_cells_behind_one_arrival_rate_over_a_long_enough_run_say_no_queue_growth() -> None:
    cells = [_cell(f"c{n}", Pace(20.0, done, False, "fell behind: ...", fell_behind=True,
                                 settled=True)) for n, done in ((1, 5.0), (2, 9.0))]
    text = _behind_finding(cells)[0]
    assert ("20 req/s were due while they completed (req/s) `c1` 5, `c2` 9, their queues "
            "growing for the whole run. These completion rates count the requests finished "
            "from the arrivals' midpoint to the last arrival, not") in text


def test_cells_behind_one_rate_some_too_short_are_said_each_on_its_own() -> None:
    """One settled cell and one swamped: the one sentence said "too short to show a steady
    state" of both."""
    settled = Pace(20.0, 5.0, False, "fell behind: ...", fell_behind=True, settled=True)
    swamped = Pace(20.0, 9.0, False, "fell behind: ...", fell_behind=True, settled=False,
                   queue_growth_s=30.0, span_s=4.6)
    text = _behind_finding([_cell("settled", settled), _cell("short", swamped)])[0]
    assert "`settled` (completed 5 req/s while 20 req/s were due); `short` (completed 9 req/s " \
           "while 20 req/s were due; too short to show a steady state, yet those arriving last " \
           "waited 30 s longer" in text


def test_a_run_too_short_to_count_rates_is_not_said_to_fall_behind_0_against_0() -> None:
    """Arrivals too short for the rate counts (requests that decode for longer than half of
    them are counted on neither side: 0 req/s against 0): the warning gives the wait that
    grew, not two zeros that contradict it."""
    from harness.metrics import Pace

    pace = Pace(0.0, 0.0, False, "too short", fell_behind=True, settled=False,
                queue_growth_s=62.52, span_s=1.06)
    assert pace.overloaded
    text = pace.behind_warning()
    assert "0 req/s" not in text
    assert text.startswith("the engine fell behind its arrivals, so TTFT and E2E are those "
                           "of this trace's length")
    assert ("those arriving last waited 62.52 s longer for a first token than the first, over "
            "arrivals lasting 1.06 s") in text
    shown = Pace(8.0, 5.0, False, "too short", fell_behind=True, settled=False,
                 queue_growth_s=62.52, span_s=1.06)
    assert "completed 5 req/s while 8 req/s were due" in shown.behind_warning()


def test_a_finding_on_arrivals_too_short_to_count_gives_the_wait_not_0_against_0() -> None:
    swamped = Pace(0.0, 0.0, False, "too short", fell_behind=True, settled=False,
                   queue_growth_s=62.52, span_s=1.06)
    (one,) = _behind_finding([_cell("live-4w", swamped)])
    assert "0 req/s" not in one
    assert one.startswith("The engine fell behind its arrivals, so its TTFT and E2E are those "
                          "of this trace's length")
    assert ("Those arriving last waited 62.5 s longer for a first token than the first, over "
            "arrivals lasting 1.06 s, too short to count a rate over their second half, its "
            "queue growing for the whole run.") in one
    # no rate was given: nothing explains a rate's window
    assert "completion rate" not in one and "second half of them" not in one
    (two,) = _behind_finding([_cell("a", swamped), _cell("b", swamped)])
    assert "0 req/s" not in two and "were due while they completed" not in two
    assert "`a` (those arriving last waited 62.5 s longer" in two
    assert "completion rate" not in two and "(over the second half" not in two


def test_cells_behind_each_its_own_due_rate_give_one_figure_pair_and_one_wait_each() -> None:
    """The batch-size sweep's six cells, each with its own due rate and each too short to show
    a steady state: the finding repeated "too short to show a steady state, yet those arriving
    last waited ... longer for a first token than the first" six times, 240 words before the
    verdict. The verdict comes first, then a figure pair and a wait a cell."""
    cells = [_cell(f"c{n}", Pace(due, done, False, "fell behind: ...", fell_behind=True,
                                 settled=False, queue_growth_s=grew, span_s=5.32))
             for n, due, done, grew in ((1, 63.2, 1.5, 556.0), (4, 58.7, 4.14, 144.0),
                                        (64, 42.5, 21.1, 13.4))]
    (text,) = _behind_finding(cells)
    assert text.startswith("3 of 3 cells fell behind their arrivals, so their TTFT and E2E are "
                           "those of this trace's length")
    assert ("(requests/s completed of those due; how much longer those arriving last waited "
            "for a first token than the first, each run too short to show a steady state): "
            "`c1` 1.5 of 63.2, 556 s; `c4` 4.14 of 58.7, 144 s; `c64` 21.1 of 42.5, 13.4 s. "
            "These completion rates count the requests finished from the arrivals' midpoint to "
            "the last arrival (2.66 s)") in text
    assert text.count("steady state") == 2  # the verdict's, and once for every cell


def test_a_searched_capacity_says_how_short_its_pace_check_let_the_probe_fall() -> None:
    """The capacity section gave the rule (a shortfall up to max(5%, 2/sqrt(n))) and left the
    reader to work it out for the probe: 181 requests due allow 14.9%, so a capacity of 10.37
    req/s may be a sustained rate of 8.83."""
    from harness.report.curves import CapacityRow
    from harness.report.sections import capacity_section

    probe = CellResult(name="reference/rate-10.37", run_dir=Path("p"), state="done",
                       summary={}, manifest={"load": {"kind": "rate", "value": 10.37}})
    probe.__dict__["pace"] = Pace(12.1, 11.9, True, settled=True, num_due=181)
    row = CapacityRow("reference", "rate", 10.37, "=", "search",
                      "search (found): 10.37 passed, 10.83 failed (within 5%)",
                      cells=("reference/rate-10.37", "reference/rate-10.83"))
    text = "\n".join(capacity_section([row], "reference", {"ttft_s": 0.5}, 0.99, [probe]))
    assert ("10.83 failed (within 5%); its pace check allowed a shortfall of up to 14.9% (181 "
            "requests due): it may sustain as little as 8.83 req/s; `reference/rate-10.37`"
            ) in text
    # 2,000 requests due: the 5% floor
    probe.__dict__["pace"] = Pace(12.1, 11.9, True, settled=True, num_due=2000)
    text = "\n".join(capacity_section([row], "reference", {"ttft_s": 0.5}, 0.99, [probe]))
    assert "up to 5.0% (2,000 requests due): it may sustain as little as 9.85 req/s" in text
    # a pace recorded without its count (or no probe at hand): nothing made up
    probe.__dict__["pace"] = Pace(12.1, 11.9, True, settled=True)
    text = "\n".join(capacity_section([row], "reference", {"ttft_s": 0.5}, 0.99, [probe]))
    assert "pace check allowed" not in text
    # a lower bound (no load tried failed but for a trace too short): the same check, and it
    # matters more there, where the probe counted few requests
    probe.__dict__["pace"] = Pace(7.9, 7.5, True, settled=True, num_due=20)
    low = CapacityRow("reference", "rate", 10.37, "≥", "search",
                      "search (trace_too_short): 10.37 passed, 10.83 failed",
                      cells=("reference/rate-10.37", "reference/rate-10.83"))
    text = "\n".join(capacity_section([low], "reference", {"ttft_s": 0.5}, 0.99, [probe]))
    assert "up to 44.7% (20 requests due): it may sustain as little as 5.73 req/s" in text
