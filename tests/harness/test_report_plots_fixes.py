"""Two ways the report's figures misled a reader.

- Minor tick labels of a log time axis ran together ("30 ms40 ms"): matplotlib labels 2, 3,
  4 and 6 of a decade whatever room the axis gives them. Each is now kept only where it
  overlaps no other label, drawn; the decades are always labelled.
- The throughput–latency figure drew TTFT and TPOT percentiles against a horizontal SLO line,
  but a capacity is decided by the share of requests meeting every SLO reaching the target:
  a p90 crossing the line at a higher load read as the capacity. The SLO line now says it is
  a limit on each request, and the capacity found is marked at its load.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from harness.report import plots
from harness.report.curves import CapacityRow, CurvePoint, Series, capacity_mark


def _drawn_labels(fig: Figure, axis: Axis) -> list[tuple[str, float, float]]:
    """The axis's tick labels drawn within its axes, as (text, start, end) along the axis
    in pixels, in the order of the axis."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    box = axis.axes.bbox
    horizontal = axis is axis.axes.xaxis
    out = []
    for label in axis.get_ticklabels(which="both"):
        if not label.get_text() or not label.get_visible():
            continue
        extent = label.get_window_extent(renderer)
        start, end = (extent.x0, extent.x1) if horizontal else (extent.y0, extent.y1)
        centre = (start + end) / 2
        if (box.x0 <= centre <= box.x1) if horizontal else (box.y0 <= centre <= box.y1):
            out.append((label.get_text(), start, end))
    return sorted(out, key=lambda t: t[1])


@pytest.mark.parametrize(("low_s", "high_s", "decades"), [
    (0.013, 0.3, ["100 ms"]),  # the TPOT panel of the mooncake excerpt: "30 ms40 ms"
    (0.02, 0.19, ["100 ms"]),
    (0.031, 0.039, []),  # within one step of the minor ticks: matplotlib's linear ticks
    (0.006, 0.03, ["10 ms"]),
    (0.05, 12.0, ["100 ms", "1 s", "10 s"]),
])
def test_the_labels_of_a_log_time_axis_never_overlap(
        saved: list[Figure], tmp_path: Path, low_s: float, high_s: float,
        decades: list[str]) -> None:
    values = np.geomspace(low_s, high_s, 200)
    assert plots.latency_cdfs({"a": {m: values for m, _ in plots.LATENCY_PANELS}},
                              tmp_path / "latency.png") is not None
    for ax in saved[0].axes:
        labels = _drawn_labels(saved[0], ax.xaxis)
        texts = [text for text, _, _ in labels]
        assert set(decades) <= set(texts), texts  # the decades always labelled
        assert len(texts) >= 2, texts  # and something between them, where it fits
        overlapping = [(a[0], b[0]) for a, b in itertools.pairwise(labels)
                       if b[1] < a[2]]
        assert not overlapping, texts


def test_a_crowded_decade_keeps_its_roundest_minor_labels(saved: list[Figure],
                                                          tmp_path: Path) -> None:
    """13 ms to 300 ms: 20 ms and 200 ms are labelled, and the one decade, and no two
    neighbouring minor ticks of 30, 40 and 60 ms both (they run together)."""
    values = np.geomspace(0.013, 0.3, 200)
    plots.latency_cdfs({"a": {m: values for m, _ in plots.LATENCY_PANELS}},
                       tmp_path / "latency.png")
    texts = [text for text, _, _ in _drawn_labels(saved[0], saved[0].axes[1].xaxis)]
    assert {"20 ms", "100 ms", "200 ms"} <= set(texts), texts
    assert not {"30 ms", "40 ms"} <= set(texts), texts


def test_the_formatter_thins_minor_labels_only() -> None:
    """The decades keep their labels however crowded; each minor label is kept only where it
    fits (here, a narrow axis: none of them)."""
    fig = Figure(figsize=(1.2, 1.0))
    ax = fig.subplots()
    ax.plot([0.013, 0.3], [0, 1])
    ax.set_xscale("log")
    plots._log_labels(ax.xaxis, plots.seconds_label)
    texts = [text for text, _, _ in _drawn_labels(fig, ax.xaxis)]
    assert texts == ["100 ms"], texts


# ---------------------------------------------------------------- throughput–latency figure

LOADS = [1.0, 2.0, 4.0, 8.0, 9.512, 10.37, 10.83, 11.31, 16.0]
TOKENS_PER_S = [250.0, 505.0, 990.0, 1890.0, 2210.0, 2365.0, 2455.0, 2530.0, 2965.0]
TTFT_P90_S = [0.038, 0.039, 0.05, 0.075, 0.082, 0.11, 0.185, 0.41, 2.5]


def _line(capacity: plots.CapacityMark | None, label: str = "reference") -> plots.CurveLine:
    """The capacity search of the azure excerpt (--slo ttft_s=0.5,tpot_s=0.03): the TTFT p90
    crosses 500 ms between 11.31 and 16 req/s; the capacity found is 10.37 req/s (11.31 met
    the SLO for 96% of its requests, under the 99% target)."""
    n = len(LOADS)
    return plots.CurveLine(label, LOADS, TOKENS_PER_S, [0.007] * n, [0.009] * n, TTFT_P90_S,
                           capacity=capacity)


def _legend(ax: Axes) -> list[str]:
    legend = ax.get_legend()
    assert legend is not None
    return [t.get_text() for t in legend.get_texts()]


def _vertical_lines(ax: Axes) -> list[float]:
    """The x of each vertical line across the axes (``axvline``)."""
    out = []
    for line in ax.get_lines():
        assert isinstance(line, Line2D)
        xs = np.asarray(line.get_xdata(), dtype=float)
        ys = np.asarray(line.get_ydata(), dtype=float)
        if xs.size == 2 and xs[0] == xs[1] and list(ys) == [0.0, 1.0]:
            out.append(float(xs[0]))
    return out


def test_the_slo_lines_say_they_limit_each_request(saved: list[Figure],
                                                   tmp_path: Path) -> None:
    assert plots.throughput_latency([_line(None)], tmp_path / "curves.png",
                                    slo={"ttft_s": 0.5, "tpot_s": 0.03}) is not None
    ax_tpot, ax_ttft = saved[0].axes
    assert "TPOT SLO (30 ms), a limit on each request" in _legend(ax_tpot)
    assert "TTFT SLO (500 ms), a limit on each request" in _legend(ax_ttft)
    assert not _vertical_lines(ax_ttft)  # no capacity given: none marked


def test_the_capacity_found_is_marked_at_its_load_not_where_a_p90_crosses_the_slo(
        saved: list[Figure], tmp_path: Path) -> None:
    mark = plots.CapacityMark(10.37, "10.37 req/s", 0.99)
    assert plots.throughput_latency([_line(mark)], tmp_path / "curves.png",
                                    slo={"ttft_s": 0.5, "tpot_s": 0.03}) is not None
    for ax in saved[0].axes:
        assert _vertical_lines(ax) == [2365.0]  # the 10.37 req/s probe's tokens/s
        assert "capacity 10.37 req/s: ≥ 99.0% of requests met every SLO" in _legend(ax)


def test_an_interpolated_capacity_is_placed_between_its_load_points(
        saved: list[Figure], tmp_path: Path) -> None:
    """Several settings: each capacity named by its setting, what decides one said once;
    a capacity beyond a line's loads has no place on it."""
    lines = [_line(plots.CapacityMark(3.0, "3 req/s", 0.95), "fcfs"),
             _line(plots.CapacityMark(40.0, "40 req/s", 0.95), "beyond"),
             _line(plots.CapacityMark(16.0, "≥ 16 req/s", 0.95), "every load met it")]
    plots.throughput_latency(lines, tmp_path / "curves.png", slo={"ttft_s": 0.5})
    for ax in saved[0].axes:
        assert _vertical_lines(ax) == [pytest.approx((505.0 + 990.0) / 2), 2965.0]
        legend = _legend(ax)
        assert {"fcfs: capacity 3 req/s", "every load met it: capacity ≥ 16 req/s",
                "capacity: ≥ 95.0% of requests met every SLO"} <= set(legend), legend
        assert not any(text.startswith("beyond:") for text in legend), legend


def test_capacities_at_different_targets_each_say_theirs(saved: list[Figure],
                                                         tmp_path: Path) -> None:
    lines = [_line(plots.CapacityMark(3.0, "3 req/s", 0.95), "a"),
             _line(plots.CapacityMark(10.37, "10.37 req/s", 0.99), "b")]
    plots.throughput_latency(lines, tmp_path / "curves.png", slo={"ttft_s": 0.5})
    legend = _legend(saved[0].axes[1])
    assert {"a: capacity 3 req/s, ≥ 95.0% of requests met every SLO",
            "b: capacity 10.37 req/s, ≥ 99.0% of requests met every SLO"} <= set(legend), legend
    assert not any(text.startswith("capacity:") for text in legend), legend


def _series(kind: str = "rate") -> Series:
    return Series("fcfs", kind, tuple(
        CurvePoint(f"rate-{load:g}", load, tps, 0.007, 0.009, ttft, None)
        for load, tps, ttft in zip(LOADS, TOKENS_PER_S, TTFT_P90_S, strict=True)))


@pytest.mark.parametrize(("row", "expected"), [
    (CapacityRow("fcfs", "rate", 10.37, "=", "search", ""),
     plots.CapacityMark(10.37, "10.37 req/s", 0.99)),
    (CapacityRow("fcfs", "rate", 16.0, "≥", "interpolated", ""),
     plots.CapacityMark(16.0, "≥ 16 req/s", 0.99)),
    (CapacityRow("fcfs", "rate", 1.0, "<", "interpolated", ""), None),  # below every load
    (CapacityRow("fcfs", "rate", None, "=", "interpolated", "no SLO attainment"), None),
    (CapacityRow("fcfs", "concurrency", 4.0, "=", "search", ""), None),  # another load
    (CapacityRow("fcfs", "rate", 20.0, "=", "search", ""), None),  # beyond the curve
    (None, None),
])
def test_which_capacity_the_figure_marks(row: CapacityRow | None,
                                         expected: plots.CapacityMark | None) -> None:
    assert capacity_mark(row, _series(), 0.99) == expected


def test_every_request_alike_draws_its_step_without_a_warning(saved: list[Figure],
                                                               tmp_path: Path) -> None:
    """A synthetic trace at one user: every request's TTFT the same but for a rounding error
    (0.012961744741189935 and ...005). Those limits gave a log axis no width, and drawing it
    divided by zero (a RuntimeWarning, an error where warnings are). The axis now spans a
    factor of 2 either side, with labels."""
    ttft = np.full(16, 0.012961744741189935)
    ttft[-1] = 0.01296174474119005
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plots.latency_cdfs({"a": {m: ttft for m, _ in plots.LATENCY_PANELS}},
                                  tmp_path / "latency.png") is not None
    for ax in saved[0].axes:
        low, high = ax.get_xlim()
        assert low == pytest.approx(ttft[0] / 2) and high == pytest.approx(ttft[-1] * 2)
        assert "10 ms" in [text for text, _, _ in _drawn_labels(saved[0], ax.xaxis)]
