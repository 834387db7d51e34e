"""What ``batchlab compare`` says beside its verdict: defects that made a nightly log read
wrong, though the exit status was right.

- a run that served nothing was "ended early", where its own files say failed;
- a scenario's trace-level time scale (or an unreadable cell.json) read as another load than
  the same time scale given to ``simulate``;
- a failed check read as a change of exactly its limit ("worse by 10.0% ... limit 10%"),
  a change beside "a change within 1% is same" as "+1.0% worse", a tiny fall as "-0.0%";
- a failed check set two equal-looking figures side by side ("1.64 s -> 1.64 s");
- ``--fail-if`` given twice for one metric showed the last limit beside a failure of the
  first ("FAIL (limit 30000%)" beside +25324.6%);
- a damaged scenario.json was a traceback (exit 1, read by CI as a regression);
- a corrupt manifest.json was "no manifest.json";
- checks that could not be applied (nothing to regress from) read as "passed";
- a file given for a folder was "no such folder"; "with 1 requests in flight".
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness import scenario as sc
from harness.cli import main
from harness.compare import change_of, compare, metric_named, pct_text
from harness.report.runs import CellResult

REPO = Path(__file__).resolve().parents[2]
EXCERPT = REPO / "harness" / "data" / "azure_conv_excerpt.csv"
KNOBS = ["--policy", "fcfs", "--max-num-seqs", "64", "--max-model-len", "8192",
         "--max-num-batched-tokens", "8192", "--no-chunked-prefill"]
SCENARIO = f"""\
name: nightly
question: q
trace: {{path: {EXCERPT}, limit: 20, time_scale: 0.35}}
model: llama-3.1-8b
gpu: h100-sxm
engines:
  - name: continuous
    engine: reference
    knobs: {{policy: fcfs, max_num_seqs: 64, chunked_prefill: false, max_model_len: 8192,
             max_num_batched_tokens: 8192}}
"""


def run_scenario(root: Path, folder: str, *, blocks: int | None = None) -> Path:
    """The scenario into ``root/folder``, its scenario folder; ``blocks``: KV blocks of the
    cell (2: no prompt fits, nothing is served)."""
    path = root / f"{folder}.yaml"
    path.write_text(SCENARIO if blocks is None else SCENARIO.replace(
        "engine: reference", f"engine: reference\n    num_gpu_blocks: {blocks}"))
    sc.run_scenario(sc.load_scenario(path), root / folder,
                    progress=sc.SweepProgress(1, stream=io.StringIO(), tty=False),
                    write_report=False)
    return root / folder / "nightly"


def simulate(out: Path, *extra: str) -> Path:
    assert main(["simulate", "--trace", str(EXCERPT), "--limit", "20", "--model",
                 "llama-3.1-8b", "--gpu", "h100-sxm", *KNOBS, *extra, "--no-report",
                 "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_scenario(tmp_path_factory.mktemp("night"), "a")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A single run at the scenario's time scale: the scenario's cell as ``simulate`` runs
    it."""
    return simulate(tmp_path_factory.mktemp("single") / "continuous", "--time-scale", "0.35")


def patched(base: Path, to: Path, *, times: bool = True, **metrics: float) -> Path:
    """A copy of ``base`` with summary figures (``ttft_s__p90=...``) multiplied (``times``)
    or set."""
    shutil.copytree(base, to)
    summary = json.loads((to / "summary.json").read_text())
    for name, value in metrics.items():
        group, field = name.split("__")
        summary[group][field] = summary[group][field] * value if times else value
    (to / "summary.json").write_text(json.dumps(summary))
    return to


def rows(out: str, metric: str) -> list[str]:
    return [line for line in out.splitlines() if f"  {metric}  " in line
            or (line.startswith("check failed:") and f" {metric} " in line)]


# ---------------------------------------------------------------- served nothing: failed


def test_a_run_that_served_nothing_is_failed_not_ended_early(
        night: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    failed = run_scenario(tmp_path, "f", blocks=2)
    out = tmp_path / "c.json"
    assert main(["compare", str(night), str(failed), "--fail-if", "failures=0",
                 "--json", str(out)]) == 1
    text = capsys.readouterr().out
    assert "not compared: continuous: after failed (none of the 20 requests completed" in text
    assert "check failed: continuous: num_failed cannot be checked: after failed (" in text
    assert "ended early" not in text
    after = json.loads(out.read_text())["pairs"][0]["after"]
    assert after["state"] == "failed"
    assert after["reason"].startswith("none of the 20 requests completed")
    # as the before side: a failure there too, and nothing to regress from
    assert main(["compare", str(failed), str(night), "--fail-if", "failures=0"]) == 0
    text = capsys.readouterr().out
    assert "not compared: continuous: before failed (none of the 20" in text
    assert "has nothing to regress from: before failed (none of the 20" in text


# ---------------------------------------------------------------- the load each run ran at


def test_a_scenarios_trace_time_scale_is_the_load_the_run_ran_at(
        night: Path, run: Path, tmp_path: Path) -> None:
    """The scenario's cell.json says the trace's timing (the time scale is the trace's, for
    every cell); its manifest, as simulate's, says time × 0.35."""
    assert {d.aspect for d in compare(night, run).differences} == set()
    lighter = simulate(tmp_path / "continuous", "--time-scale", "0.5")
    load = [d.text for d in compare(night, lighter).differences if d.aspect == "load"]
    assert load == ["different load (time × 0.35 (rate × 2.86) -> time × 0.5 (rate × 2))"]


def test_an_unreadable_cell_json_reads_the_load_the_run_recorded(
        night: Path, tmp_path: Path) -> None:
    damaged = tmp_path / "nightly"
    shutil.copytree(night, damaged)
    (damaged / "continuous" / "cell.json").write_text("{not json")
    assert not [d for d in compare(night, damaged).differences if d.aspect == "load"]


# ---------------------------------------------------------------- a change beside its limit


def test_a_change_reads_on_its_side_of_each_limit() -> None:
    assert pct_text(10.04, (10.0,)) == "10.04"  # failed a limit of 10: not "10.0"
    assert pct_text(5.04, (5.0,)) == "5.04"
    assert pct_text(0.1499, (0.1,)) == "0.15"  # not "0.1"
    assert pct_text(0.959, (0.96,)) == "0.959"  # within 0.96: not "1.0"
    assert pct_text(10.000001, (10.0,)) == "10.000001"  # nearer than 6 digits tell apart
    assert pct_text(10.000000000000009, (10.0,)) == "10.0"  # at the limit: reads at it
    assert pct_text(25324.6, (10.0, 1.0)) == "25324.6"  # one decimal, as ever
    assert pct_text(9.96, (10.0,)) == "10.0"  # within a limit may read at it
    ttft = metric_named("ttft_s.p90")
    assert change_of(ttft, 1.0, 1.0104, 1.0).change_text_beside(1.0) == "+1.04%"
    assert change_of(ttft, 1.0, 0.9999, 1.0).change_text_beside(1.0) == "0.0%"  # not -0.0%
    assert change_of(ttft, 1.0, 0.95, 1.0).change_text == "-5.0%"


def test_a_failed_check_reads_above_its_limit_in_the_table_and_the_line(
        run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slower = patched(run, tmp_path / "slower", ttft_s__p90=1.1004, tpot_s__p50=1.0104)
    assert main(["compare", str(run), str(slower), "--fail-if", "ttft_s.p90=10"]) == 1
    out = capsys.readouterr().out
    row, line = rows(out, "ttft_s.p90")
    assert "+10.04%  worse  FAIL (limit 10%)" in row
    assert line.startswith("check failed: continuous vs slower: ttft_s.p90 worse by 10.04% (")
    # beyond the 1% "same" tolerance: reads beyond it, in a failed check's line too
    assert "+1.04%  worse" in rows(out, "tpot_s.p50")[0]
    assert main(["compare", str(run), str(slower), "--fail-if", "tpot_s.p50=0.5"]) == 1
    row, line = rows(capsys.readouterr().out, "tpot_s.p50")
    assert "+1.04%  worse  FAIL (limit 0.5%)" in row and " worse by 1.04% (" in line


def test_a_failed_check_never_shows_two_equal_figures(
        run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 1.64 s -> 1.6433 s, 0.2% worse: both "1.64 s" to three digits
    run = patched(run, tmp_path / "run", times=False, e2e_s__p50=1.64)
    slower = patched(run, tmp_path / "slower", e2e_s__p50=1.002)
    for same_within in ("0", "1"):  # worse, or "same" and failing a tighter check
        assert main(["compare", str(run), str(slower), "--fail-if", "e2e_s.p50=0.1",
                     "--same-within", same_within]) == 1
        out = capsys.readouterr().out
        row, line = rows(out, "e2e_s.p50")
        before, after = line.split(" (")[1].split(";")[0].split(" -> ")
        assert (before, after) == ("1.640 s", "1.643 s"), line  # as many decimals each
        assert f"{before}  " in row and f"{after}  " in row


def test_a_metric_checked_twice_shows_the_tightest_limit_it_failed(
        run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slower = patched(run, tmp_path / "slower", ttft_s__p90=254.246)
    for order in (("10", "30000"), ("30000", "10")):
        assert main(["compare", str(run), str(slower), *(a for limit in order for a in (
            "--fail-if", f"ttft_s.p90={limit}"))]) == 1
        out = capsys.readouterr().out
        assert rows(out, "ttft_s.p90")[0].endswith("worse  FAIL (limit 10%)")
        assert "checks: 1 failed (2 checks on 1 pair)" in out
    assert main(["compare", str(run), str(slower), "--fail-if", "ttft_s.p90=40000",
                 "--fail-if", "ttft_s.p90=30000"]) == 0
    assert rows(capsys.readouterr().out, "ttft_s.p90")[0].endswith("ok (limit 30000%)")


# ---------------------------------------------------------------- damaged files


@pytest.mark.parametrize(("cells", "got"), [
    (5, "a number"), ([1, 2], "a list holding a number"), ("static", "a string")])
def test_a_damaged_scenario_json_is_bad_input_naming_it(
        night: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], cells: Any,
        got: str) -> None:
    damaged = tmp_path / "nightly"
    shutil.copytree(night, damaged)
    meta = json.loads((damaged / "scenario.json").read_text())
    (damaged / "scenario.json").write_text(json.dumps({**meta, "cells": cells}))
    said = (f"{damaged / 'scenario.json'}: cells: expected a list of strings (the cells' "
            f"names), got {got}")
    assert main(["compare", str(night), str(damaged)]) == 2
    assert said in capsys.readouterr().err
    assert main(["report", str(damaged), "-o", str(tmp_path / "r" / "report.md")]) == 2
    assert said in capsys.readouterr().err


def test_a_corrupt_manifest_cannot_be_read_rather_than_missing(
        run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corrupt = tmp_path / "corrupt"
    shutil.copytree(run, corrupt)
    (corrupt / "manifest.json").write_text('{"model": ')
    assert main(["compare", str(run), str(corrupt)]) == 0
    err = capsys.readouterr().err
    assert "after's manifest.json cannot be read as a manifest: what it ran is not known" in err
    assert "no manifest.json" not in err
    (corrupt / "manifest.json").unlink()
    assert main(["compare", str(run), str(corrupt)]) == 0
    assert "after has no manifest.json" in capsys.readouterr().err


# ---------------------------------------------------------------- checks not applied


def test_checks_with_nothing_to_regress_from_are_not_said_to_pass(
        run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    killed = tmp_path / "killed"
    killed.mkdir()
    manifest = json.loads((run / "manifest.json").read_text())
    (killed / "manifest.json").write_text(json.dumps({**manifest, "status": "running"}))
    report = tmp_path / "cmp.json"
    assert main(["compare", str(killed), str(run), "--fail-if", "ttft_s.p90=10",
                 "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "check not applied: killed vs continuous: ttft_s.p90 has nothing to regress from: " \
           "before has no summary (running" in out
    assert "\nchecks: none applied (1 check on 1 pair: nothing to regress from)\n" in out
    # a job reading the JSON sees it too: a pass only for want of a baseline
    record = json.loads(report.read_text())
    assert record["failed_checks"] == []
    [unapplied] = record["unapplied_checks"]
    assert unapplied["metric"] == "ttft_s.p90" and unapplied["max_worse_pct"] == 10
    assert unapplied["reason"].startswith("has nothing to regress from: before has no summary")
    # no SLO on either side: no goodput to regress from, the rest checked
    assert main(["compare", str(run), str(run), "--fail-if", "goodput.slo_attainment=1",
                 "--fail-if", "ttft_s.p90=10"]) == 0
    out = capsys.readouterr().out
    assert ("check not applied: continuous: goodput.slo_attainment has nothing to regress "
            "from: no value before (no SLO)") in out
    assert "checks: passed (2 checks on 1 pair; 1 of 2 not applied: nothing to regress from)" \
        in out
    assert main(["compare", str(run), str(run), "--fail-if", "ttft_s.p90=10"]) == 0
    out = capsys.readouterr().out
    assert "checks: passed (1 check on 1 pair)" in out and "not applied" not in out


# ---------------------------------------------------------------- words


def test_a_file_given_for_a_folder_is_said_to_be_a_file(
        run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(run), str(run / "summary.json")]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'summary.json'}: a file, not a run folder or scenario folder" in err


def test_one_request_in_flight_or_never_sent_is_singular(tmp_path: Path) -> None:
    summary = {"num_requests": 3, "num_completed": 2, "num_failed": 1,
               "failures": {"not_finished": 1}, "num_sent_unrecorded": 0}
    killed = CellResult("run", tmp_path, "done", summary=summary,
                        manifest={"status": "running", "num_not_sent": 1})
    assert killed.ended_early == ("killed while it ran (its manifest still says running), "
                                  "with 1 request in flight (rows as not_finished); 1 request "
                                  "of the trace was never sent")
