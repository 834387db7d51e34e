"""A cell stopped early (a capacity probe its overload check cut short) has figures of part of
its trace, its latencies of the requests that finished only: every table marks them as the
lower bound they are, as the curve table does, and no change is given against them, nor for
them, in the tables or the key findings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.report.context import ReportContext
from harness.report.render import render_markdown
from harness.report.runs import CellResult

SLO = {"tpot_s": 0.02}


def _summary(latency_s: float, tokens_per_s: float, attainment: float, *,
             cut_off: int = 0) -> dict[str, Any]:
    """A run's summary: every latency percentile ``latency_s`` (p90 twice it), ``cut_off``
    requests cut off in flight by an early stop when not 0."""
    def latency(scale: float) -> dict[str, float]:
        value = latency_s * scale
        return {"count": 100, "p50": value, "p90": 2 * value, "p99": 3 * value,
                "mean": value, "max": 4 * value}

    num_requests = 100 + cut_off
    summary: dict[str, Any] = {
        "num_requests": num_requests, "num_completed": 100, "num_failed": cut_off,
        "duration_s": 30.0, "slo": SLO,
        "ttft_s": latency(1.0), "tpot_s": latency(0.01), "itl_s": latency(0.01),
        "e2e_s": latency(2.0),
        "throughput": {"requests_per_s": 3.0, "input_tokens_per_s": tokens_per_s * 3,
                       "output_tokens_per_s": tokens_per_s,
                       "total_tokens_per_s": tokens_per_s * 4},
        "goodput": {"num_good": round(attainment * num_requests),
                    "requests_per_s": 3.0 * attainment, "slo_attainment": attainment},
        "failures": {"not_finished": cut_off} if cut_off else {},
        "num_preemptions": 0,
    }
    if cut_off:
        summary["stopped_early"] = ("over-saturated: the engine's waiting queue grew at each "
                                    "of 5 checks in a row")
    return summary


def _cell(tmp_path: Path, seqs: int, rate: float, summary: dict[str, Any]) -> CellResult:
    name = f"fcfs__max_num_seqs-{seqs}/rate-{rate:g}"
    run_dir = tmp_path / name
    run_dir.mkdir(parents=True)
    return CellResult(
        name=name, run_dir=run_dir, state="done", summary=summary,
        manifest={"kind": "simulated", "slo": SLO},
        cell={"engine": {"name": "fcfs", "engine": "reference"},
              "grid": {"max_num_seqs": seqs}, "knobs": {"max_num_seqs": seqs},
              "load": {"kind": "rate", "value": rate}})


def _capacity_cells(tmp_path: Path) -> list[CellResult]:
    """Two settings at 4 and 8 req/s; the baseline setting's 8 req/s probe stopped early,
    its latencies low because it cut off the requests that waited longest."""
    return [
        _cell(tmp_path, 16, 4, _summary(0.3, 1000.0, 0.99)),
        _cell(tmp_path, 16, 8, _summary(1.0, 900.0, 0.70, cut_off=57)),
        _cell(tmp_path, 64, 4, _summary(0.05, 1000.0, 0.99)),
        _cell(tmp_path, 64, 8, _summary(1.01, 1970.0, 0.99)),
    ]


def _render(cells: list[CellResult], tmp_path: Path) -> str:
    ctx = ReportContext(title="Capacity", slo=SLO)
    return render_markdown(cells, ctx, tmp_path, draw=False)


def _section(text: str, title: str) -> str:
    return text.split(f"\n{title}\n", 1)[1].split("\n## ", 1)[0]


def _row(section: str, cell: str) -> list[str]:
    """The cells of ``cell``'s row of the first table in ``section``."""
    line = next(line for line in section.splitlines() if line.startswith(f"| `{cell}` |"))
    return [part.strip() for part in line.strip("|").split("|")][1:]


def test_every_latency_table_marks_a_stopped_cell_as_a_lower_bound(tmp_path: Path) -> None:
    """Issue case: the curve table read `≥ 2 s` where the TTFT table read `2 s`."""
    text = _render(_capacity_cells(tmp_path), tmp_path)
    curves = _section(text, "## Throughput–latency curves")
    assert "≥ 2 s" in curves  # TTFT p90 of the stopped point, as the curve table had it
    for title, p90 in (("### TTFT", "≥ 2 s"), ("### TPOT", "≥ 20 ms"),
                       ("### ITL", "≥ 20 ms"), ("### E2E latency", "≥ 4 s")):
        row = _row(_section(text, title), "fcfs__max_num_seqs-16/rate-8")
        assert row[1] == p90, (title, row)
        assert all(v.startswith("≥ ") for v in row), (title, row)  # p50, p99 and mean too
        # a whole run's figures are no bound
        assert not any("≥" in v for v in _row(_section(text, title),
                                             "fcfs__max_num_seqs-16/rate-4"))
    assert ("Stopped early: `fcfs__max_num_seqs-16/rate-8` cut off 57 requests: its "
            "percentiles are of the requests that finished only, a lower bound "
            "(docs/metrics.md), and so is its mean: each marked ≥, here and in the tables "
            "below.") in _section(text, "## Latency")


def test_no_change_is_given_against_a_stopped_cell_nor_for_one(tmp_path: Path) -> None:
    """Issue case: the other setting at the stopped probe's load read `E2E p90 4.04 s (+1%)`
    and `+29.8 pts` against the stopped probe's partial figures."""
    text = _render(_capacity_cells(tmp_path), tmp_path)
    other = "fcfs__max_num_seqs-64/rate-8"
    for title in ("### TTFT", "### TPOT", "### ITL", "### E2E latency", "## Throughput",
                  "## Goodput and SLO attainment"):
        row = _row(_section(text, title), other)
        assert not any("(" in v for v in row), (title, row)
    # the load where both ran to their end is still compared
    assert "(" in _row(_section(text, "### TTFT"), "fcfs__max_num_seqs-64/rate-4")[1]
    assert ("Left without one: `fcfs__max_num_seqs-64/rate-8` against "
            "`fcfs__max_num_seqs-16/rate-8`, which was stopped early.") in text
    assert ("`fcfs__max_num_seqs-16/rate-8` was stopped early: its throughput is over the "
            "part of its trace it ran") in _section(text, "## Throughput")
    assert ("`fcfs__max_num_seqs-16/rate-8` was stopped early: its goodput and SLO "
            "attainment count only the requests it sent before the stop"
            ) in _section(text, "## Goodput and SLO attainment")
    findings = _section(text, "## Key findings")
    assert not any(other in line and "fcfs__max_num_seqs-16/rate-8" in line
                   for line in findings.splitlines())


def test_the_findings_crown_no_leader_on_a_stopped_cell_s_bound(tmp_path: Path) -> None:
    """At one load, three settings: the one stopped early has the lowest latencies because it
    cut off its slowest requests. No leader is named from its lower bounds, and no pair of
    settings one knob apart is compared through it."""
    cells = [_cell(tmp_path, seqs, 8, summary) for seqs, summary in (
        (16, _summary(1.0, 1000.0, 0.99)),
        (32, _summary(1.5, 1500.0, 0.99)),
        (64, _summary(0.1, 2000.0, 0.50, cut_off=80)))]
    text = _render(cells, tmp_path)
    findings = _section(text, "## Key findings")
    stopped = "fcfs__max_num_seqs-64/rate-8"
    assert f"{stopped}` was stopped early" in findings
    assert not any(stopped in line for line in findings.splitlines()
                   if "was stopped early" not in line), findings
