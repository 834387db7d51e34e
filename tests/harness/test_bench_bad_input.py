"""The bench scripts answer bad input with one line and exit status 2, before they start a
server or make a folder: no traceback. Nothing here times anything or needs a full trace,
vLLM or llama.cpp."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"

CASES = [
    ("simulate_speed.py", ["/nonexistent/trace.csv", "--no-cli"], "/nonexistent/trace.csv"),
    ("simulate_speed.py", ["--limit", "0"], "--limit"),
    ("report_figures.py", ["/nonexistent/trace.csv"], "/nonexistent/trace.csv"),
    ("report_figures.py", ["--limit", "0"], "--limit"),
    ("report_figures.py", ["--repeat", "0"], "--repeat"),
    ("report_render.py", ["/nonexistent/scenario.yaml"], "/nonexistent/scenario.yaml"),
    ("report_render.py", ["README.md"], "README.md:14: invalid YAML"),
    ("report_render.py", ["--repeat", "0"], "--repeat"),
    ("served_vs_simulated.py", ["--trace", "/nonexistent/trace.csv"], "/nonexistent/trace.csv"),
    ("served_vs_simulated.py", ["--limit", "0"], "--limit"),
    ("served_vs_simulated.py", ["--model", "no-such-model"], "model: unknown model"),
    ("ttft_side_by_side.py", ["--trace", "/nonexistent/trace.csv"], "/nonexistent/trace.csv"),
    ("ttft_side_by_side.py", ["--limit", "0"], "--limit"),
    ("ttft_side_by_side.py", ["--gpu", "no-such-gpu"], "gpu: unknown GPU"),
    ("client_capacity.py", ["--rates", "abc"], "--rates"),
    ("client_capacity.py", ["--rates", "0"], "--rates"),
    ("client_capacity.py", ["--rates", "50,25"], "rise"),
    ("client_capacity.py", ["--step-s", "0"], "--step-s"),
    ("workers_capacity.py", ["--rates", "abc"], "--rates"),
    ("workers_capacity.py", ["--rates", "100,0"], "--rates"),
    ("workers_capacity.py", ["--rates", "100,100"], "rise"),
    ("workers_capacity.py", ["--step-s", "0"], "--step-s"),
    ("llamacpp_side_by_side.py", ["--requests", "0"], "--requests"),
    ("llamacpp_side_by_side.py", ["--users", "-1"], "--users"),
    ("llamacpp_side_by_side.py", ["--prompt", "1000", "--output", "100"], "context"),
]


@pytest.mark.parametrize(("script", "args", "named"), CASES,
                         ids=[f"{s}:{' '.join(a)}" for s, a, _ in CASES])
def test_bad_input_is_one_line_and_exit_2(script: str, args: list[str], named: str,
                                          tmp_path: Path) -> None:
    # TMPDIR: a folder a script made (tempfile) would show up here
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith(f"{script}: error:")]
    assert len(errors) == 1, done.stderr
    assert named in errors[0]
    assert done.stdout == ""  # nothing started
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def arg_types(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("arg_types")


def test_rates_are_positive_and_rising(arg_types: ModuleType) -> None:
    assert arg_types.ascending_rates("25, 50,100.5") == [25.0, 50.0, 100.5]
    for bad in ("", "abc", "0", "-5", "inf", "nan", "10,10", "20,10", "10,,20"):
        with pytest.raises(argparse.ArgumentTypeError):
            arg_types.ascending_rates(bad)


def test_counts_and_seconds(arg_types: ModuleType) -> None:
    assert arg_types.positive_int("3") == 3
    assert arg_types.non_negative_int("0") == 0
    assert arg_types.positive_float("0.5") == 0.5
    for parse, bad in ((arg_types.positive_int, "0"), (arg_types.positive_int, "1.5"),
                       (arg_types.non_negative_int, "-1"), (arg_types.positive_float, "0"),
                       (arg_types.positive_float, "inf")):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(bad)
