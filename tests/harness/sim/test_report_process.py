"""The report of a simulated run, rendered by a child process started before the simulation
(``harness.sim.report_process``): the same report as rendering it afterwards, failures raised
in the parent, and no report (and no error) without matplotlib. That a SIGTERM leaves no
child behind: tests/harness/integrity/test_signals.py."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from adapters.reference import ReferenceConfig
from harness.report import render_run_report
from harness.sim import run_simulation
from harness.sim.report_process import ReportError, ReportProcess
from harness.traces import Trace, TraceOptions, load_trace

REPO = Path(__file__).resolve().parents[3]
FIGURES = ("latency_cdf.png", "engine_state.png", "throughput.png")


def _trace() -> Trace:
    return load_trace("synthetic", TraceOptions(num_requests=40, rate=20, prompt_tokens=64,
                                                output_tokens=16))


def _simulate(out: Path, *, write_report: bool = True) -> None:
    run_simulation(_trace(), ReferenceConfig(policy="fcfs"), out, write_report=write_report)


def test_the_child_writes_the_report_a_re_render_writes(tmp_path: Path) -> None:
    """Figures drawn as their files landed, and report.md, equal a render of the finished
    folder, byte for byte."""
    run = tmp_path / "run"
    _simulate(run)
    first = {name: (run / name).read_bytes() for name in ("report.md", *FIGURES)}
    assert b"![Latency CDFs" in first["report.md"]
    render_run_report(run)
    for name, content in first.items():
        assert (run / name).read_bytes() == content, name


def _render_in_a_child(run: Path, expected: type[Exception]) -> Exception:
    """What rendering ``run`` in a fresh child process raised (it must raise ``expected``)."""
    reporter = ReportProcess.start()
    assert reporter is not None
    try:
        with pytest.raises(expected) as raised:
            reporter.folder_written(run)
            reporter.wait(run)
    finally:
        reporter.close()
    return raised.value


def test_a_failed_render_is_raised_with_the_childs_traceback(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _simulate(run, write_report=False)
    # a damaged requests.parquet: a latency column of text
    table = pq.read_table(run / "requests.parquet")
    table = table.set_column(table.schema.get_field_index("ttft_s"), "ttft_s",
                             pa.array(["x"] * table.num_rows))
    pq.write_table(table, run / "requests.parquet")
    message = str(_render_in_a_child(run, ReportError))
    assert "Traceback" in message and "column ttft_s: not a numeric column" in message
    assert f"batchlab report {run}" in message  # what to run once it is fixed


def test_an_os_error_in_the_child_is_an_os_error_here(tmp_path: Path) -> None:
    """So that the command line prints its one-line error (a full disk, a read-only folder)."""
    run = tmp_path / "run"
    _simulate(run, write_report=False)
    (run / "report.md").mkdir()  # the report cannot replace a folder
    error = _render_in_a_child(run, OSError)
    assert isinstance(error, OSError)
    assert error.filename is not None and "report.md" in error.filename


def test_a_child_that_died_is_reported(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _simulate(run, write_report=False)
    reporter = ReportProcess.start()
    assert reporter is not None
    try:
        os.kill(reporter.pid, signal.SIGKILL)
        with pytest.raises(ReportError, match="without an answer"):
            reporter.folder_written(run)
            reporter.wait(run)
    finally:
        reporter.close()


def test_without_matplotlib_the_run_has_no_report_and_no_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "site" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no matplotlib here (test)')\n")
    monkeypatch.setenv("PYTHONPATH", str(fake.parent))
    run = tmp_path / "run"
    _simulate(run)
    assert (run / "summary.json").exists() and (run / "chunks.parquet").exists()
    assert not (run / "report.md").exists()
    assert not any((run / name).exists() for name in FIGURES)


def test_an_interrupt_while_the_child_starts_waits_until_the_child_is_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C that lands after the child was forked and before the run keeps it: the child
    is still stopped, and the manifest says the run was interrupted (not "starting")."""
    started: list[ReportProcess] = []
    real_start = ReportProcess.start

    def start() -> ReportProcess | None:
        reporter = real_start()
        assert reporter is not None
        started.append(reporter)
        os.kill(os.getpid(), signal.SIGINT)  # handled at the next instruction, here or held
        return reporter

    monkeypatch.setattr(ReportProcess, "start", staticmethod(start))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt, match="had not started"):
        _simulate(run)
    assert json.loads((run / "manifest.json").read_text())["status"] == "interrupted"
    assert started[0]._proc.poll() is not None  # stopped by the run, not left behind
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
