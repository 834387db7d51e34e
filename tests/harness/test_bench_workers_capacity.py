"""bench/workers_capacity.py's CPU shares are over one window (t0 to replay_workers' return),
checked with fabricated counters: no replay runs and nothing is timed."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[2]
T0_NS = 10_000_000_000


@pytest.fixture
def wc(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    return importlib.import_module("workers_capacity")


def test_worker_server_and_machine_shares_divide_by_one_window(
        wc: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # t0 at 10 s, the return at 14 s: a 4 s window. The requests' own span (duration_s) is 3 s
    # and must not be the divisor.
    start = wc.CpuMark(T0_NS, server_s=5.0, machine=(1_000, 2_000), parent_s=1.0)
    end = wc.CpuMark(T0_NS + 4_000_000_000, server_s=7.0, machine=(1_600, 2_800),
                     parent_s=1.4)

    def replay_workers(trace: Any, config: Any, out: Path, *, num_workers: int,
                       on_t0: Any) -> dict[str, Any]:
        on_t0(T0_NS)
        out.mkdir(parents=True)
        pq.write_table(pa.table({"sent_s": [0.0, 1.0, 2.0], "error_kind": [None, None, None]}),
                       out / "requests.parquet")
        return {"duration_s": 3.0, "send_lag_s": {"p50": 0.0, "p99": 0.0},
                "throughput": {"output_tokens_per_s": 16.0},
                "workers": [{"cpu_s": 3.0, "send_lag_s_p99": 0.0}]}

    monkeypatch.setattr(wc, "replay_workers", replay_workers)
    monkeypatch.setattr(wc, "mark_at", lambda t0_ns, pid: start)
    monkeypatch.setattr(wc, "cpu_mark", lambda pid: end)
    r = wc.step("http://127.0.0.1:1", 1, 1, 1.0, 3.0, tmp_path / "run")
    assert r["window_s"] == 4.0
    assert r["worker_cpu"] == [0.75]
    assert r["server_cpu"] == 0.5
    assert r["parent_cpu"] == pytest.approx(0.1)
    assert r["machine_busy"] == 0.75


def test_the_limit_counts_the_parent_with_the_server_and_workers(wc: ModuleType,
                                                                monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    monkeypatch.setattr(wc.os, "cpu_count", lambda: 2)
    row = {"server_cpu": 0.6, "worker_cpu": [0.6], "parent_cpu": 0.6, "machine_busy": 0.9}
    assert "server, workers and parent used 1.80 of 2 cores" in wc.limit_of(row)
