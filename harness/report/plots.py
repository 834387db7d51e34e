"""The report's plots: PNG files written beside ``report.md`` (matplotlib, no display needed).

Each function takes data already read from the run folders, keyed by cell name in report
order, draws one figure and returns the path written, or None when there was nothing to draw.
Figures are built with ``matplotlib.figure.Figure`` (no pyplot state), so plotting is safe in
any process and never needs a display.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import ticker
from matplotlib.axis import Axis, XAxis
from matplotlib.backends.backend_agg import RendererAgg
from matplotlib.figure import Figure

from harness.metrics import attainment_text

DPI = 100
# PNG metadata without the matplotlib version, so a re-render of the same results gives the
# same bytes on the same machine.
_METADATA = {"Software": None}

CDF_POINTS = 2000  # a CDF curve drawn from more points than this is drawn from this many

LATENCY_PANELS = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E latency"))


@dataclass(frozen=True, slots=True)
class EngineState:
    """Engine state over time, from simulation steps or scraped telemetry (None = missing)."""

    t_s: np.ndarray
    num_running: np.ndarray | None = None
    num_waiting: np.ndarray | None = None
    kv_usage: np.ndarray | None = None  # fraction of KV cache in use, 0..1


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One cell of a batch-size sweep."""

    series: str  # which line it belongs to (other settings), "" when only one
    max_num_seqs: int
    tpot_p50_s: float | None
    tpot_p90_s: float | None
    output_tokens_per_s: float | None


def seconds_label(value_s: float) -> str:
    """A tick label for a time in seconds, in the unit a reader thinks in: "500 µs",
    "20 ms", "1.5 s"."""
    if value_s >= 1.0 or value_s <= 0.0:
        return f"{value_s:g} s"
    if value_s >= 1e-3:
        return f"{value_s * 1e3:.3g} ms"
    return f"{value_s * 1e6:.3g} µs"


class _LogLabels(ticker.LogFormatter):
    """Log-axis tick labels as plain numbers ("20 ms", "50", not 2×10⁻²): matplotlib picks
    which ticks may be labelled (decades, and the minor ticks in between when the axis spans
    few decades); ``label`` writes the text. No math text, which is also cheaper to lay out.
    On minor ticks (``minor``), a label only where it fits (``_fitting``): matplotlib labels
    2, 3, 4 and 6 of a decade whatever room the axis gives them ("30 ms40 ms")."""

    def __init__(self, label: Callable[[float], str], *, minor: bool = False) -> None:
        super().__init__(labelOnlyBase=False)
        self._label = label
        self._minor = minor

    def __call__(self, x: float, pos: int | None = None) -> str:
        return self._label(x) if super().__call__(x, pos) else ""

    def format_ticks(self, values: Any) -> list[str]:
        texts = super().format_ticks(values)
        if self._minor and isinstance(self.axis, Axis):
            return _fitting(self.axis, values, texts)
        return texts


def _log_labels(axis: Axis, label: Callable[[float], str] = lambda v: f"{v:g}") -> None:
    """Plain labels on a log-scaled axis (``_LogLabels``), major and minor ticks."""
    axis.set_major_formatter(_LogLabels(label))
    axis.set_minor_formatter(_LogLabels(label, minor=True))


LABEL_GAP_EM = 0.5  # the least room between two tick labels, in the labels' font size
# a minor label's rank among those of as many significant digits, by its last digit: on a
# crowded axis, 50 ms and 20 ms before 30 ms, 35 ms before 32 ms
_ROUNDEST_LAST = "5246837910"


def _fitting(axis: Axis, values: Sequence[float], texts: Sequence[str]) -> list[str]:
    """Minor tick labels (``texts`` of the ticks at ``values``) thinned so that no two labels
    on the axis overlap: the major labels all kept, then the minor ones roundest first (fewest
    significant digits, then ``_ROUNDEST_LAST``), each where its extent along the axis, and
    half the gap either side, meets no label kept before. Extents are measured as drawn, at
    the figure's dpi."""
    low, high = sorted(axis.get_view_interval())
    if not 0 < low < high:
        return list(texts)
    horizontal = isinstance(axis, XAxis)
    bbox = axis.axes.bbox
    length_px = bbox.width if horizontal else bbox.height
    dpi = axis.axes.figure.dpi
    prop = axis.get_minor_ticks(1)[0].label1.get_fontproperties()
    renderer = _measurer(dpi)
    gap_px = LABEL_GAP_EM * prop.get_size_in_points() * dpi / 72

    def in_view(value: float) -> bool:
        return low * (1 - 1e-9) <= value <= high * (1 + 1e-9)

    def extent(value: float, text: str) -> tuple[float, float]:
        width, height, _ = renderer.get_text_width_height_descent(text, prop, ismath=False)
        half = (width if horizontal else height) / 2 + gap_px / 2
        centre = math.log(value / low) / math.log(high / low) * length_px
        return centre - half, centre + half

    major_values = list(axis.get_majorticklocs())
    major_texts = axis.get_major_formatter().format_ticks(major_values)
    kept = [extent(v, t) for v, t in zip(major_values, major_texts, strict=True)
            if t and in_view(v)]
    fitting = [""] * len(texts)
    for i in sorted((i for i, t in enumerate(texts) if t and in_view(values[i])),
                    key=lambda i: _roundness(values[i])):
        start, end = extent(values[i], texts[i])
        if all(end <= b_start or b_end <= start for b_start, b_end in kept):
            kept.append((start, end))
            fitting[i] = texts[i]
    return fitting


def _roundness(value: float) -> tuple[int, int]:
    """How round a tick value is, roundest lowest: its number of significant digits, then
    its last digit's rank in ``_ROUNDEST_LAST`` (0.035: 2 digits, ending in 5)."""
    digits = f"{value:.6e}".split("e")[0].replace(".", "").rstrip("0") or "0"
    return len(digits), _ROUNDEST_LAST.index(digits[-1])


@functools.cache
def _measurer(dpi: float) -> RendererAgg:
    """A renderer that measures text at ``dpi`` and draws nothing (one per dpi)."""
    return RendererAgg(1, 1, dpi)


def _save(fig: Figure, path: Path, note: str | None = None) -> Path:
    """Write the figure; ``note`` (what its figures are: "predicted ...") in its bottom-right
    corner, so that the figure says so wherever it is shown."""
    if note and fig.get_layout_engine() is not None:  # a solver lays out a figure's title
        fig.suptitle(note, x=0.995, ha="right", fontsize=7, color="0.35")
    elif note:  # fixed margins: the axes move down to leave the note a strip at the top
        height = fig.get_size_inches()[1]
        fig.subplots_adjust(top=fig.subplotpars.top - NOTE_STRIP_IN / height)
        fig.text(0.995, 1 - 0.03 / height, note, ha="right", va="top", fontsize=7,
                 color="0.35")
    # a reader (or a run stopped while its figures are drawn) finds the old file or the new
    # one, never part of one; the name of the part names the process writing it
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        fig.savefig(part, dpi=DPI, metadata=_METADATA, format=path.suffix.lstrip(".") or "png")
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)
    return path


# The run figures (latency CDFs, engine state, throughput) have fixed margins, in inches: a
# layout solver ("constrained") measured every text box several times per save and cost more
# than drawing the figures themselves. Room for tick labels of up to six digits and one axis
# label; below them, a legend of all cells (``_legend_below``).
LEGEND_ROWS_IN_HEIGHT = 2  # legend rows a figure's height has room for: up to 8 cells
LEGEND_ROW_IN = 0.3  # the room for each of them
LEGEND_NCOLS = 4
LEGEND_PAD_IN = 0.05  # between a longer legend, as measured, and the axis labels above it
NOTE_STRIP_IN = 0.15  # above the axes, for a figure's note (_save)


def _fixed_margins(fig: Figure, nrows: int, ncols: int, *, left: float = 0.8,
                   right: float = 0.15, top: float = 0.1, bottom: float = 0.55,
                   wgap: float = 0.0, hgap: float = 0.0) -> None:
    """Place the figure's grid of axes with these margins and gaps between axes (inches)."""
    width, height = fig.get_size_inches()
    axes_w = (width - left - right - (ncols - 1) * wgap) / ncols
    axes_h = (height - top - bottom - (nrows - 1) * hgap) / nrows
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height,
                        top=1 - top / height, wspace=wgap / axes_w, hspace=hgap / axes_h)


def _legend_below(fig: Figure, handles: list, labels: list[str], *, bottom: float = 0.55,
                  rows_in_height: int = LEGEND_ROWS_IN_HEIGHT) -> float:
    """One legend for all panels, centred at the bottom of the figure, in as many columns (up
    to LEGEND_NCOLS) as its width holds; returns the bottom margin for ``_fixed_margins``:
    ``bottom`` (inches, for the tick and axis labels) plus the legend's room.

    Up to ``rows_in_height`` rows, the room is LEGEND_ROW_IN a row within the figure's
    height. A longer legend (a few dozen cells: every probe of a capacity search is one) is
    measured, and the figure grows by what it takes beyond that, so that the axes keep their
    height: in a fixed height such a legend left the axes none."""
    if not handles:
        return bottom
    renderer = RendererAgg(1, 1, fig.dpi)  # measures the legend's text; draws nothing
    width_in = fig.get_size_inches()[0]
    ncols = min(len(labels), LEGEND_NCOLS)
    while True:
        legend = fig.legend(handles, labels, loc="lower center", ncols=ncols,
                            bbox_to_anchor=(0.5, 0.0), borderaxespad=0.2)
        box = legend.get_window_extent(renderer)
        if ncols == 1 or box.width / fig.dpi <= width_in:
            break
        legend.remove()  # wider than the figure: its outer columns would be cut off
        ncols -= 1
    rows = -(-len(labels) // ncols)
    if rows <= rows_in_height:
        return bottom + LEGEND_ROW_IN * rows
    room = max(box.height / fig.dpi + LEGEND_PAD_IN, LEGEND_ROW_IN * rows_in_height)
    width, height = fig.get_size_inches()
    fig.set_size_inches(width, height + room - LEGEND_ROW_IN * rows_in_height)
    return bottom + room


def _same_as(series: Mapping[str, Sequence[np.ndarray | None]]) -> dict[str, str]:
    """Each series' legend label: its name, and " (same as X)" when its arrays are those of an
    earlier series X, whose line is then drawn exactly under its own and would not be seen
    (two settings that ran alike: a batch cap the run never reached)."""
    labels: dict[str, str] = {}
    seen: list[tuple[str, Sequence[np.ndarray | None]]] = []
    for name, arrays in series.items():
        same = next((other for other, earlier in seen
                     if len(earlier) == len(arrays) and all(
                         (a is None and b is None) or (a is not None and b is not None
                                                       and np.array_equal(a, b))
                         for a, b in zip(earlier, arrays, strict=True))), None)
        labels[name] = name + (f" (same as {same})" if same is not None else "")
        if same is None:
            seen.append((name, arrays))
    return labels


def latency_cdfs(series: Mapping[str, Mapping[str, np.ndarray]], path: Path, *,
                 note: str | None = None) -> Path | None:
    """TTFT, TPOT and E2E CDFs, one line per cell (log time axis: cells differ by orders)."""
    if not any(np.size(v) for per_cell in series.values() for v in per_cell.values()):
        return None
    fig = Figure(figsize=(13, 4))
    axes = fig.subplots(1, len(LATENCY_PANELS))
    labels = _same_as({name: [per_cell.get(m) for m, _ in LATENCY_PANELS]
                       for name, per_cell in series.items()})
    for ax, (metric, title) in zip(axes, LATENCY_PANELS, strict=True):
        drawn = False
        span = [math.inf, 0.0]  # the panel's smallest and largest value
        for name, per_cell in series.items():
            values = np.asarray(per_cell.get(metric, np.empty(0)), dtype=np.float64)
            values = np.sort(values[np.isfinite(values) & (values > 0)])
            if values.size == 0:
                continue
            span = [min(span[0], float(values[0])), max(span[1], float(values[-1]))]
            y = np.arange(1, values.size + 1) / values.size
            if values.size > CDF_POINTS:  # the same picture from evenly spaced quantiles
                keep = np.unique(np.linspace(0, values.size - 1, CDF_POINTS).round().astype(int))
                values, y = values[keep], y[keep]
            ax.step(values, y, where="post", label=labels[name])
            drawn = True
        ax.set_title(title)
        ax.set_xlabel("log scale")
        ax.set_ylim(0, 1.01)
        ax.grid(True, alpha=0.3)
        if drawn:
            ax.set_xscale("log")
            if span[1] <= span[0] * (1 + 1e-9):
                # every request alike (a synthetic trace, one user): limits a rounding error
                # apart are no width on a log axis; a factor of 2 either side shows the step
                ax.set_xlim(span[0] / 2, span[1] * 2)
            _log_labels(ax.xaxis, seconds_label)
    axes[0].set_ylabel("fraction of requests")
    bottom = _legend_below(fig, *axes[0].get_legend_handles_labels())
    # right: room for half the last tick label of a log axis ("1000 s") past the axes
    _fixed_margins(fig, 1, len(LATENCY_PANELS), left=0.65, right=0.35, top=0.35, wgap=0.45,
                   bottom=bottom)
    return _save(fig, path, note)


def engine_state(series: Mapping[str, EngineState], path: Path, *,
                 note: str | None = None) -> Path | None:
    """Running batch size, waiting queue and KV usage over time, one line per cell."""
    panels = (("num_running", "running requests"), ("num_waiting", "waiting requests"),
              ("kv_usage", "KV used (% of own cache)"))
    present = [(attr, label) for attr, label in panels
               if any(getattr(s, attr) is not None and s.t_s.size for s in series.values())]
    if not present:
        return None
    fig = Figure(figsize=(11, 2.6 * len(present) + 0.6))
    axes = np.atleast_1d(fig.subplots(len(present), 1, sharex=True))
    labels = _same_as({name: [s.t_s, *(getattr(s, attr) for attr, _ in present)]
                       for name, s in series.items()})
    for ax, (attr, label) in zip(axes, present, strict=True):
        for name, state in series.items():
            values = getattr(state, attr)
            if values is None or state.t_s.size == 0:
                continue
            scale = 100.0 if attr == "kv_usage" else 1.0
            ax.step(state.t_s, np.asarray(values, dtype=np.float64) * scale, where="post",
                    label=labels[name], linewidth=1)
        ax.set_ylabel(label)
        _, top = ax.get_ylim()
        ax.set_ylim(0, max(top, 1.0))  # from zero: a queue that stayed empty is a line at 0
        if attr != "kv_usage":  # request counts: whole numbers on the axis
            ax.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("time since the first arrival (s)")
    bottom = _legend_below(fig, *axes[0].get_legend_handles_labels())
    _fixed_margins(fig, len(present), 1, hgap=0.15, bottom=bottom)
    return _save(fig, path, note)


def envelope(t: np.ndarray, series: Sequence[np.ndarray | None], columns: int) -> np.ndarray:
    """Which points of time series sharing the instants ``t`` (ascending) a plot
    ``columns`` pixels wide needs: of each series, in each equal slice of time, the first and
    last points and the lowest and highest (the "M4" reduction of Jugel et al., VLDB 2014);
    their union, in time order. Lines through them span the same range in every slice as
    lines through every point, a one-step spike included; only stretches where thousands of
    segments overlap come out a shade lighter (fewer antialiased strokes). Every index when
    there are no more than 4 points a column."""
    if t.size <= 4 * columns:
        return np.arange(t.size)
    edges = np.linspace(t[0], t[-1], columns + 1)
    col = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, columns - 1)
    first = np.flatnonzero(np.r_[True, col[1:] != col[:-1]])  # t ascending: columns are runs
    last = np.r_[first[1:], t.size] - 1
    keep = [first, last]
    for y in series:
        if y is not None:
            keep += _lowest_highest(np.asarray(y), col, first)
    return np.unique(np.concatenate(keep))


def _lowest_highest(y: np.ndarray, col: np.ndarray, first: np.ndarray) -> list[np.ndarray]:
    """In each run of points starting at ``first`` (a column's), where ``y`` is lowest (its
    first point of that value) and where highest (its last): what sorting each run by value
    gives, stably, at its two ends, in a few passes over ``y`` rather than a sort. A series
    with NaN (which a sort puts last) is sorted."""
    if y.dtype.kind == "f" and np.isnan(y).any():
        by_value = np.lexsort((y, col))  # within each run of a column, lowest to highest
        return [by_value[first], by_value[np.r_[first[1:], y.size] - 1]]
    sizes = np.diff(np.r_[first, y.size])
    index = np.arange(y.size)
    at_lowest = y == np.repeat(np.minimum.reduceat(y, first), sizes)
    at_highest = y == np.repeat(np.maximum.reduceat(y, first), sizes)
    return [np.minimum.reduceat(np.where(at_lowest, index, y.size), first),
            np.maximum.reduceat(np.where(at_highest, index, -1), first)]


THROUGHPUT_BINS = 60  # slices of the throughput figure's time axis


def token_bin_edges(end_s: float, num_bins: int = THROUGHPUT_BINS) -> np.ndarray:
    """The throughput figure's equal slices of time, from 0 (each run's first arrival) to
    ``end_s``, the last token of any of its runs."""
    return np.linspace(0.0, end_s if end_s > 0 else 1.0, num_bins + 1)


def tokens_binned(t_s: np.ndarray, tokens: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The tokens delivered in each slice of ``edges`` (``token_bin_edges``) by the chunks at
    ``t_s`` (from the first arrival) carrying ``tokens`` each: float sums. Whole numbers of
    tokens sum exactly, so that adding this over parts of a run's chunks gives what it gives
    over all of them."""
    # equal bins given as a count: numpy bins by arithmetic, the same counts as bins=edges
    # without sorting millions of instants
    counts, _ = np.histogram(t_s, bins=edges.size - 1, range=(edges[0], edges[-1]),
                             weights=np.asarray(tokens, dtype=np.float64))
    return counts


@dataclass(frozen=True, slots=True)
class TokenRate:
    """One run's line in the throughput figure: ``counts``, its tokens in each slice of the
    figure's edges (``tokens_binned``), and ``last_s``, when its last token came."""

    counts: np.ndarray
    last_s: float


def throughput_over_time(series: Mapping[str, TokenRate], edges: np.ndarray, path: Path, *,
                         note: str | None = None) -> Path | None:
    """Output tokens per second over time (tokens delivered per slice of ``edges`` / slice
    width), one line per cell."""
    if not series:
        return None
    num_bins = edges.size - 1
    width = edges[1] - edges[0]
    fig = Figure(figsize=(11, 3.6))
    ax = fig.subplots()
    shown = _same_as({name: [rate.counts, np.array([rate.last_s])]
                      for name, rate in series.items()})
    for name, rate in series.items():
        # each cell's line ends with its last token: a finished run is not a run at 0 tok/s
        n = max(1, min(num_bins, int(np.searchsorted(edges, rate.last_s, side="right"))))
        per_s = rate.counts[:n] / width
        ax.step(edges[:n + 1], np.r_[per_s, per_s[-1]], where="post", label=shown[name],
                linewidth=1)
    ax.set_xlabel("time since the first arrival (s)")
    ax.set_ylabel("output tokens/s")
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if len(labels) <= LEGEND_NCOLS * LEGEND_ROWS_IN_HEIGHT:
        ax.legend(loc="best", fontsize="small")
        _fixed_margins(fig, 1, 1)
    else:  # inside the axes, a legend this long would hide the lines; below, it adds height
        _fixed_margins(fig, 1, 1, bottom=_legend_below(fig, handles, labels, rows_in_height=0))
    return _save(fig, path, note)


def batch_size_sweep(points: Sequence[SweepPoint], path: Path, *,
                     tpot_slo_s: float | None = None, note: str | None = None) -> Path | None:
    """TPOT (p50, p90) and output throughput against max_num_seqs: the cap on the running
    batch each cell set, not the batch that ran, which is titled and labelled so."""
    points = [p for p in points if p.max_num_seqs > 0]
    if len({p.max_num_seqs for p in points}) < 2:
        return None
    fig = Figure(figsize=(11, 4), layout="constrained")
    ax_tpot, ax_tp = fig.subplots(1, 2)
    for series in dict.fromkeys(p.series for p in points):
        pts = sorted((p for p in points if p.series == series), key=lambda p: p.max_num_seqs)
        x = [p.max_num_seqs for p in pts]
        suffix = f" ({series})" if series else ""
        for attr, style, label in (("tpot_p50_s", "o-", "p50"), ("tpot_p90_s", "s--", "p90")):
            y = [np.nan if getattr(p, attr) is None else getattr(p, attr) * 1e3 for p in pts]
            ax_tpot.plot(x, y, style, label=f"TPOT {label}{suffix}")
        y_tp = [np.nan if p.output_tokens_per_s is None else p.output_tokens_per_s for p in pts]
        ax_tp.plot(x, y_tp, "o-", label=f"output tokens/s{suffix}")
    if tpot_slo_s is not None:
        ax_tpot.axhline(tpot_slo_s * 1e3, color="red", linestyle=":",
                        label=f"TPOT SLO ({tpot_slo_s * 1e3:g} ms)")
    caps = sorted({p.max_num_seqs for p in points})
    for ax, ylabel in ((ax_tpot, "TPOT (ms)"), (ax_tp, "output tokens/s")):
        ax.set_xscale("log", base=2)
        # a tick at every cap swept, and only there (the log locator skipped 512 of 1..512)
        ax.xaxis.set_major_locator(ticker.FixedLocator(caps))
        ax.xaxis.set_minor_locator(ticker.NullLocator())
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        # the cap a sweep sets, not the batch that ran (its running mean is lower)
        ax.set_xlabel("max_num_seqs (the cap on the running batch)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    ax_tpot.set_title("TPOT against max_num_seqs")
    ax_tp.set_title("Throughput against max_num_seqs")
    return _save(fig, path, note)


@dataclass(frozen=True, slots=True)
class CapacityMark:
    """A setting's capacity at the SLO, as the report's capacity table gives it: the highest
    load at which the share of requests meeting every SLO kept ``target``."""

    load: float  # in the unit of the line's loads
    text: str  # "10.37 req/s", "≥ 16 req/s" (``curves.capacity_text``)
    target: float  # the SLO attainment it kept, 0..1


@dataclass(frozen=True, slots=True)
class CurveLine:
    """One engine × knob setting across its load points (ascending load)."""

    label: str
    loads: Sequence[float]
    output_tokens_per_s: Sequence[float | None]
    tpot_p50_s: Sequence[float | None]
    tpot_p90_s: Sequence[float | None]
    ttft_p90_s: Sequence[float | None]
    stopped: Sequence[bool] = ()  # stopped early (over-saturated): partial figures, marked x
    capacity: CapacityMark | None = None  # marked where the line reaches its load
    # what its loads are (``curves.Series.kind``: "rate", "time_scale", "concurrency"), which
    # the points' labels and the panel's title say; "" when not known: the numbers alone
    load_kind: str = ""
    # fell behind its arrivals: its throughput is what it managed, not the load offered (a
    # lower bound of what it would serve of a longer run at that load), circled
    behind: Sequence[bool] = ()


# what the points' load labels are, by the kind of load, in the TTFT panel's title
_LOAD_UNITS = {"rate": "labelled in req/s", "concurrency": "labelled in users",
               "time_scale": "labelled with the time scale"}


def _load_label(load: float, kind: str) -> str:
    """A point's load label: "2" (a rate or users, the title saying which), "time ×2" (a
    time scale: the recorded arrivals slowed twice, no count of anything)."""
    return f"time ×{load:g}" if kind == "time_scale" else f"{load:g}"


def _load_title(lines: Sequence[CurveLine]) -> str:
    """What the TTFT panel's point labels are: "labelled in req/s", or "labelled with their
    load" when the lines' kinds of load differ or are not known."""
    kinds = {line.load_kind for line in lines}
    said = _LOAD_UNITS.get(next(iter(kinds))) if len(kinds) == 1 else None
    return said or "labelled with their load"


# where a point's label may go, in points from the point, tried in turn: right and up first
_LABEL_OFFSETS = ((3, 3), (3, -9), (3, 11), (3, -17), (-3, 3), (-3, -9), (3, 19), (3, -25))
_LABEL_HEIGHT_PT = 7.0
_LABEL_CHAR_PT = 4.2  # x-small digits


def _label_points(ax: Any, labels: Sequence[tuple[str, float, float, str]]) -> None:
    """Each point labelled with its text, at the first offset (``_LABEL_OFFSETS``) where it
    overlaps no label placed before (a search's neighbouring probes sit close together);
    on top of the last one tried when none is free. Positions are estimated from the axes'
    limits and size before layout: close enough to keep labels apart."""
    ax.autoscale_view()
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    width_pt = ax.figure.get_figwidth() * 72 * ax.get_position().width
    height_pt = ax.figure.get_figheight() * 72 * ax.get_position().height
    log_y = ax.get_yscale() == "log"

    def at(xv: float, yv: float) -> tuple[float, float]:
        fy = ((math.log10(yv) - math.log10(y0)) / (math.log10(y1) - math.log10(y0)) if log_y
              else (yv - y0) / (y1 - y0))
        return (xv - x0) / (x1 - x0) * width_pt, fy * height_pt

    placed: list[tuple[float, float, float, float]] = []  # boxes: left, bottom, right, top
    for text, xv, yv, color in labels:
        px, py = at(xv, yv)
        width = _LABEL_CHAR_PT * len(text)
        box = (0.0, 0.0, 0.0, 0.0)
        offset = _LABEL_OFFSETS[0]
        for offset in _LABEL_OFFSETS:
            left = px + offset[0] if offset[0] >= 0 else px + offset[0] - width
            box = (left, py + offset[1], left + width, py + offset[1] + _LABEL_HEIGHT_PT)
            if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3]
                       for b in placed):
                break
        placed.append(box)
        ax.annotate(text, (xv, yv), textcoords="offset points", xytext=offset,
                    ha="left" if offset[0] >= 0 else "right", fontsize="x-small", color=color)


def throughput_latency(lines: Sequence[CurveLine], path: Path, *,
                       slo: Mapping[str, float] | None = None,
                       note: str | None = None) -> Path | None:
    """Output tokens/s against TPOT (p50, p90) and against TTFT p90, one line per setting,
    each point labelled with its load; the SLOs as horizontal lines, each a limit on every
    request; a setting's capacity (``CurveLine.capacity``) as a vertical line.

    A percentile crossing its SLO line is not the capacity: a capacity is the highest load at
    which the share of requests meeting every SLO at once kept the target (99% by default),
    which no single p90 shows; so the capacity found is drawn, its legend saying by what."""
    if not any(len(line.loads) >= 2 for line in lines):
        return None
    fig = Figure(figsize=(12, 4.4), layout="constrained")
    ax_tpot, ax_ttft = fig.subplots(1, 2)

    def arr(values: Sequence[float | None], scale: float = 1.0) -> np.ndarray:
        return np.array([np.nan if v is None else v * scale for v in values], dtype=np.float64)

    marked = False
    circled: set[Any] = set()
    labels: list[tuple[str, float, float, str]] = []  # (text, x, y, color) on the TTFT panel
    # several settings' capacities at one target: what a capacity is, said once in the legend
    targets = {line.capacity.target for line in lines if line.capacity is not None}
    shared = len(lines) > 1 and len(targets) == 1
    capacities = 0
    for i, line in enumerate(lines):
        color = f"C{i % 10}"
        x = arr(line.output_tokens_per_s)
        stopped = np.array([bool(v) for v in line.stopped] or [False] * len(x), dtype=bool)
        full = ~stopped  # a stopped probe's figures are partial: a mark, not a point of the line
        panels = ((ax_tpot, arr(line.tpot_p50_s, 1e3), "o-", f"{line.label} p50"),
                  (ax_tpot, arr(line.tpot_p90_s, 1e3), "s--", f"{line.label} p90"),
                  (ax_ttft, arr(line.ttft_p90_s, 1e3), "s--", line.label))
        behind = np.array([bool(v) for v in line.behind] or [False] * len(x), dtype=bool)
        for ax, y, style, label in panels:
            ax.plot(x[full], y[full], style, color=color, label=label)
            if (behind & full).any():
                ax.plot(x[behind & full], y[behind & full], "o", markersize=12,
                        markerfacecolor="none", markeredgecolor=color, linestyle="none",
                        label=None if ax in circled else "fell behind its arrivals (circled)")
                circled.add(ax)  # said once in each panel's legend
            if stopped.any():
                ax.plot(x[stopped], y[stopped], "x", color=color, linestyle="none",
                        label=None if marked else "stopped early (partial)")
                marked = True
        at = _capacity_tokens_per_s(line, x, full)
        if at is not None and line.capacity is not None:
            for ax in (ax_tpot, ax_ttft):
                ax.axvline(at, color=color, linestyle="-.", linewidth=1.2,
                           label=_capacity_label(line, len(lines) > 1, criterion=not shared))
            capacities += 1
        labels += [(_load_label(load, line.load_kind), xv, yv, color) for load, xv, yv in
                   zip(line.loads, x, arr(line.ttft_p90_s, 1e3), strict=True)
                   if np.isfinite(xv) and np.isfinite(yv) and yv > 0]
    if shared and capacities:
        (target,) = targets
        for ax in (ax_tpot, ax_ttft):  # an entry, no line: what the vertical lines mark
            ax.plot([], [], color="0.3", linestyle="-.", linewidth=1.2,
                    label=f"capacity: {_criterion(target)}")
    ax_ttft.set_yscale("log")  # queueing makes TTFT grow by orders of magnitude
    # room on the right for the last point's label ("time ×2" needs more than "6.169")
    ax_ttft.margins(x=0.08 if all(len(text) <= 5 for text, *_ in labels) else 0.14)
    _label_points(ax_ttft, labels)
    for ax, key, title in ((ax_tpot, "tpot_s", "TPOT p50 / p90 (ms)"),
                           (ax_ttft, "ttft_s", "TTFT p90 (ms)")):
        limit = (slo or {}).get(key)
        if limit is not None:
            ax.axhline(limit * 1e3, color="red", linestyle=":",
                       label=f"{key.split('_')[0].upper()} SLO ({limit * 1e3:g} ms), "
                             "a limit on each request")
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize="x-small")
    ax_tpot.set_ylim(bottom=0)
    _log_labels(ax_ttft.yaxis)
    ax_tpot.set_title("Throughput against TPOT")
    ax_ttft.set_title(f"Throughput against TTFT (points {_load_title(lines)})")
    return _save(fig, path, note)


def _capacity_tokens_per_s(line: CurveLine, x: np.ndarray, full: np.ndarray) -> float | None:
    """Where a line's capacity goes on the tokens/s axis: its output tokens/s at the
    capacity's load, linear in load between the two points around it (a searched capacity
    is a probed load: that point's); None when the line has no capacity, or no whole points
    around it to place it by (a load beyond them)."""
    if line.capacity is None:
        return None
    loads = np.asarray(line.loads, dtype=np.float64)
    keep = full & np.isfinite(x) & np.isfinite(loads)
    if not keep.any():
        return None
    loads, x = loads[keep], x[keep]
    if not loads[0] <= line.capacity.load <= loads[-1]:
        return None
    return float(np.interp(line.capacity.load, loads, x))


def _capacity_label(line: CurveLine, named: bool, *, criterion: bool) -> str:
    """``capacity 10.37 req/s: ≥ 99.0% of requests met every SLO``; with several settings,
    ``fcfs: capacity 10.37 req/s``, and the criterion only where their targets differ (else
    one legend entry says it for all)."""
    assert line.capacity is not None
    text = f"capacity {line.capacity.text}"
    if not named:
        return f"{text}: {_criterion(line.capacity.target)}"
    return f"{line.label}: {text}" + (f", {_criterion(line.capacity.target)}" if criterion
                                      else "")


def _criterion(target: float) -> str:
    """What decides a capacity, in the words of the report's capacity section."""
    return f"≥ {attainment_text(target)} of requests met every SLO"
