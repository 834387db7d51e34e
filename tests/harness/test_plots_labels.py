"""Axis labels of the report's figures: times on log axes read as plain numbers with a unit
("20 ms", "1 s"), not powers of ten in math text; request counts are whole numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure

from harness.report import plots


@pytest.mark.parametrize(("value_s", "text"), [
    (1.0, "1 s"), (10.0, "10 s"), (1.5, "1.5 s"), (0.1, "100 ms"), (0.02, "20 ms"),
    (0.006, "6 ms"), (0.001, "1 ms"), (5e-4, "500 µs"), (2e-5, "20 µs"),
])
def test_seconds_label(value_s: float, text: str) -> None:
    assert plots.seconds_label(value_s) == text


def _labels(ax, which: str = "both") -> list[str]:
    return [t.get_text() for t in ax.xaxis.get_ticklabels(which=which) if t.get_text()]


@pytest.mark.parametrize(("low", "high", "expected"), [
    (0.006, 0.03, {"10 ms", "20 ms"}),   # under a decade: minor ticks labelled too
    (0.05, 12.0, {"100 ms", "1 s", "10 s"}),  # several decades: only the decades
])
def test_log_time_axis_has_plain_labels(low: float, high: float, expected: set[str]) -> None:
    fig = Figure()
    ax = fig.subplots()
    ax.plot([low, high], [0, 1])
    ax.set_xscale("log")
    plots._log_labels(ax.xaxis, plots.seconds_label)
    ax.set_xlim(low, high)
    fig.canvas.draw()
    labels = _labels(ax)
    assert expected <= set(labels), labels
    assert not any("$" in text or "^" in text for text in labels), labels


def test_figures_label_times_plainly_and_count_in_whole_numbers(
        tmp_path: Path, saved: list[Figure]) -> None:
    rng = np.random.default_rng(1)
    latency = {"a": {m: np.exp(rng.uniform(-5, 1, 200)) for m, _ in plots.LATENCY_PANELS}}
    assert plots.latency_cdfs(latency, tmp_path / "latency.png") is not None
    for ax in saved[0].axes:
        labels = _labels(ax)
        assert labels and all(text.endswith((" s", " ms")) for text in labels), labels

    t = np.arange(50, dtype=np.float64)
    waiting = np.zeros(50)
    waiting[25] = 1.0  # one request waited once: the axis must not read 0.2, 0.4, ...
    assert plots.engine_state({"a": plots.EngineState(t, waiting + 3, waiting, t / 100)},
                              tmp_path / "state.png") is not None
    running_ax, waiting_ax, _ = saved[1].axes
    for ax in (running_ax, waiting_ax):
        ticks = [v for v in ax.get_yticks() if ax.get_ylim()[0] <= v <= ax.get_ylim()[1]]
        assert ticks and all(float(v).is_integer() for v in ticks), ticks


def test_the_load_labels_of_close_points_do_not_overlap() -> None:
    """A search's neighbouring probes (6.169, 6.442, 6.727 req/s) sit close together on the
    throughput-latency figure: their load labels were drawn on top of one another."""
    fig = Figure(figsize=(12, 4.4))
    ax = fig.subplots()
    ax.set_yscale("log")
    ax.plot([200, 1400, 1410, 1420, 3000], [30, 6400, 6500, 6600, 2000])
    labels = [("1", 200.0, 30.0, "C0"), ("6.169", 1400.0, 6400.0, "C0"),
              ("6.442", 1410.0, 6500.0, "C0"), ("6.727", 1420.0, 6600.0, "C0")]
    plots._label_points(ax, labels)
    assert [a.get_text() for a in ax.texts] == ["1", "6.169", "6.442", "6.727"]
    assert ax.texts[0].xyann == (3, 3)  # alone: right and above
    # drawn, no two labels' boxes meet
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    boxes = [t.get_window_extent(canvas.get_renderer()) for t in ax.texts]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
