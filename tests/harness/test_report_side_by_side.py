"""A report's figures are drawn side by side, each in a process forked from the renderer,
while it writes the text (harness.report.side_by_side): the run figures, and the figures of a
scenario's cells together (batch-size sweep, load curves); the same files as drawn one after
another; a figure whose process fails is drawn again in the renderer, where its error is
raised, as is one whose process is still drawing at its deadline (a hang: killed, and said
on standard error); no process is left drawing when the render fails; and where forking is
not safe
(other threads) or not possible, the figures are drawn in the renderer itself."""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from adapters.reference import ReferenceConfig
from harness.report import (
    load_scenario_dir,
    plots,
    render,
    render_markdown,
    render_run_report,
    scenario_context,
    side_by_side,
)
from harness.report.side_by_side import SideBySide, can_fork
from harness.sim import run_simulation
from harness.traces import TraceOptions, load_trace

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")
FIGURES = tuple(f.png for f in render.RUN_FIGURES)
# a scenario of max_num_seqs caps at several rates: both figures of its cells together
CURVES = Path(__file__).resolve().parent.parent / "data" / "report_golden" / "fixture-curves"
SCENARIO_FIGURES = {"batch_size_sweep": "batch_size.png",
                    "throughput_latency": "throughput_latency.png"}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("side") / "run"
    trace = load_trace("synthetic", TraceOptions(num_requests=40, rate=20, prompt_tokens=64,
                                                 output_tokens=16))
    run_simulation(trace, ReferenceConfig(policy="fcfs"), out, write_report=False)
    return out


def _recorded(monkeypatch: pytest.MonkeyPatch, where: Path, *,
              behaviour: Callable[[str], None] = lambda png: None) -> None:
    """The run figures, each recording in ``where/<png>.pid`` the process that drew it, and
    calling ``behaviour(png)`` first (to fail, or to block)."""
    def recording(figure: render.RunFigure) -> render.RunFigure:
        def draw(runs: Mapping[str, Path], path: Path) -> bool:
            (where / f"{figure.png}.pid").write_text(str(os.getpid()))
            behaviour(figure.png)
            return figure.draw(runs, path)
        return dataclasses.replace(figure, draw=draw)

    monkeypatch.setattr(render, "RUN_FIGURES", tuple(recording(f) for f in render.RUN_FIGURES))


def _drawers(where: Path) -> dict[str, int]:
    return {png: int((where / f"{png}.pid").read_text()) for png in FIGURES
            if (where / f"{png}.pid").exists()}


@needs_fork
def test_each_figure_is_drawn_in_a_process_of_its_own_and_the_same_as_here(
        run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _recorded(monkeypatch, tmp_path)
    render_run_report(run)
    drawers = _drawers(tmp_path)
    assert set(drawers) == set(FIGURES)
    assert len(set(drawers.values())) == len(FIGURES) and os.getpid() not in drawers.values()
    side_by_side = {png: (run / png).read_bytes() for png in FIGURES}
    report = (run / "report.md").read_text()
    assert all(f"]({png})" in report for png in FIGURES)

    # drawn one after another in this process (no fork): the same files, the same report
    monkeypatch.delattr(os, "fork")
    render_run_report(run)
    assert set(_drawers(tmp_path).values()) == {os.getpid()}
    assert {png: (run / png).read_bytes() for png in FIGURES} == side_by_side
    assert (run / "report.md").read_text() == report


@needs_fork
def test_a_scenarios_figures_of_its_cells_together_are_drawn_side_by_side_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    drawers = tmp_path / "drawers"
    drawers.mkdir()
    def recording(draw: Callable[..., object], png: str) -> Callable[..., object]:
        def drawing(*args: object, **kwargs: object) -> object:
            (drawers / f"{png}.pid").write_text(str(os.getpid()))
            return draw(*args, **kwargs)
        return drawing

    for function, png in SCENARIO_FIGURES.items():
        monkeypatch.setattr(plots, function, recording(getattr(plots, function), png))
    meta, cells = load_scenario_dir(CURVES)
    ctx = scenario_context(meta, cells, CURVES)

    side_by_side_text = render_markdown(cells, ctx, tmp_path / "forked")
    pids = {png: int((drawers / f"{png}.pid").read_text()) for png in SCENARIO_FIGURES.values()}
    assert len(set(pids.values())) == len(pids) and os.getpid() not in pids.values()
    assert all(f"]({png})" in side_by_side_text for png in pids)

    monkeypatch.delattr(os, "fork")  # one after another, in this process
    assert render_markdown(cells, ctx, tmp_path / "here") == side_by_side_text
    assert {(drawers / f"{png}.pid").read_text() for png in pids} == {str(os.getpid())}
    for png in (*pids, *FIGURES):
        assert (tmp_path / "forked" / png).read_bytes() == (tmp_path / "here" / png).read_bytes()


@needs_fork
def test_figures_are_drawn_in_their_processes_when_stderr_has_no_file(
        run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Under capsys, sys.stderr has no file descriptor for the forked process's stdout to be
    pointed at: it draws all the same, not failing over to the renderer."""
    with pytest.raises(OSError):  # io.UnsupportedOperation
        sys.stderr.fileno()
    _recorded(monkeypatch, tmp_path)
    render_run_report(run)
    assert os.getpid() not in _drawers(tmp_path).values()


@needs_fork
def test_a_figure_that_fails_in_its_process_is_drawn_again_here(
        run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    renderer = os.getpid()

    def fails_forked(png: str) -> None:
        if png == "engine_state.png" and os.getpid() != renderer:
            raise RuntimeError("only in a forked process (test)")

    _recorded(monkeypatch, tmp_path, behaviour=fails_forked)
    (run / "engine_state.png").unlink(missing_ok=True)
    render_run_report(run)
    assert _drawers(tmp_path)["engine_state.png"] == renderer  # the last to draw it
    assert (run / "engine_state.png").exists()
    assert "](engine_state.png)" in (run / "report.md").read_text()


@needs_fork
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc for the processes")
def test_a_figure_whose_process_hangs_is_stopped_and_drawn_again_here(
        run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    renderer = os.getpid()

    def hangs_forked(png: str) -> None:
        if png == "latency_cdf.png" and os.getpid() != renderer:
            (tmp_path / "hung.pid").write_text(str(os.getpid()))
            time.sleep(600)  # a lock the fork copied held, say

    _recorded(monkeypatch, tmp_path, behaviour=hangs_forked)
    monkeypatch.setattr(side_by_side, "FIGURE_TIMEOUT_S", 3.0)
    (run / "latency_cdf.png").unlink(missing_ok=True)
    render_run_report(run)
    assert _drawers(tmp_path)["latency_cdf.png"] == renderer  # the last to draw it
    assert (run / "latency_cdf.png").exists()
    assert "](latency_cdf.png)" in (run / "report.md").read_text()
    hung = int((tmp_path / "hung.pid").read_text())
    assert not Path(f"/proc/{hung}").exists()  # killed and reaped
    assert ("figure latency_cdf.png: its process was still drawing 3 s after it started, "
            "and was stopped; drawn again in the renderer") in capfd.readouterr().err


@needs_fork
def test_a_figure_that_fails_raises_its_error_in_the_renderer(
        run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(png: str) -> None:
        if png == "throughput.png":
            raise RuntimeError("a figure that fails (test)")

    _recorded(monkeypatch, tmp_path, behaviour=fails)
    with pytest.raises(RuntimeError, match="a figure that fails"):
        render_run_report(run)


@needs_fork
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc for the processes")
def test_a_render_that_fails_leaves_no_figure_being_drawn(
        run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The figures' processes block until killed; the text fails once they all run."""
    def block(png: str) -> None:
        time.sleep(600)

    _recorded(monkeypatch, tmp_path, behaviour=block)

    def failing_section(*args: object, **kwargs: object) -> list[str]:
        deadline = time.monotonic() + 60
        while len(_drawers(tmp_path)) < len(FIGURES) and time.monotonic() < deadline:
            time.sleep(0.02)
        raise RuntimeError("the text fails (test)")

    monkeypatch.setattr(render, "latency_section", failing_section)
    with pytest.raises(RuntimeError, match="the text fails"):
        render_run_report(run)
    drawers = _drawers(tmp_path)
    assert len(drawers) == len(FIGURES)
    for pid in drawers.values():  # killed and reaped: no such process, not even a zombie
        assert not Path(f"/proc/{pid}").exists(), pid


@pytest.fixture
def another_thread() -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@needs_fork
@pytest.mark.usefixtures("another_thread")
def test_with_another_thread_running_the_figures_are_drawn_here(
        run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not can_fork()
    _recorded(monkeypatch, tmp_path)
    render_run_report(run)
    assert set(_drawers(tmp_path).values()) == {os.getpid()}
    assert all((run / png).exists() for png in FIGURES)


@needs_fork
def test_side_by_side_answers_drawn_nothing_and_failed() -> None:
    figures = SideBySide()
    figures.start("drawn", lambda: True)
    figures.start("nothing", lambda: False)
    figures.start("failed", lambda: 1 / 0 == 0)
    assert figures.wait() == {"drawn": True, "nothing": False}
    assert figures.wait() == {"drawn": True, "nothing": False}  # waited for once
    figures.stop()  # nothing left: a no-op


@needs_fork
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc for the processes")
def test_side_by_side_stops_a_process_at_its_deadline_and_waits_for_the_others(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    def hangs() -> bool:
        (tmp_path / "hung.pid").write_text(str(os.getpid()))
        time.sleep(600)
        return True

    figures = SideBySide(timeout_s=2)
    figures.start("hangs", hangs)
    figures.start("drawn", lambda: True)
    assert figures.wait() == {"drawn": True}
    assert ("figure hangs: its process was still drawing 2 s after it started, and was "
            "stopped; drawn again in the renderer") in capfd.readouterr().err
    hung = int((tmp_path / "hung.pid").read_text())
    assert not Path(f"/proc/{hung}").exists()  # killed and reaped


def test_without_fork_side_by_side_draws_here_and_raises(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "fork", raising=False)
    figures = SideBySide()
    drawn_in = []
    figures.start("here", lambda: drawn_in.append(os.getpid()) is None)
    assert drawn_in == [os.getpid()]
    with pytest.raises(ZeroDivisionError):
        figures.start("failed", lambda: 1 / 0 == 0)
    assert figures.wait() == {"here": True}
