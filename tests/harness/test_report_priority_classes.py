"""The per-priority-class section says what a class's numbers are: how many of its requests
failed, under which SLO each cell's attainment was counted, and a scenario's class names only
where the scenario's classes were drawn (a trace with its own priorities keeps them)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from harness.cli import main
from harness.scenario import load_scenario
from harness.scenario.expand import load_cell_trace
from harness.scenario.schema import LoadPoint

MODEL = ["--model", "llama-3.1-8b", "--gpu", "h100-sxm"]


def _section(report: Path) -> str:
    return report.read_text().split("## Per priority class\n", 1)[1].split("\n## ", 1)[0]


def _class_rows(section: str, title: str) -> list[list[str]]:
    """The table rows (cells split, header and rule left out) under ``### Class TITLE``."""
    block = section.split(f"### Class {title}\n", 1)[1].split("\n### ", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in block.splitlines() if line.startswith("|")]
    return rows[2:]


def _priority_trace(tmp_path: Path) -> Path:
    """Ten requests in classes 1 and 3 (and none); the two of class 3 need more KV blocks
    than a 64-block cache has, so the engine rejects them."""
    path = tmp_path / "prio.csv"
    path.write_text(textwrap.dedent("""\
        arrived_at,num_prefill_tokens,num_decode_tokens,priority
        0.00,100,4,1
        0.01,100,30,1
        0.02,1400,5,3
        0.03,100,30,
        0.04,100,4,1
        0.05,1400,2,3
        0.06,200,40,1
        0.07,100,4,
        0.08,300,20,1
        0.09,100,10,1
        """))
    return path


def test_a_class_row_counts_its_failed_requests(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main(["simulate", "--trace", str(_priority_trace(tmp_path)), *MODEL,
                 "--policy", "priority", "--max-num-seqs", "2", "--num-gpu-blocks", "64",
                 "--out", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["by_priority"]["3"]["num_failed"] == 2  # rejected: too long for the cache
    section = _section(run / "report.md")
    assert "a request with no priority is in class 0" in section
    header = section.split("### Class priority 3\n", 1)[1].splitlines()[1]
    assert header.startswith("| cell | requests | failed |")
    [row] = _class_rows(section, "priority 3")
    assert row[1:3] == ["2", "2"]
    [row] = _class_rows(section, "priority 1")
    assert row[1:3] == ["6", "0"]


def test_attainment_under_different_slos_gives_each_cells_slo(tmp_path: Path) -> None:
    trace = ["--trace", str(_priority_trace(tmp_path)), *MODEL, "--policy", "priority",
             "--max-num-seqs", "2", "--num-gpu-blocks", "64", "--slo", "ttft_s=0.05"]
    assert main(["simulate", *trace, "--out", str(tmp_path / "a")]) == 0
    assert main(["simulate", *trace, "--out", str(tmp_path / "b")]) == 0
    assert main(["summarize", str(tmp_path / "b"), "--slo", "ttft_s=1.5"]) == 0
    out = tmp_path / "cmp" / "report.md"
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(out)]) == 0
    section = _section(out)
    assert "under its own SLO (the SLO column)" in section
    rows = {row[0].strip("`"): row for row in _class_rows(section, "priority 1")}
    assert rows["a"][-1] == "TTFT ≤ 50 ms" and rows["b"][-1] == "TTFT ≤ 1.5 s"
    # one run, one SLO: no such column
    one = _section(tmp_path / "a" / "report.md")
    assert "under its own SLO" not in one
    assert _class_rows(one, "priority 1")[0][-1] != "TTFT ≤ 50 ms"


def _scenario(tmp_path: Path, trace: Path) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: classes
        question: do the scenario's class names reach the report?
        trace: {{path: {trace}}}
        model: llama-3.1-8b
        gpu: h100-sxm
        priority_classes:
          - {{name: interactive, share: 0.2, priority: 1}}
          - {{name: batch, share: 0.8, priority: 3}}
        engines:
          - {{name: prio, engine: reference, num_gpu_blocks: 64,
             knobs: {{policy: priority, max_num_seqs: 2}}}}
        """))
    return path


def test_a_trace_with_its_own_priorities_gets_no_scenario_class_names(tmp_path: Path) -> None:
    trace = _priority_trace(tmp_path)
    scenario = load_scenario(_scenario(tmp_path, trace))
    loaded = load_cell_trace(scenario, LoadPoint())
    assert [r.priority for r in loaded.requests][:3] == [1, 1, 3]  # the trace's, not drawn
    assert ("the scenario's priority_classes were not drawn: the requests' priorities are "
            "the trace's own (its priority column)" in loaded.notes)
    out = tmp_path / "out"
    assert main(["run", str(_scenario(tmp_path, trace)), "--out", str(out)]) == 0
    [folder] = [p for p in out.iterdir() if p.is_dir()]
    section = _section(folder / "report.md")
    assert ("The scenario's `priority_classes` were not drawn: the requests' priorities are "
            "the trace's own (its priority column)") in section
    assert "interactive" not in section and "batch" not in section.replace("batches", "")
    assert "### Class priority 1" in section and "### Class priority 3" in section


def test_drawn_classes_keep_their_names(tmp_path: Path) -> None:
    plain = tmp_path / "plain.csv"
    plain.write_text("".join(line.rsplit(",", 1)[0] + "\n"
                             for line in _priority_trace(tmp_path).read_text().splitlines()))
    out = tmp_path / "out"
    assert main(["run", str(_scenario(tmp_path, plain)), "--out", str(out)]) == 0
    [folder] = [p for p in out.iterdir() if p.is_dir()]
    section = _section(folder / "report.md")
    assert "were not drawn" not in section
    assert "### Class interactive (priority 1)" in section
    assert "### Class batch (priority 3)" in section


def test_priorities_drawn_by_a_fraction_are_said_to_be_so(tmp_path: Path) -> None:
    """Not "taken from the trace": a trace without a priority column given priority_fraction
    has priorities before the scenario's classes could be drawn."""
    plain = tmp_path / "plain.csv"
    plain.write_text("".join(line.rsplit(",", 1)[0] + "\n"
                             for line in _priority_trace(tmp_path).read_text().splitlines()))
    text = _scenario(tmp_path, plain).read_text().replace(
        f"trace: {{path: {plain}}}", f"trace: {{path: {plain}, priority_fraction: 0.3}}")
    (tmp_path / "s.yaml").write_text(text)
    loaded = load_cell_trace(load_scenario(tmp_path / "s.yaml"), LoadPoint())
    assert ("the scenario's priority_classes were not drawn: the requests' priorities are "
            "drawn by its `priority_fraction`") in loaded.notes
    assert not any("priority column" in n for n in loaded.notes)
