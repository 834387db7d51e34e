"""Reports that cannot be misread: the SLO shown is the one goodput was computed under, runs
that differ in more than the engine say so, a folder that is no run is refused, and a scenario
whose live cell cannot be planned is refused before any cell runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness import scenario as sc
from harness.cli import main

REPO = Path(__file__).resolve().parents[2]
TRACE = str(REPO / "harness" / "data" / "azure_conv_excerpt.csv")


def simulate(out: Path, *extra: str) -> None:
    assert main(["simulate", "--trace", TRACE, "--limit", "40", "--no-report",
                 "--slo", "ttft_s=0.5,tpot_s=0.05", "--out", str(out), *extra]) == 0


def test_the_slo_shown_is_the_one_goodput_was_computed_under(tmp_path: Path) -> None:
    run = tmp_path / "run"
    simulate(run)
    assert main(["summarize", str(run), "--slo", "ttft_s=1,tpot_s=0.1"]) == 0
    assert main(["report", str(run)]) == 0
    report = (run / "report.md").read_text()
    assert "| SLO | TTFT ≤ 1 s, TPOT ≤ 100 ms |" in report
    assert "TTFT ≤ 500 ms" not in report

    other = tmp_path / "other"
    simulate(other)
    assert main(["report", str(run), str(other), "-o", str(tmp_path / "cmp" / "report.md")]) == 0
    compared = (tmp_path / "cmp" / "report.md").read_text()
    assert ("Goodput and SLO attainment were computed under different SLOs: `run` under TTFT "
            "≤ 1 s, TPOT ≤ 100 ms; `other` under TTFT ≤ 500 ms, TPOT ≤ 50 ms") in compared
    # each row's goodput says under which SLO, and no change is read into the difference
    goodput = compared.split("## Goodput and SLO attainment")[1].split("\n## ")[0]
    assert "| cell | good requests | requests | goodput req/s | SLO attainment | SLO |" in goodput
    assert "| TTFT ≤ 1 s, TPOT ≤ 100 ms |" in goodput
    assert "| TTFT ≤ 500 ms, TPOT ≤ 50 ms |" in goodput
    assert " pts)" not in goodput
    findings = compared.split("## Key findings")[1].split("\n## ")[0]
    assert "SLO attainment rose" not in findings and "SLO attainment fell" not in findings
    assert "best SLO attainment" not in findings


def test_a_comparison_of_runs_on_other_models_says_so(tmp_path: Path) -> None:
    simulate(tmp_path / "small")
    simulate(tmp_path / "big", "--model", "llama-3.1-70b", "--gpu", "a100-80gb", "--tp", "4")
    assert main(["report", str(tmp_path / "small"), str(tmp_path / "big"), "-o",
                 str(tmp_path / "cmp" / "report.md")]) == 0
    report = (tmp_path / "cmp" / "report.md").read_text()
    assert ("These runs differ in model (`small`: llama-3.1-8b; `big`: llama-3.1-70b), GPU "
            "(`small`: h100-sxm; `big`: a100-80gb): their figures differ for these reasons "
            "too, not for the engine and knobs alone.") in report


def test_a_folder_that_is_no_run_is_refused(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.csv").write_text("a,b\n")
    assert main(["report", str(tmp_path)]) == 2
    assert "not a run folder or scenario folder" in capsys.readouterr().err
    assert not (tmp_path / "report.md").exists()


def test_a_knob_an_attached_server_cannot_take_is_refused_before_any_cell_runs(
        tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: s\nquestion: q\ntrace: {path: azure_conv_excerpt.csv, limit: 10}\n"
        "model: llama-3.1-8b\ngpu: h100-sxm\n"
        "engines:\n"
        "  - {name: sim, engine: reference}\n"
        "  - name: attached\n"
        "    engine: openai\n"
        "    url: http://127.0.0.1:9\n"
        "    knobs: {max_num_seqs: 8}\n")
    scenario = sc.load_scenario(path)
    with pytest.raises(sc.ScenarioError, match=r"s\.yaml:8.*attached.*allow_approximate: true"):
        sc.run_scenario(scenario, tmp_path / "out", write_report=False,
                        progress=sc.SweepProgress(2, stream=None, tty=False))
    assert not (tmp_path / "out" / "s" / "sim").exists()  # no cell ran
    summary = json.dumps(sc.read_status(tmp_path / "out" / "s" / "sim"))
    assert summary == "{}"


def test_a_figure_of_predicted_runs_says_so_itself(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A PNG copied out of its report must still say that its figures are predictions."""
    from harness.report import plots, render

    sim = tmp_path / "sim"
    simulate(sim)
    live = tmp_path / "live"
    live.mkdir()
    (live / "manifest.json").write_text(json.dumps({"engine": {"name": "vllm",
                                                               "mode": "launch"}}))
    assert render._figure_note({"sim": sim}) == ("predicted by batchlab's reference engine, "
                                                "not measured")
    assert render._figure_note({"live": live}) is None
    assert render._figure_note({"sim": sim, "live": live}) == (
        "predicted by batchlab's reference engine: sim")
    # the figure is drawn in a process of its own (harness.report.side_by_side): its note
    # comes back through a file
    notes = tmp_path / "notes.jsonl"
    real = plots.latency_cdfs

    def noted(*args: Any, **kwargs: Any) -> Path | None:
        with notes.open("a") as f:
            f.write(json.dumps(kwargs.get("note")) + "\n")
        return real(*args, **kwargs)

    monkeypatch.setattr(plots, "latency_cdfs", noted)
    assert main(["report", str(sim)]) == 0
    assert [json.loads(line) for line in notes.read_text().splitlines()] == [
        "predicted by batchlab's reference engine, not measured"]


def test_resummarising_under_another_slo_redraws_the_folders_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main(["simulate", "--trace", TRACE, "--limit", "20", "--slo", "ttft_s=0.5",
                 "--out", str(run)]) == 0
    assert "| SLO | TTFT ≤ 500 ms |" in (run / "report.md").read_text()
    capsys.readouterr()
    assert main(["summarize", str(run), "--slo", "ttft_s=0.05"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    said = f"SLO (TTFT <= 50.0 ms): {summary['goodput']['slo_attainment']:.1%} of requests met it"
    assert said in capsys.readouterr().out
    text = (run / "report.md").read_text()
    assert "| SLO | TTFT ≤ 50 ms |" in text and "500 ms |" not in text.split("## Cells")[0]


def test_a_percentage_is_never_rounded_onto_all_or_none() -> None:
    from harness.report.format import fmt_pct

    assert [fmt_pct(x) for x in (1.0, 2999 / 3000, 0.99949, 0.5, 0.0004, 0.0)] == [
        "100%", "99.96%", "99.9%", "50.0%", "0.04%", "0%"]


@pytest.mark.parametrize(("fraction", "shown"), [
    (0.98951, "98.9%"),  # rounded, it would read 99.0% beside a 99% target it missed
    (0.99, "99.0%"),  # 0.99 * 100 is 98.99999999999999
    (0.99967, "99.96%"),  # 2,999 of 3,000: never 100%
    (1.0, "100%"), (0.0, "0%"), (0.0004, "0.04%"), (0.0007, "0.07%"), (0.00099, "0.099%"),
    (0.625, "62.5%"),
    # under 0.1%: two significant digits, cut too (rounded, these would read 0.1%)
    (1 / 1001, "0.099%"), (0.0009995, "0.099%"), (0.00099999, "0.099%"), (0.001, "0.1%"),
    (0.00100001, "0.1%"), (1e-7, "0.00001%"),  # no exponent (1e-05%)
    (0.9995, "99.95%"), (0.99949999, "99.9%"),
    (1 - 2 ** -53, "99.99%"),  # the epsilon must not lift it onto 100%
])
def test_an_attainment_is_cut_never_rounded_up(fraction: float, shown: str) -> None:
    from harness.metrics import attainment_text
    from harness.report.format import fmt_attainment

    assert attainment_text(fraction) == shown == fmt_attainment(fraction)


def test_the_headline_does_not_round_an_attainment_up(capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cli.common import print_headline

    latency = {"p50": 0.01, "p99": 0.02}
    print_headline({"num_requests": 3000, "num_completed": 3000, "duration_s": 10.0,
                    "throughput": {"output_tokens_per_s": 100.0}, "ttft_s": latency,
                    "tpot_s": latency, "num_preemptions": 0, "slo": {"ttft_s": 0.5},
                    "goodput": {"slo_attainment": 2999 / 3000, "requests_per_s": 299.9}})
    assert "99.96% of requests met it" in capsys.readouterr().out


@pytest.mark.parametrize(("rate", "said"), [(1.889, "1.89"), (6.4, "6.4"), (1243.4, "1,240")])
def test_the_headline_writes_throughput_as_the_report_does(
        capsys: pytest.CaptureFixture[str], rate: float, said: str) -> None:
    """A low rate printed as a whole number (2 for 1.889) differed from summary.json and the
    report's throughput table by 6%: the headline writes it with the report's digits."""
    from harness.cli.common import print_headline
    from harness.report.format import fmt_number

    latency = {"p50": 0.01, "p99": 0.02}
    print_headline({"num_requests": 3, "num_completed": 3, "duration_s": 10.0,
                    "throughput": {"output_tokens_per_s": rate}, "ttft_s": latency,
                    "tpot_s": latency, "num_preemptions": 0})
    assert f"; {said} output tok/s;" in capsys.readouterr().out
    assert fmt_number(rate) == said
