"""`batchlab simulate` starts its report process before it loads numpy, pyarrow, the engine
and the results code, so that the report code loads beside them; a command that fails before
its run leaves no report process behind. The packages that load their names on first use for
this (harness.sim, harness.traces) still export every name they list."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from adapters.reference import ReferenceConfig
from harness.cli import main
from harness.sim import report_process
from harness.sim.run import run_simulation
from harness.traces import TraceOptions, load_trace

REPO = Path(__file__).resolve().parents[3]
EXCERPT = REPO / "harness" / "data" / "azure_conv_excerpt.csv"

# A fresh interpreter: what was loaded when the report process was started, then the run.
_PROBE = """
import json, sys
from harness.sim import report_process
start = report_process.ReportProcess.start.__func__
seen = {}
def probe(cls):
    seen.update({m: m in sys.modules for m in ("numpy", "pyarrow", "harness.results",
                                               "harness.sim.driver", "adapters.reference")})
    return start(cls)
report_process.ReportProcess.start = classmethod(probe)
from harness.cli import main
code = main(["simulate", "--trace", sys.argv[1], "--limit", "20", "--out", sys.argv[2]])
print(json.dumps({"code": code, "loaded": seen}))
"""


def test_the_report_process_starts_before_the_engine_is_loaded(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", _PROBE, str(EXCERPT), str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["code"] == 0
    assert answer["loaded"] == {"numpy": False, "pyarrow": False, "harness.results": False,
                                "harness.sim.driver": False, "adapters.reference": False}
    assert (out / "report.md").exists() and (out / "latency_cdf.png").exists()


def _started(monkeypatch: pytest.MonkeyPatch) -> list[report_process.ReportProcess]:
    """Every report process the command starts, kept to be looked at after it ends."""
    start = report_process.ReportProcess.start.__func__  # type: ignore[attr-defined]
    kept: list[report_process.ReportProcess] = []

    def keep(cls: type[report_process.ReportProcess]) -> report_process.ReportProcess | None:
        child = start(cls)
        if child is not None:
            kept.append(child)
        return child

    monkeypatch.setattr(report_process.ReportProcess, "start", classmethod(keep))
    return kept


@pytest.mark.parametrize("bad", [
    ["--max-num-seqs", "0"],                      # a knob: before the trace is read
    ["--trace", "missing.csv"],                   # the trace: before the run
    ["--mode", "closed"],                         # the load: before the run
], ids=["knob", "trace", "load"])
def test_a_command_that_fails_before_its_run_leaves_no_report_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        bad: list[str]) -> None:
    kept = _started(monkeypatch)
    out = tmp_path / "run"
    args = ["simulate", "--trace", str(EXCERPT), "--limit", "20", "--out", str(out), *bad]
    assert main(args) == 2
    assert "error:" in capsys.readouterr().err
    assert len(kept) == 1  # started first, before the command found its error
    assert kept[0]._proc.poll() is not None  # and stopped
    assert not out.exists()


def test_a_refused_folder_leaves_no_report_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(EXCERPT), "--limit", "20", "--no-report",
                 "--out", str(out)]) == 0
    kept = _started(monkeypatch)
    # another run's folder (another trace): refused when the run claims it, after the start
    assert main(["simulate", "--trace", str(EXCERPT), "--limit", "21",
                 "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert len(kept) == 1 and kept[0]._proc.poll() is not None
    assert not (out / "report.md").exists()


def test_a_process_handed_to_a_run_without_report_is_closed(tmp_path: Path) -> None:
    child = report_process.ReportProcess.start()
    assert child is not None
    trace = load_trace(EXCERPT, TraceOptions(limit=10))
    run_simulation(trace, ReferenceConfig(), tmp_path / "run", write_report=False,
                   reporter=child)
    assert child._proc.poll() is not None
    assert not (tmp_path / "run" / "report.md").exists()


@pytest.mark.parametrize("package", ["harness.sim", "harness.traces"])
def test_a_package_loaded_on_first_use_exports_what_it_lists(package: str) -> None:
    """Each listed name comes from its module, on first use, in a fresh interpreter (where
    nothing else has loaded the package's modules); an unlisted one is an AttributeError."""
    probe = (f"import importlib, {package} as p\n"
             "for name in p.__all__:\n"
             "    value = getattr(p, name)\n"
             "    home = importlib.import_module(p.__name__ + '.' + p._HOME[name])\n"
             "    assert value is getattr(home, name), name\n"
             "assert sorted(p._HOME) == sorted(p.__all__)\n"
             "try:\n"
             "    p.no_such_name\n"
             "except AttributeError as exc:\n"
             "    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"module {package!r} has no attribute 'no_such_name'"
