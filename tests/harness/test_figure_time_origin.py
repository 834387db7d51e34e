"""The throughput and engine-state figures count time from the run's first arrival, as their
axes say and as ``duration_s`` does (docs/metrics.md): a trace window whose first request
arrives 1.3 s after the window opens is not drawn with 1.3 s of nothing before it, which
lowered every throughput slice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from adapters.reference import ReferenceConfig
from harness.report import plots
from harness.report.render import draw_run_figure, run_figures_after
from harness.sim import run_simulation
from harness.traces import TraceOptions, load_trace

REPO = Path(__file__).resolve().parents[2]


def test_time_axes_start_at_the_first_arrival(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    trace = load_trace(REPO / "harness" / "data" / "azure_conv_excerpt.csv",
                       TraceOptions(start_s=3, limit=20))
    run = tmp_path / "run"
    run_simulation(trace, ReferenceConfig(policy="fcfs"), run, write_report=False)
    first = float(np.min(pq.read_table(run / "requests.parquet")["arrival_s"].to_numpy()))
    assert first > 1.0  # the window opens before its first request arrives

    seen: dict[str, Any] = {}

    def capture(kind: str) -> Any:
        def draw(series: Any, *args: Any, **kwargs: Any) -> Path:
            seen[kind] = next(iter(series.values()))
            seen[f"{kind} args"] = args
            return args[-1]
        return draw

    monkeypatch.setattr(plots, "throughput_over_time", capture("throughput"))
    monkeypatch.setattr(plots, "engine_state", capture("state"))
    # the engine-state figure waits for requests.parquet, which says where time starts
    assert "engine_state.png" not in run_figures_after("steps.parquet")
    assert "engine_state.png" in run_figures_after("requests.parquet")
    assert draw_run_figure(run, "engine_state.png")
    assert "throughput.png" in run_figures_after("chunks.parquet")
    assert draw_run_figure(run, "throughput.png")

    chunk_t = pq.read_table(run / "chunks.parquet")["t_s"].to_numpy()
    step_t = pq.read_table(run / "steps.parquet")["t_s"].to_numpy()
    rate, (edges, _) = seen["throughput"], seen["throughput args"]
    # the slices run from the first arrival to the last token; the first token's falls in
    # the slice its time since the first arrival says
    assert edges[0] == 0 and edges[-1] == rate.last_s == pytest.approx(chunk_t.max() - first)
    first_token = chunk_t.min() - first
    assert first_token >= 0
    assert np.flatnonzero(rate.counts)[0] == int(first_token // (edges[1] - edges[0]))
    assert rate.counts.sum() == len(chunk_t)  # one token a chunk, every one of them counted
    assert seen["state"].t_s[0] == pytest.approx(step_t[0] - first)
    assert seen["state"].t_s[0] >= 0
