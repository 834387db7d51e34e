"""The live replay's early-stop hook, against the scheduled-stream loopback server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from harness.capacity import SaturationMonitor
from harness.live.config import ReplayConfig
from harness.live.recorder import RECORDS_FILE, read_records
from harness.live.replay import replay
from harness.live.testing import ScheduledStreamServer
from harness.target import EarlyStop, LoadState
from harness.traces import Trace, TraceRequest


def _trace(n: int, gap_s: float) -> Trace:
    reqs = tuple(TraceRequest(f"r{i}", i * gap_s, 16, 20) for i in range(n))
    return Trace(reqs, source="test", format="test", digest="e" * 64)


def _run(trace: Trace, out: Path, early_stop: EarlyStop, **server_kw: Any) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with ScheduledStreamServer(**server_kw) as server:
            config = ReplayConfig(target_url=server.url, timeout_s=30.0)
            return await replay(trace, config, out, early_stop=early_stop)
    return asyncio.run(go())


def test_a_stop_reason_ends_the_replay_and_is_recorded(tmp_path: Path) -> None:
    seen: list[LoadState] = []

    def stop_after_ten(state: LoadState) -> str | None:
        seen.append(state)
        return "enough" if state.num_sent >= 10 else None

    trace = _trace(200, 0.01)  # 2 s of arrivals; the stop comes after about 0.1 s
    summary = _run(trace, tmp_path, stop_after_ten, ttft_s=0.05, itl_s=0.05)
    assert summary["stopped_early"] == "enough"
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["status"] == "stopped" and manifest["stopped_early"] == "enough"
    rows = read_records(tmp_path / RECORDS_FILE)
    assert 10 <= len(rows) < 200  # requests never sent are not rows, as after Ctrl-C
    assert len({r.request_id for r in rows}) == len(rows)
    assert any(r.error_kind == "not_finished" for r in rows)  # in flight at the stop
    assert seen and seen[-1].send_lag_s is not None and seen[-1].num_waiting is None


def test_the_saturation_monitor_stops_a_replay_the_server_cannot_keep_up_with(
        tmp_path: Path) -> None:
    # Each request streams for 1 s; 100 arrive per second: requests in flight grow steadily.
    monitor = SaturationMonitor(interval_s=0.1, num_rising=4, min_backlog=20)
    summary = _run(_trace(400, 0.01), tmp_path, monitor, ttft_s=0.05, itl_s=0.05)
    assert "over-saturated" in summary["stopped_early"]
    assert "requests in flight" in summary["stopped_early"]
    assert summary["num_requests"] < 400


def test_a_live_capacity_search_records_every_probe(tmp_path: Path) -> None:
    """The same search on a live target (the loopback server, attached as an OpenAI engine)."""
    import threading

    from harness.capacity import SearchSpec, run_search, single_setting
    from harness.metrics import Slo
    from harness.target import TargetSpec

    loop = asyncio.new_event_loop()
    server = ScheduledStreamServer(ttft_s=0.02, itl_s=0.005)
    loop.run_until_complete(server.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        spec = TargetSpec("openai", "attach", url=server.url, model="m")
        setting = single_setting(
            spec, name="loopback", trace_path="synthetic",
            trace_options={"num_requests": 20, "prompt_tokens": 16, "output_tokens": 4},
            kind="rate", target=0.99, slo=Slo(ttft_s=5.0), knobs={})
        result = run_search(setting, SearchSpec(start=4, max_load=8), tmp_path)
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
    assert (result.status, result.capacity) == ("at_least_max", 8)
    for label in ("rate-4", "rate-8"):
        folder = tmp_path / label
        manifest = json.loads((folder / "manifest.json").read_text())
        assert manifest["engine"]["mode"] == "attach"
        assert (folder / "probe.json").exists() and (folder / "requests.parquet").exists()
    assert server.stats.num_requests == 40
