"""The report of a simulated run, rendered by a child process started before the simulation
(``harness.sim.report_process``): the same report as rendering it afterwards, failures raised
in the parent, and no report (and no error) without matplotlib. That a SIGTERM leaves no
child behind: tests/harness/integrity/test_signals.py."""

from __future__ import annotations

import gc
import json
import os
import signal
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from adapters.reference import ReferenceConfig
from harness.report import render, render_run_report
from harness.report.side_by_side import SideBySide
from harness.sim import run_simulation
from harness.sim.report_process import ReportError, ReportProcess, start_figures
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


# ------------------------------------------------------------ figures drawn in forked processes

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")


def _recording_draws(monkeypatch: pytest.MonkeyPatch, where: Path, *,
                     fail: str = "", empty: str = "") -> None:
    """``draw_run_figure`` as the figure processes call it, recording the process that drew
    each figure in ``where/<png>.pid``, and whether the garbage collector was on in it
    (``where/<png>.gc``); ``fail`` raises, ``empty`` has nothing to draw."""
    real = render.draw_run_figure

    def draw(run_dir: Path, png: str) -> bool:
        (where / f"{png}.pid").write_text(str(os.getpid()))
        (where / f"{png}.gc").write_text(json.dumps(gc.isenabled()))
        if png == fail:
            raise RuntimeError("a figure that fails (test)")
        return False if png == empty else real(run_dir, png)

    monkeypatch.setattr(render, "draw_run_figure", draw)


def _start_all(figures: SideBySide, run: Path) -> None:
    for name in ("steps.parquet", "requests.parquet", "chunks.parquet"):
        start_figures(figures, run, name)


@needs_fork
def test_each_figure_is_drawn_in_a_process_of_its_own_as_a_render_draws_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    _simulate(run, write_report=False)
    _recording_draws(monkeypatch, tmp_path)
    figures = SideBySide()
    _start_all(figures, run)
    assert figures.wait() == dict.fromkeys(FIGURES, True)
    pids = {int((tmp_path / f"{png}.pid").read_text()) for png in FIGURES}
    assert len(pids) == len(FIGURES) and os.getpid() not in pids
    # each without the garbage collector (this process, which forked them, keeps its own)
    assert {json.loads((tmp_path / f"{png}.gc").read_text()) for png in FIGURES} == {False}
    assert gc.isenabled()
    drawn = {png: (run / png).read_bytes() for png in FIGURES}
    monkeypatch.undo()
    render_run_report(run)
    assert {png: (run / png).read_bytes() for png in FIGURES} == drawn


@needs_fork
def test_a_figure_that_fails_in_its_process_is_left_to_the_render(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its process's error is not the report's: the render draws it again (and would raise
    what it raises there); a figure with nothing to draw is answered as such."""
    run = tmp_path / "run"
    _simulate(run, write_report=False)
    _recording_draws(monkeypatch, tmp_path, fail="engine_state.png", empty="throughput.png")
    figures = SideBySide()
    _start_all(figures, run)
    drawn = figures.wait()
    assert drawn == {"latency_cdf.png": True, "throughput.png": False}
    assert not (run / "engine_state.png").exists()
    monkeypatch.undo()
    render_run_report(run, drawn=drawn)
    assert (run / "engine_state.png").exists()
    assert b"engine_state.png" in (run / "report.md").read_bytes()


def test_without_fork_the_figures_are_drawn_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    _simulate(run, write_report=False)
    _recording_draws(monkeypatch, tmp_path, fail="engine_state.png")
    monkeypatch.delattr(os, "fork", raising=False)
    figures = SideBySide()
    _start_all(figures, run)
    assert figures.wait() == {"latency_cdf.png": True, "throughput.png": True}
    assert {(tmp_path / f"{png}.pid").read_text() for png in FIGURES} == {str(os.getpid())}
    # the drawing process is the renderer, which goes on to write report.md: its collector on
    assert {(tmp_path / f"{png}.gc").read_text() for png in FIGURES} == {"true"}
    assert gc.isenabled()


@needs_fork
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc for the processes")
def test_close_stops_the_figures_being_drawn(tmp_path: Path) -> None:
    """A run that ends (an error, Ctrl-C) while figures are drawn leaves no process of its
    report behind. The figures' file is a FIFO nothing writes: their processes wait on it."""
    run = tmp_path / "run"
    _simulate(run, write_report=False)
    (run / "requests.parquet").unlink()
    os.mkfifo(run / "requests.parquet")
    reporter = ReportProcess.start()
    assert reporter is not None
    try:
        reporter.file_written(run, "requests.parquet")
        deadline = time.monotonic() + 60
        while len(_children(reporter.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        drawing = _children(reporter.pid)
        assert len(drawing) == 2, "the two figures drawn from requests.parquet"
    finally:
        reporter.close()
    # gone, or a zombie until whoever adopted it reaps it (a signal lands in its own time)
    deadline = time.monotonic() + 30
    while (alive := {p for p in drawing if _state(p) not in ("", "Z")}) and (
            time.monotonic() < deadline):
        time.sleep(0.05)
    assert alive == set()


def _children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (/proc)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""
