"""A run whose server returned more tokens than asked says so in its report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from harness.cli import main
from harness.report import render_run_report

EXCERPT = Path(__file__).resolve().parents[2] / "harness" / "data" / "azure_conv_excerpt.csv"


def test_requests_over_their_target_are_a_column_and_a_finding(tmp_path: Path) -> None:
    run = tmp_path / "sim"
    assert main(["simulate", "--trace", str(EXCERPT), "--limit", "10", "--no-report",
                 "--out", str(run)]) == 0
    plain = render_run_report(run).read_text()
    assert "more than asked" not in plain  # none over: no column
    over = tmp_path / "over"
    shutil.copytree(run, over)
    summary = json.loads((over / "summary.json").read_text())
    summary["output_length_fidelity"].update(num_over_target=3,
                                             num_over_target_client_counted=0)
    (over / "summary.json").write_text(json.dumps(summary))
    report = render_run_report(over).read_text()
    section = report.split("## Output-length fidelity")[1].split("\n## ")[0]
    assert "| cell | completed | reached target | fraction | more than asked |" in section
    assert "| `over` | 10 | 10 | 100% | 3 |" in section
    findings = report.split("## Key findings")[1].split("\n## ")[0]
    assert ("In `over` 3 requests returned more output tokens than the trace asks (by the "
            "server's own count): the server did not honour max_tokens") in findings
