"""What a capacity search answers when no load passed: the trace too short to tell at the
lowest load, or an SLO no load meets; what an interrupted scenario search lists; the GPU a
row records."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

import harness.capacity.run as capacity_run
from harness.capacity import SEARCH_FILE, ProbeOutcome
from harness.cli import main as cli_main

TRACE = str(Path(__file__).resolve().parents[3] / "harness" / "data" / "azure_conv_excerpt.csv")
# a scenario of two settings (two batch caps) on 40 requests of the trace
TWO_CAPS = ("name: tiny\nquestion: which cap serves more?\n"
            f"trace: {{path: {TRACE}, limit: 40}}\n"
            "model: llama-3.1-8b\ngpu: h100-sxm\nslo: {ttft_s: 1.0}\n"
            "engines:\n  - {name: fcfs, engine: reference, knobs: {policy: fcfs}}\n"
            "grid:\n  max_num_seqs: [4, 8]\n")


def _key_finding(report: str) -> str:
    return next(line for line in report.split("## Key findings")[1].splitlines()
                if line.startswith("- Capacity at SLO"))


def test_a_lowest_load_failed_only_as_too_short_a_trace_is_not_known(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The engine met the SLO at the lowest load, and the trace was too short to show a
    steady state there: the trace, not the engine, ended the search. No upper bound
    ("< 2 req/s") is given: the capacity is not known."""
    out = tmp_path / "cap"
    assert cli_main(["capacity", "--trace", TRACE, "--limit", "5", "--slo",
                     "ttft_s=0.5,tpot_s=0.03", "--min-load", "2", "--start", "2",
                     "--out", str(out)]) == 0
    said = capsys.readouterr()
    row = json.loads((out / "capacity.json").read_text())["settings"][0]
    assert row["status"] == "trace_too_short" and row["capacity"] is None
    assert row["answer"].startswith("not known: the engine met the SLO at the lowest load "
                                    "tried, 2 req/s (SLO attainment 100%)")
    search = json.loads((out / "reference" / SEARCH_FILE).read_text())
    assert search["status"] == "trace_too_short" and search["answer"] == row["answer"]
    assert f"reference: {row['answer']}" in said.err
    assert "< 2" not in said.out
    report = (out / "report.md").read_text()
    finding = _key_finding(report)
    assert f"`reference`: {row['answer']}" in finding and "< 2 req/s" not in finding


def test_an_slo_no_load_meets_is_said_so_not_a_bound(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A TTFT SLO of 1 ms, which even an idle engine misses: every load fails on SLO
    attainment down to the lowest, and the answer says the SLO is not met there, with the
    probe's attainment and median TTFT, rather than "< 0.5 req/s"."""
    out = tmp_path / "cap"
    assert cli_main(["capacity", "--trace", TRACE, "--limit", "40", "--slo", "ttft_s=0.001",
                     "--min-load", "0.5", "--start", "0.5", "--out", str(out)]) == 0
    said = capsys.readouterr()
    row = json.loads((out / "capacity.json").read_text())["settings"][0]
    assert row["status"] == "below_min" and row["capacity"] is None
    assert row["gpu"] == "h100-sxm"  # no --gpu: the default that took effect, as its probes ran
    answer = row["answer"]
    assert answer.startswith("the SLO is not met even at the lowest load tried, 0.5 req/s: "
                             "SLO attainment 0%, under the 99.0% target (TTFT p50 ")
    assert answer.endswith(" against 1 ms)")
    search = json.loads((out / "reference" / SEARCH_FILE).read_text())
    assert search["answer"] == answer
    assert f"reference: {answer}" in said.err
    # the table says it too, with no capacity, not "< 0.5"
    table = next(line for line in said.out.splitlines() if line.startswith("reference "))
    assert table.split()[1] == "–" and table.endswith(f"below_min: {answer}")
    assert "< 0.5" not in said.out
    report = (out / "report.md").read_text()
    assert f"`reference`: {answer}" in _key_finding(report)
    assert "< 0.5 req/s" not in report


def test_an_slo_a_single_user_misses_is_said_so(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    assert cli_main(["capacity", "--trace", TRACE, "--limit", "40", "--search", "concurrency",
                     "--start", "1", "--slo", "tpot_s=0.001", "--out", str(out)]) == 0
    row = json.loads((out / "capacity.json").read_text())["settings"][0]
    assert row["status"] == "below_min"
    assert row["answer"].startswith("the SLO is not met even by a single user: SLO "
                                    "attainment 0%")
    assert "TPOT p50 " in row["answer"]
    report = (out / "report.md").read_text()
    assert f"`reference`: {row['answer']}" in _key_finding(report)
    assert "< 1 user" not in report


def test_a_lowest_load_that_fell_behind_stays_an_upper_bound() -> None:
    """Falling behind at the lowest load is no proof that no load meets the SLO: no
    ``answer``, the "<" bound stands."""
    from harness.capacity.search import SearchResult

    probe = ProbeOutcome(load=1.0, attainment=1.0, passed=False, behind="fell behind: ...")
    result = SearchResult("below_min", None, None, 1.0, (probe,))
    plan = SimpleNamespace(target=0.99)  # only the target is read
    assert capacity_run._trace_bound(result, 0.99).status == "below_min"
    assert capacity_run.result_answer(result, plan, "rate", Path(".")) is None  # type: ignore[arg-type]


def test_settings_not_started_stay_listed_after_ctrl_c(
        tmp_path: Path, ctrl_c_on_probe: Callable[[int], list[object]]) -> None:
    """Ctrl-C on the first setting's second probe: the second setting, not started, stays
    in capacity.json as not searched, as it was listed while the search ran."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(TWO_CAPS)
    ctrl_c_on_probe(2)
    out = tmp_path / "out"
    assert cli_main(["capacity", str(scenario), "--start", "1", "--out", str(out)]) == 130
    summary = json.loads((out / "capacity.json").read_text())
    assert summary["status"] == "interrupted"
    rows = {r["setting"]: r for r in summary["settings"]}
    assert list(rows) == ["fcfs__max_num_seqs-4", "fcfs__max_num_seqs-8"]
    first, second = rows.values()
    assert (first["status"], first["num_probes"]) == ("interrupted", 1)
    assert (second["status"], second["num_probes"]) == ("interrupted", 0)
    assert second["error"] == "not searched: interrupted before it started"
    # the report says so: without it, a reader would take the first setting for the search
    assert cli_main(["report", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert ("Setting folders here without a row in this table: `fcfs__max_num_seqs-8/`: not "
            "searched: interrupted before it started.") in report
    assert _key_finding(report).endswith(
        "1 more setting folder here has no capacity in this report (not searched, or left "
        "out: the Capacity at SLO section says why).")


def test_a_setting_left_out_as_changed_is_named_in_the_report(tmp_path: Path) -> None:
    """The scenario's engine changed, and only one setting was searched again (--only): the
    other's earlier search answers another question and is not listed; capacity.json said so,
    the report now does too (it showed one setting without a word on the other)."""
    scenario = tmp_path / "s.yaml"
    text = TWO_CAPS
    scenario.write_text(text)
    out = tmp_path / "out"
    search = ["capacity", str(scenario), "--start", "1", "--max-load", "2", "--out", str(out)]
    assert cli_main(search) == 0
    scenario.write_text(text.replace("policy: fcfs}",
                                     "policy: fcfs, max_num_batched_tokens: 4096}"))
    assert cli_main([*search, "--only", "*seqs-4", "--overwrite"]) == 0
    report = (out / "report.md").read_text()
    assert ("`fcfs__max_num_seqs-8/`: its search in this folder was made with other settings "
            "(changed: the scenario cell") in report
    assert "1 more setting folder here has no capacity in this report" in _key_finding(report)
    # a search whose every setting has its row says nothing of the kind
    assert cli_main([*search[:-2], "--out", str(tmp_path / "whole")]) == 0
    whole = (tmp_path / "whole" / "report.md").read_text()
    assert "without a row" not in whole and "no capacity in this report" not in whole
    # the grid shrunk: the setting folder it no longer has is named, not passed over
    scenario.write_text(scenario.read_text().replace("[4, 8]", "[4]"))
    assert cli_main([*search[:-2], "--out", str(tmp_path / "whole"), "--resume"]) == 0
    shrunk = json.loads((tmp_path / "whole" / "capacity.json").read_text())
    assert [r["setting"] for r in shrunk["settings"]] == ["fcfs__max_num_seqs-4"]
    assert shrunk["left_out"] == [{"setting": "fcfs__max_num_seqs-8", "why": (
        "not a setting of this search now (an earlier search's, kept in the folder: remove "
        "it, or search it again where it is a setting)")}]
    assert "`fcfs__max_num_seqs-8/`: not a setting of this search now" in (
        tmp_path / "whole" / "report.md").read_text()


def test_a_failed_setting_stays_in_the_report_with_why(tmp_path: Path) -> None:
    """A setting whose search failed (requests refused at any load: its KV cache too small)
    is in the report, as its failed probe with the reason and as a capacity row saying the
    search failed; it does not become the baseline, which stays the first setting that
    measured something."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: mixed\nquestion: does a failed setting stay in the report?\n"
        f"trace: {{path: {TRACE}, limit: 100}}\n"
        "model: llama-3.1-8b\ngpu: h100-sxm\nslo: {ttft_s: 0.5, tpot_s: 0.03}\n"
        "engines:\n"
        "  - {name: tiny, engine: reference, knobs: {max_num_seqs: 64}, num_gpu_blocks: 60}\n"
        "  - {name: big, engine: reference, knobs: {max_num_seqs: 64}}\n")
    out = tmp_path / "out"
    assert cli_main(["capacity", str(scenario), "--max-load", "2", "--out", str(out)]) == 1
    search = json.loads((out / "tiny" / SEARCH_FILE).read_text())
    assert search["status"] == "failed" and search["failed_probe"] == "rate-1"
    report = (out / "report.md").read_text()
    why = "requests are refused at any load (they can never fit the KV cache)"
    assert f"- `tiny/rate-1` did not finish: 36 of 100 {why}" in report
    row = next(line for line in report.splitlines() if line.startswith("| `tiny` |"))
    assert f"search failed: 36 of 100 {why}" in row and "NothingServed" not in row
    assert "| Baseline | `big` at each load |" in report
