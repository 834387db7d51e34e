"""The report's figures with many cells: every probe of a capacity search is a cell, so a
report can have dozens. A legend below the axes grows the figure instead of taking the axes'
room (a fixed height once left them none, and matplotlib refused to draw: "bottom cannot be
>= top"), and takes no more columns than the figure's width holds; a figure of up to 8 cells
keeps the size it always had."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness.report import plots

Draw = Callable[[Sequence[str], Path], Path | None]  # draws a figure of these cells into a folder


def _probe_names(n: int) -> list[str]:
    """Cell names as long as a capacity search's probes: the setting, then the probe's folder."""
    return [f"fcfs__max_num_seqs-{2 ** (i % 10)}/rate-{i * 0.37:.4g}" for i in range(n)]


def _short_names(n: int) -> list[str]:
    return [f"cell-{i}" for i in range(n)]


def _latency(names: Sequence[str], out: Path) -> Path | None:
    rng = np.random.default_rng(len(names))
    series = {name: {m: np.exp(rng.uniform(-5, 1, 40)) for m, _ in plots.LATENCY_PANELS}
              for name in names}
    return plots.latency_cdfs(series, out / "latency.png", note="predicted")


def _engine_state(names: Sequence[str], out: Path) -> Path | None:
    rng = np.random.default_rng(len(names))
    t = np.linspace(0.0, 20.0, 50)
    series = {name: plots.EngineState(t, rng.integers(0, 16, t.size).astype(float),
                                      rng.integers(0, 8, t.size).astype(float),
                                      rng.uniform(0, 1, t.size))
              for name in names}
    return plots.engine_state(series, out / "engine_state.png")


def _kv_only(names: Sequence[str], out: Path) -> Path | None:
    """One panel: the lowest figure, the least room a legend once had."""
    rng = np.random.default_rng(len(names))
    t = np.linspace(0.0, 20.0, 50)
    series = {name: plots.EngineState(t, kv_usage=rng.uniform(0, 1, t.size)) for name in names}
    return plots.engine_state(series, out / "kv.png")


def _throughput(names: Sequence[str], out: Path) -> Path | None:
    rng = np.random.default_rng(len(names))
    edges = plots.token_bin_edges(30.0)
    series = {}
    for name in names:
        t_s = np.sort(rng.uniform(0, 30, 80))
        series[name] = plots.TokenRate(
            plots.tokens_binned(t_s, rng.integers(1, 4, 80), edges), float(t_s[-1]))
    return plots.throughput_over_time(series, edges, out / "throughput.png")


def _sweep(names: Sequence[str], out: Path) -> Path | None:
    rng = np.random.default_rng(len(names))
    points = [plots.SweepPoint(name, cap, rng.uniform(0.01, 0.03), rng.uniform(0.03, 0.05),
                               rng.uniform(100, 900))
              for name in names for cap in (8, 16, 32)]
    return plots.batch_size_sweep(points, out / "sweep.png", tpot_slo_s=0.03)


def _curves(names: Sequence[str], out: Path) -> Path | None:
    rng = np.random.default_rng(len(names))
    lines = [plots.CurveLine(name, [1.0, 2.0, 4.0], list(rng.uniform(100, 900, 3)),
                             list(rng.uniform(0.01, 0.03, 3)), list(rng.uniform(0.02, 0.05, 3)),
                             list(rng.uniform(0.05, 2.0, 3)), [False, False, True])
             for name in names]
    return plots.throughput_latency(lines, out / "curves.png", slo={"tpot_s": 0.03})


LEGEND_BELOW: dict[str, Draw] = {
    "latency_cdfs": _latency, "engine_state": _engine_state, "engine_state_kv": _kv_only,
    "throughput_over_time": _throughput,
}
ALL: dict[str, Draw] = {**LEGEND_BELOW, "batch_size_sweep": _sweep, "throughput_latency": _curves}


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk comes first
    return width, height


def _draw_into(tmp_path: Path, draw: Draw, names: Sequence[str], folder: str) -> Path:
    out = tmp_path / folder
    out.mkdir()
    path = draw(names, out)
    assert path is not None and path.parent == out
    return path


# The in-axes legends of these two (settings, not probes: a handful in a report) take more
# room than 60 lines leave them, and the layout solver gives up; they still draw.
@pytest.mark.filterwarnings("ignore:constrained_layout not applied:UserWarning")
@pytest.mark.parametrize("draw", ALL.values(), ids=ALL.keys())
def test_sixty_cells_draw(tmp_path: Path, draw: Draw) -> None:
    width, height = _png_size(_draw_into(tmp_path, draw, _probe_names(60), "many"))
    assert width > 0 and height > 0


@pytest.mark.parametrize("draw", LEGEND_BELOW.values(), ids=LEGEND_BELOW.keys())
def test_a_long_legend_grows_the_figure_not_into_the_axes(
        tmp_path: Path, saved: list[Figure], draw: Draw) -> None:
    two = _draw_into(tmp_path, draw, _short_names(2), "two")
    eight = _draw_into(tmp_path, draw, _short_names(8), "eight")
    many = _draw_into(tmp_path, draw, _probe_names(60), "many")
    assert _png_size(eight) == _png_size(two)  # up to 8 cells, the size it always had
    assert _png_size(many)[0] == _png_size(two)[0]
    assert _png_size(many)[1] > _png_size(two)[1]
    eight_fig, many_fig = saved[1], saved[2]
    for ax_eight, ax_many in zip(eight_fig.axes, many_fig.axes, strict=True):
        # the axes keep at least the height they have beside a legend of two rows (8 cells)
        height_eight = ax_eight.get_position().height * eight_fig.get_size_inches()[1]
        height_many = ax_many.get_position().height * many_fig.get_size_inches()[1]
        assert height_many >= height_eight - 1e-9
    # the legend lies under the axes and their labels, within the figure's width
    renderer = FigureCanvasAgg(many_fig).get_renderer()
    many_fig.draw(renderer)
    legend, = many_fig.legends
    box = legend.get_window_extent(renderer)
    assert box.x0 >= 0 and box.x1 <= many_fig.bbox.width and box.y0 >= 0
    above = [ax.get_tightbbox(renderer) for ax in many_fig.axes]
    assert box.y1 <= min(bbox.y0 for bbox in above if bbox is not None)


def test_few_cells_keep_their_figure_size(tmp_path: Path) -> None:
    """The sizes these figures had before a legend could grow them, in pixels."""
    sizes = {name: _png_size(_draw_into(tmp_path, draw, _short_names(2), name))
             for name, draw in LEGEND_BELOW.items()}
    assert sizes == {"latency_cdfs": (1300, 400), "engine_state": (1100, 840),
                     "engine_state_kv": (1100, 320), "throughput_over_time": (1100, 360)}
