"""A trace of lengths only (ShareGPT) in a closed loop: N users need no arrival times, so
neither a scenario's concurrency load points nor a concurrency capacity search ask for a rate."""

from __future__ import annotations

import json
from pathlib import Path

from harness.cli import main as cli_main

REPO = Path(__file__).resolve().parents[2]
SCENARIO = f"""\
name: lens
question: How many users does a lengths-only trace take?
trace:
  path: {REPO / "harness" / "data" / "sharegpt_lengths_excerpt.csv"}
  limit: 60
model: llama-3.1-8b
gpu: h100-sxm
slo: {{ttft_s: 0.5, tpot_s: 0.05}}
load:
  concurrencies: [4]
engines:
  - name: ref
    engine: reference
    knobs: {{max_num_seqs: 16}}
"""


def test_a_lengths_only_trace_runs_closed_loop_cells_and_searches(tmp_path: Path) -> None:
    path = tmp_path / "lens.yaml"
    path.write_text(SCENARIO)
    assert cli_main(["run", str(path), "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "lens" / "ref" / "summary.json").read_text())
    assert summary["num_requests"] == 60
    assert cli_main(["capacity", str(path), "--search", "concurrency", "--max-probes", "2",
                     "--out", str(tmp_path / "cap")]) == 0
    search = json.loads((tmp_path / "cap" / "ref" / "search.json").read_text())
    assert len(search["probes"]) == 2
