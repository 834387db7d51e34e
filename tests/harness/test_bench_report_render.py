"""bench/report_render.py renders the quickstart scenario's report both ways, figures one
after another and side by side, and checks that both wrote the same figures and report. Its
timings are not checked: no test asserts a time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "report_render.py"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")
def test_it_prints_both_ways_and_that_they_agree() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--repeat", "1", "--verbose"],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith(f"scenario {REPO / 'scenarios' / 'quickstart.yaml'}: 3 cells, "
                          "3 figures (engine_state.png, latency_cdf.png, throughput.png)")
    for way in ("one after another", "side by side"):
        assert f"    {way} " in out
    assert "side by side against one after another (baseline): wall " in out
    assert out.rstrip().endswith("the same figures and report both ways: True")
