"""The engine-state plot is drawn from each time slice's first, last, lowest and highest points
(``plots.envelope``): every slice spans the range the whole series spans there, a one-step spike
included, from a few thousand points instead of hundreds of thousands of steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from harness.report.plots import envelope
from harness.report.runs import ENGINE_STATE_COLUMNS, read_engine_state
from harness.results import STEPS_FILE, write_parquet_atomic


def _column_ranges(t: np.ndarray, y: np.ndarray, edges: np.ndarray) -> list[tuple]:
    col = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, len(edges) - 2)
    return [(y[col == c].min(), y[col == c].max()) for c in np.unique(col)]


@pytest.mark.parametrize("seed", range(5))
def test_every_slice_of_every_series_keeps_its_range_and_its_ends(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, columns = 20_000 + 997 * seed, 50
    t = np.cumsum(rng.exponential(1.0, n))  # uneven steps, and one stretch very dense
    t[n // 2:n // 2 + 5000] = np.linspace(t[n // 2], t[n // 2] + 1.0, 5000)
    a = rng.integers(0, 30, n).astype(float)
    b = np.zeros(n)
    b[n // 3] = 500.0  # a one-step spike
    keep = envelope(t, (a, None, b), columns)
    assert keep.size <= 2 * 4 * columns and keep.size < n
    assert np.all(np.diff(keep) > 0)  # in time order, each point once
    assert keep[0] == 0 and keep[-1] == n - 1
    assert n // 3 in keep
    edges = np.linspace(t[0], t[-1], columns + 1)
    for y in (a, b):
        assert _column_ranges(t[keep], y[keep], edges) == _column_ranges(t, y, edges)


def test_a_short_series_is_drawn_whole() -> None:
    t = np.arange(100.0)
    assert np.array_equal(envelope(t, (t % 7,), columns=25), np.arange(100))


def test_the_reports_engine_state_shows_a_one_step_spike(tmp_path: Path) -> None:
    """A whole trace's steps, one of which had a waiting queue: the plot's data keeps it (a
    grid of samples would almost surely have stepped over it)."""
    n = 300_000
    t = np.cumsum(np.full(n, 0.008))
    waiting = np.zeros(n, dtype=np.int64)
    waiting[123_457] = 7
    running = (np.arange(n) % 13).astype(np.int64)
    steps = pa.table({"t_s": t, "num_running": running, "num_waiting": waiting,
                      "num_kv_blocks_used": running * 10,
                      "num_kv_blocks_total": np.full(n, 1000, dtype=np.int64)})
    write_parquet_atomic(steps, tmp_path / STEPS_FILE)
    state = read_engine_state(tmp_path)
    assert state is not None and state.t_s.size <= 3 * 4 * ENGINE_STATE_COLUMNS
    assert state.num_waiting is not None and state.num_waiting.max() == 7
    assert state.num_running is not None and state.num_running.max() == 12
    assert state.kv_usage is not None and state.kv_usage.max() == pytest.approx(0.12)
    assert state.t_s[0] == t[0] and state.t_s[-1] == t[-1]


def test_a_series_identical_to_an_earlier_one_says_so_in_the_legend() -> None:
    """Two settings that ran alike (a batch cap the run never reached) draw one line exactly
    over the other: the legend listed a series nobody could see."""
    from harness.report.plots import _same_as

    t = np.arange(10.0)
    labels = _same_as({"cap-256": [t, t % 3], "cap-512": [t.copy(), t % 3],
                       "cap-64": [t, t % 2], "cap-1024": [t, t % 3]})
    assert labels == {"cap-256": "cap-256", "cap-512": "cap-512 (same as cap-256)",
                      "cap-64": "cap-64", "cap-1024": "cap-1024 (same as cap-256)"}
    assert _same_as({"a": [t, None], "b": [t, None], "c": [t, t]}) == {
        "a": "a", "b": "b (same as a)", "c": "c"}


def _sorted_envelope(t: np.ndarray, series: tuple, columns: int) -> np.ndarray:
    """``envelope`` as it was first written: each column's run of points sorted by value."""
    edges = np.linspace(t[0], t[-1], columns + 1)
    col = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, columns - 1)
    first = np.flatnonzero(np.r_[True, col[1:] != col[:-1]])
    last = np.r_[first[1:], t.size] - 1
    keep = [first, last]
    for y in series:
        by_value = np.lexsort((y, col))
        keep += [by_value[first], by_value[last]]
    return np.unique(np.concatenate(keep))


@pytest.mark.parametrize("seed", range(4))
def test_the_points_kept_are_those_sorting_each_column_would_keep(seed: int) -> None:
    """Ties (whole-number counts repeat within a column: the first lowest and the last
    highest are kept), NaN (a KV usage not scraped) and integer columns."""
    rng = np.random.default_rng(seed)
    n, columns = 30_000, 40
    t = np.sort(rng.uniform(0.0, 100.0, n))
    counts = rng.integers(0, 4, n)  # ties everywhere
    usage = rng.uniform(0.0, 1.0, n).round(1)
    with_nan = usage.copy()
    with_nan[rng.choice(n, 50, replace=False)] = np.nan
    for series in ((counts,), (usage,), (with_nan,), (counts.astype(float), usage, with_nan)):
        assert np.array_equal(envelope(t, series, columns), _sorted_envelope(t, series, columns))
