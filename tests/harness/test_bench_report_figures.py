"""bench/report_figures.py runs on a short trace and checks that both ways of reading the
throughput figure's data agree; it skips, saying why, without the full trace. Its timings are
not checked: no test asserts a time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "report_figures.py"

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")


def _bench(*args: str, traces_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BATCHLAB_TRACES_DIR": str(traces_dir)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600, check=False)


@needs_fork
def test_without_the_full_trace_it_says_so_and_skips(tmp_path: Path) -> None:
    done = _bench(traces_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"skipped: the full trace is not at {tmp_path}")


@needs_fork
def test_on_a_given_trace_it_prints_both_ways_and_that_they_agree(tmp_path: Path) -> None:
    done = _bench(str(REPO / "harness" / "data" / "azure_conv_excerpt.csv"), "--limit", "200",
                  "--repeat", "1", traces_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for way in ("collector on", "collector off", "all at once", "in batches"):
        assert f"    {way} " in out
    assert "collector off against collector on (baseline)" in out
    assert "in batches against all at once (baseline)" in out
    assert out.rstrip().endswith("the same counts both ways: True")
