"""Goodput computed under different SLOs is never ranked, interpolated or rounded into a
finding: ``batchlab summarize DIR --slo ...`` recomputes one run's goodput under another SLO
(its summary's ``slo`` changes, the manifest keeps the run's), and a report or comparison that
reads that run beside others must not read the looser SLO as a better engine."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from harness import report
from harness import scenario as sc
from harness.cli import main
from harness.compare import metric_named
from harness.report.curves import (
    CapacityRow,
    CurvePoint,
    Series,
    capacity_ratio,
    capacity_rows,
    interpolated_capacity,
)
from harness.report.findings import tuning_findings

REPO = Path(__file__).resolve().parents[2]
TRACE = str(REPO / "harness" / "data" / "azure_conv_excerpt.csv")
STRICT = {"ttft_s": 0.3, "tpot_s": 0.02}
LOOSE = {"ttft_s": 100.0, "tpot_s": 1.0}
LOOSE_ARG = "ttft_s=100,tpot_s=1"

# 40 requests at 33x their recorded rate: max_num_seqs 4 queues, 64 does not, so the cells'
# goodput under the strict SLO differs, and loosening one cell's SLO lifts it to the top.
GRID = """\
name: mix
question: Which max_num_seqs / max_num_batched_tokens pair serves the most within the SLO?
trace: {path: azure_conv_excerpt.csv, limit: 40, time_scale: 0.03}
model: llama-3.1-8b
gpu: h100-sxm
slo: {ttft_s: 0.3, tpot_s: 0.02}
engines:
  - name: fcfs
    engine: reference
    knobs: {policy: fcfs, chunked_prefill: true, max_model_len: 8192}
grid:
  max_num_seqs: [4, 64]
  max_num_batched_tokens: [2048, 8192]
"""
# Two settings at two rates: the small cap misses the strict SLO at 20 req/s.
RATES = """\
name: rates
question: How much load fits the SLO?
trace: {path: azure_conv_excerpt.csv, limit: 40}
model: llama-3.1-8b
gpu: h100-sxm
slo: {ttft_s: 0.3, tpot_s: 0.02}
load: {rates: [1, 20]}
engines:
  - name: small
    engine: reference
    knobs: {policy: fcfs, max_num_seqs: 4, max_model_len: 8192}
  - name: big
    engine: reference
    knobs: {policy: fcfs, max_num_seqs: 64, max_model_len: 8192}
"""


def run(root: Path, text: str, name: str) -> Path:
    path = root / f"{name}.yaml"
    path.write_text(text)
    scenario = sc.load_scenario(path)
    progress = sc.SweepProgress(len(scenario.cells()), stream=io.StringIO(), tty=False)
    result = sc.run_scenario(scenario, root / "out", progress=progress, write_report=False)
    assert {o.state for o in result.outcomes} == {"done"}
    return root / "out" / name


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run(tmp_path_factory.mktemp("grid"), GRID, "mix")


@pytest.fixture(scope="module")
def rates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run(tmp_path_factory.mktemp("rates"), RATES, "rates")


def findings(report_md: Path) -> str:
    return report_md.read_text().split("## Key findings")[1].split("\n## ")[0]


def goodput(cell: Path) -> float:
    return float(json.loads((cell / "summary.json").read_text())["goodput"]["requests_per_s"])


# ---------------------------------------------------------------- the mixed-traffic finding


@pytest.fixture
def loosened_grid(grid: Path, tmp_path: Path) -> Path:
    """The grid with one cell that led nothing under the strict SLO resummarised under a loose
    one, where its goodput is the highest."""
    copy = tmp_path / "mix"
    shutil.copytree(grid, copy)
    loose = copy / "fcfs__max_num_seqs-64__max_num_batched_tokens-8192"
    strict_best = max(goodput(c) for c in copy.iterdir() if (c / "summary.json").exists())
    assert main(["summarize", str(loose), "--slo", LOOSE_ARG]) == 0
    assert goodput(loose) > strict_best  # loosened, it would lead the ranking
    return copy


def test_a_loosened_cell_is_left_out_of_the_best_pair(loosened_grid: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(loosened_grid)]) == 0
    capsys.readouterr()
    lines = [line for line in findings(loosened_grid / "report.md").splitlines()
             if line.startswith("- Mixed traffic")]
    assert len(lines) == 1
    mixed = lines[0]
    best = mixed.split("; next best")[0]
    assert ("the max_num_seqs / max_num_batched_tokens pair with the best goodput under "
            "TTFT ≤ 300 ms, TPOT ≤ 20 ms is 64 / 2,048 "
            "(`fcfs__max_num_seqs-64__max_num_batched_tokens-2048`") in best
    assert mixed.endswith(
        "Left out, its goodput computed under another SLO: "
        "`fcfs__max_num_seqs-64__max_num_batched_tokens-8192` (TTFT ≤ 100 s, TPOT ≤ 1 s); "
        "`batchlab summarize DIR --slo ...` recomputes it.")
    ranked = mixed.split(" Left out")[0]
    assert "`fcfs__max_num_seqs-64__max_num_batched_tokens-8192`" not in ranked


def _cell(name: str, seqs: int, tokens: int, good: float,
          slo: dict[str, float] | None) -> report.CellResult:
    summary = {"goodput": {"requests_per_s": good, "slo_attainment": good / 4},
               "tpot_s": {"p90": 0.01}, "throughput": {"output_tokens_per_s": 100}}
    if slo is not None:
        summary["slo"] = slo
    return report.CellResult(name=name, run_dir=Path("."), state="done", summary=summary,
                             cell={"knobs": {"max_num_seqs": seqs,
                                             "max_num_batched_tokens": tokens}})


def test_the_reports_slo_is_the_one_ranked_and_one_cell_is_no_ranking() -> None:
    # the report's SLO (given) is kept even when the first cell is under another one
    cells = [_cell("loose", 32, 2048, 9.0, LOOSE), _cell("a", 32, 8192, 3.6, STRICT),
             _cell("b", 128, 2048, 3.1, STRICT)]
    mixed = [x for x in tuning_findings(cells, STRICT) if x.startswith("Mixed traffic")]
    assert len(mixed) == 1
    assert "best goodput under TTFT ≤ 300 ms, TPOT ≤ 20 ms is 32 / 8,192 (`a`" in mixed[0]
    assert "next best 128 / 2,048 (`b`" in mixed[0]
    assert "Left out, its goodput computed under another SLO: `loose` (TTFT ≤ 100 s" in mixed[0]
    # under one SLO (or none recorded) nothing is left out and the sentence is as it was
    same = [_cell("a", 32, 8192, 3.6, STRICT), _cell("b", 128, 2048, 3.1, STRICT)]
    mixed = [x for x in tuning_findings(same, STRICT) if x.startswith("Mixed traffic")]
    assert mixed and "Left out" not in mixed[0] and "best goodput is 32 / 8,192" in mixed[0]
    # a single cell under the report's SLO: nothing to rank it against
    alone = [_cell("loose", 32, 2048, 9.0, LOOSE), _cell("a", 32, 8192, 3.6, STRICT),
             _cell("loose2", 128, 2048, 8.0, LOOSE)]
    assert not [x for x in tuning_findings(alone, STRICT) if x.startswith("Mixed traffic")]


# ---------------------------------------------------------------- capacity at SLO


def _pt(load: float, att: float, slo: dict[str, float] | None) -> CurvePoint:
    return CurvePoint(f"c{load:g}", load, None, None, None, None, att, slo=slo)


def test_no_capacity_is_interpolated_between_points_under_two_slos() -> None:
    s = Series("x", "rate", (_pt(1, 1.0, STRICT), _pt(2, 0.995, LOOSE), _pt(4, 0.9, STRICT)))
    row = interpolated_capacity(s, 0.99)
    assert row.capacity is None and row.source == "interpolated"
    assert row.evidence == (
        "not interpolated: its load points' goodput was computed under different SLOs "
        "(TTFT ≤ 300 ms, TPOT ≤ 20 ms at 1, 4; TTFT ≤ 100 s, TPOT ≤ 1 s at 2); "
        "`batchlab summarize DIR --slo ...` recomputes one")
    assert row.cells == ("c1", "c2", "c4")
    assert row.note == "its load points' goodput computed under different SLOs"
    # under one SLO, the same points interpolate, and the row keeps the SLO it was judged under
    one = interpolated_capacity(Series("x", "rate", tuple(
        _pt(p.load, p.attainment or 0.0, STRICT) for p in s.points)), 0.99)
    assert one.capacity == pytest.approx(2 + 0.005 / 0.095 * 2) and one.slo == STRICT


def test_capacities_under_two_slos_are_not_set_against_each_other() -> None:
    strict = Series("strict", "rate", (_pt(1, 1.0, STRICT), _pt(4, 0.5, STRICT)))
    loose = Series("loose", "rate", (_pt(1, 1.0, LOOSE), _pt(4, 0.9, LOOSE)))
    a, b = capacity_rows([strict, loose], [], 0.99)
    assert a.capacity is not None and b.capacity is not None
    assert capacity_ratio(b, a) is None and capacity_ratio(a, b) is None
    assert a.evidence.endswith("; under TTFT ≤ 300 ms, TPOT ≤ 20 ms")
    assert b.evidence.endswith("; under TTFT ≤ 100 s, TPOT ≤ 1 s")
    # under one SLO: a ratio, and no SLO in the evidence
    same = Series("same", "rate", (_pt(1, 1.0, STRICT), _pt(4, 0.9, STRICT)))
    c, d = capacity_rows([strict, same], [], 0.99)
    assert capacity_ratio(d, c) is not None and "under" not in c.evidence + d.evidence
    row = CapacityRow("x", "rate", 2.0, "=", "interpolated", "e", slo=STRICT)
    assert capacity_ratio(row, CapacityRow("y", "rate", 1.0, "=", "interpolated", "e",
                                           slo=dict(STRICT))) == "2.00×"


def test_a_report_says_why_a_capacity_was_not_interpolated(
        rates: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "rates"
    shutil.copytree(rates, copy)
    assert main(["report", str(copy)]) == 0
    before = (copy / "report.md").read_text()
    assert "`small` 1." in findings(copy / "report.md")  # interpolated between 1 and 20 req/s
    assert "| `small` | 1." in before
    assert main(["summarize", str(copy / "small__rate-20"), "--slo", LOOSE_ARG]) == 0
    assert main(["report", str(copy)]) == 0
    capsys.readouterr()
    text = (copy / "report.md").read_text()
    table = text.split("## Capacity at SLO")[1].split("\n## ")[0]
    assert ("| `small` | – | baseline | interpolated | not interpolated: its load points' goodput "
            "was computed under different SLOs (TTFT ≤ 300 ms, TPOT ≤ 20 ms at 1; TTFT ≤ 100 s, "
            "TPOT ≤ 1 s at 20); `batchlab summarize DIR --slo ...` recomputes one; "
            "`small__rate-1`, `small__rate-20` |") in table
    assert ("`small` not known (its load points' goodput computed under different SLOs; "
            "baseline)") in findings(copy / "report.md")
    curves = text.split("## Throughput–latency curves")[1].split("\n## ")[0]
    assert "under TTFT ≤ 100 s, TPOT ≤ 1 s |" in curves  # each point's own SLO
    assert "under TTFT ≤ 300 ms, TPOT ≤ 20 ms |" in curves


# ---------------------------------------------------------------- compare: attainment is cut


def test_compare_writes_attainment_cut_not_rounded(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    m = metric_named("goodput.slo_attainment")
    assert m.text(0.98951) == "98.9%"  # not 99.0%, beside a 99% target it missed
    assert m.text(2999 / 3000) == "99.96%"  # not 100.0%: one request missed
    assert m.text(1.0) == "100%" and m.text(None) == "–"
    assert metric_named("ttft_s.p90").text(0.25) == "250 ms"

    run = tmp_path / "run"
    assert main(["simulate", "--trace", TRACE, "--limit", "40", "--no-report", "--slo",
                 "ttft_s=0.5,tpot_s=0.05", "--out", str(run)]) == 0
    sides = {}
    for side, attainment in (("before", 2999 / 3000), ("after", 0.98951)):
        sides[side] = tmp_path / side
        shutil.copytree(run, sides[side])
        summary_path = sides[side] / "summary.json"
        summary = json.loads(summary_path.read_text())
        summary["goodput"]["slo_attainment"] = attainment
        summary_path.write_text(json.dumps(summary))
    capsys.readouterr()
    assert main(["compare", str(sides["before"]), str(sides["after"]),
                 "--fail-if", "goodput.slo_attainment=0.5"]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "goodput.slo_attainment" in line
               and not line.startswith("check failed"))
    # -1.016%: beyond the 1% "same" tolerance, and written so (not "-1.0%")
    assert row.split("goodput.slo_attainment")[1].split()[:4] == ["99.96%", "98.9%", "-1.02%",
                                                                "worse"]
    assert "goodput.slo_attainment worse by 1.02% (99.96% -> 98.9%; limit 0.5%)" in out
    assert "99.0%" not in out and "100.0%" not in out


# ---------------------------------------------------------------- the documented exit status


def test_the_exit_status_tables_name_a_check_on_goodput_under_two_slos() -> None:
    readme = (REPO / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `compare` |"))
    failing = row.split(" | ")[2]
    assert "goodput computed under different SLOs" in failing
    docs = (REPO / "docs" / "compare.md").read_text()
    exit_one = next(line for line in docs.splitlines() if line.startswith("| 1 |"))
    assert "goodput computed under different SLOs" in exit_one
    assert "the metric is goodput and the two runs' goodput was computed under different " \
        "SLOs" in docs
