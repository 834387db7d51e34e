"""``replay --workers N``: the trace split across processes on one clock, merged into one run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from harness.cli import main as cli_main
from harness.live.config import ReplayConfig
from harness.live.testing import ScheduledStreamServer, server_in_thread
from harness.live.workers import merge_timelines, replay_workers, split_trace, worker_configs
from harness.timeline import RequestTimeline
from harness.traces import Trace, TraceRequest

TTFT_S = 0.02


def _trace(n: int, gap_s: float = 0.004) -> Trace:
    reqs = tuple(TraceRequest(f"r{i}", i * gap_s, 16, 6) for i in range(n))
    return Trace(reqs, source="test", format="test", digest="b" * 64)


@pytest.fixture()
def server() -> Iterator[ScheduledStreamServer]:
    """The loopback server on its own event loop thread: worker processes reach it over TCP."""
    with server_in_thread(ttft_s=TTFT_S, itl_s=0.004) as srv:
        yield srv


def test_split_is_round_robin_and_keeps_the_schedule() -> None:
    trace = _trace(10)
    parts = split_trace(trace, 3)
    assert [[r.request_id for r in p.requests] for p in parts] == [
        ["r0", "r3", "r6", "r9"], ["r1", "r4", "r7"], ["r2", "r5", "r8"]]
    assert parts[1].requests[1].arrival_s == trace.requests[4].arrival_s
    assert len({p.digest for p in parts}) == 3


def test_users_and_slots_are_split_and_never_below_one() -> None:
    closed = ReplayConfig(target_url="http://127.0.0.1:1", mode="closed", concurrency=5)
    assert [c.concurrency for c in worker_configs(closed, 2)] == [3, 2]
    with pytest.raises(ValueError, match="concurrency: 1 cannot be split across 2 workers"):
        worker_configs(ReplayConfig(target_url="http://127.0.0.1:1", mode="closed",
                                    concurrency=1), 2)


def test_merge_refuses_a_request_recorded_twice_and_orders_by_arrival() -> None:
    def tl(rid: str, arrival: float) -> RequestTimeline:
        return RequestTimeline(request_id=rid, arrival_s=arrival, num_prompt_tokens=1,
                               num_target_output_tokens=1)

    merged = merge_timelines([[tl("a", 0.3), tl("c", 0.1)], [tl("b", 0.2)]])
    assert [t.request_id for t in merged] == ["c", "b", "a"]
    with pytest.raises(ValueError, match="more than one worker: a"):
        merge_timelines([[tl("a", 0.1)], [tl("a", 0.1)]])


def test_two_workers_send_every_request_once_on_one_clock(
        server: ScheduledStreamServer, tmp_path: Path) -> None:
    trace = _trace(120)
    summary = replay_workers(trace, ReplayConfig(target_url=server.url), tmp_path,
                             num_workers=2)
    ids = [r.request_id for r in trace.requests]
    # the server saw each request exactly once: none sent twice, none lost
    assert sorted(server.stats.request_ids) == sorted(ids)
    table = pq.read_table(tmp_path / "requests.parquet").to_pydict()
    assert sorted(table["request_id"]) == sorted(ids)
    assert table["arrival_s"] == sorted(table["arrival_s"])  # merged in time order
    assert summary["num_completed"] == 120
    # One clock: every worker ran on the parent's t0, and no request went out before its
    # arrival on it.
    for sent, arrival in zip(table["sent_s"], table["arrival_s"], strict=True):
        assert sent >= arrival
    workers = summary["workers"]
    assert [w["num_requests"] for w in workers] == [60, 60]
    assert all(w["send_lag_s_p99"] is not None for w in workers)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["workers"]["num_workers"] == 2
    assert manifest["num_not_sent"] == 0 and manifest["t0_perf_counter_ns"] > 0
    assert manifest["num_sent"] == 120  # the workers' sends, summed
    for w in range(2):
        folder = tmp_path / "workers" / f"w{w}"
        assert (folder / "requests.parquet").exists()
        worker_manifest = json.loads((folder / "manifest.json").read_text())
        assert worker_manifest["t0_perf_counter_ns"] == manifest["t0_perf_counter_ns"]


def test_workers_split_a_closed_loop(server: ScheduledStreamServer, tmp_path: Path) -> None:
    config = ReplayConfig(target_url=server.url, mode="closed", concurrency=4)
    summary = replay_workers(_trace(40), config, tmp_path, num_workers=2)
    assert summary["num_completed"] == 40
    assert server.stats.max_active <= 4
    assert sorted(server.stats.request_ids) == sorted(f"r{i}" for i in range(40))


def test_cli_refuses_workers_with_an_engine(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["replay", "--engine", "vllm", "--url", "http://127.0.0.1:1",
                     "--workers", "2", "--trace", "synthetic", "--num-requests", "2",
                     "--rate", "1", "--prompt-tokens", "4", "--output-tokens", "2"]) == 2
    assert "--workers" in capsys.readouterr().err


def test_resummarising_keeps_a_run_client_limited_when_any_worker_was(tmp_path: Path) -> None:
    """``replay --workers`` calls a run client-limited when any worker was; `batchlab summarize`
    recomputes the pooled send lag (under the threshold here) and must keep that rule."""
    from harness.cli import main
    from harness.live.rundir import rebuild_summary

    out = tmp_path / "run"
    assert main(["simulate", "--trace", "harness/data/azure_conv_excerpt.csv", "--limit", "10",
                 "--no-report", "--out", str(out)]) == 0
    path = out / "summary.json"
    summary = json.loads(path.read_text())
    summary["workers"] = [{"client_limited": False}, {"client_limited": True}]
    summary["client_limited"] = True
    path.write_text(json.dumps(summary))
    assert rebuild_summary(out)["client_limited"] is True
    summary["workers"] = [{"client_limited": False}, {"client_limited": False}]
    path.write_text(json.dumps(summary))
    assert not rebuild_summary(out).get("client_limited")
