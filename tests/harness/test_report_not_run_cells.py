"""A cell not run yet (left out by --only, or a sweep stopped before it) is listed in the
report with its engine and load, from the definition the sweep recorded in scenario.json; it
read "– | – | trace timing", a load it did not have."""

from __future__ import annotations

import json
from pathlib import Path

from harness.cli import main

REPO = Path(__file__).resolve().parents[2]

SCENARIO = f"""\
name: notrun
question: which rate?
model: llama-3.1-8b
gpu: h100-sxm
trace:
  path: {REPO / "harness" / "data" / "azure_conv_excerpt.csv"}
  limit: 20
load:
  rates: [2, 4]
engines:
  - name: sim
    engine: reference
"""


def test_a_cell_not_run_is_listed_with_its_engine_and_load(tmp_path: Path) -> None:
    path = tmp_path / "notrun.yaml"
    path.write_text(SCENARIO)
    assert main(["run", str(path), "--only", "sim__rate-2", "--out", str(tmp_path / "out")]) == 0
    folder = tmp_path / "out" / "notrun"
    meta = json.loads((folder / "scenario.json").read_text())
    assert meta["definitions"]["sim__rate-4"]["load"] == {"kind": "rate", "value": 4.0}
    report = (folder / "report.md").read_text()
    assert "| `sim__rate-4` | reference | simulated | 4 req/s |" in report
    assert "trace timing" not in report


ENGINES = f"""\
name: engines
question: which engine?
model: llama-3.1-8b
gpu: h100-sxm
trace:
  path: {REPO / "harness" / "data" / "azure_conv_excerpt.csv"}
  limit: 20
engines:
  - name: sim
    engine: reference
    knobs: {{max_num_seqs: 64}}
  - name: tgi
    engine: tgi
    knobs: {{max_num_seqs: 64}}
"""


def test_a_cell_not_run_records_only_the_knobs_it_asked_for(tmp_path: Path) -> None:
    """TGI never preempts and caches prefixes by default: a TGI cell left out by --only was
    reported with `preemption recompute`, `prefix_caching false` and bf16 weights, batchlab's
    fallbacks, which its definition never asked for and its engine would not run with."""
    path = tmp_path / "engines.yaml"
    path.write_text(ENGINES)
    assert main(["run", str(path), "--only", "sim", "--out", str(tmp_path / "out")]) == 0
    folder = tmp_path / "out" / "engines"
    meta = json.loads((folder / "scenario.json").read_text())
    assert meta["definitions"]["tgi"]["knobs"] == {"max_num_seqs": 64}
    assert json.loads((folder / "sim" / "cell.json").read_text())["knobs"] == \
        {"max_num_seqs": 64}
    report = (folder / "report.md").read_text()
    cells = report[report.index("## Cells"):report.index("### Approximations")]
    tgi_row = next(line for line in cells.splitlines() if line.startswith("| `tgi` |"))
    assert "recompute" not in tgi_row and "false" not in tgi_row, tgi_row
    assert "`tgi`, not run, only the knobs asked for" in cells
    assert "max_num_seqs=64" in cells
    # the header named TGI among the engines, and said no live cell "finished"
    assert "| Engines | reference 0.1.0 (simulated); tgi (live): not run |" in report
    assert ("| Client ever the limit | not applicable: no live cell was run (not run yet, or "
            "left out by --only) |") in report

