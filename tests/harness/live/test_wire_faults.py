"""Answers that break the wire protocol become protocol_error rows; the rest of the run goes on.

Against the loopback server's ``giant_event`` and ``not_sse`` faults (harness.live.testing).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from harness.live.recorder import RECORDS_FILE, read_records
from harness.live.replay import ReplayConfig, replay
from harness.live.testing import ScheduledStreamServer
from harness.timeline import ERROR_KINDS, RequestTimeline
from harness.traces import Trace, TraceRequest


def make_trace(n: int, *, gap_s: float = 0.005, output: int = 20) -> Trace:
    reqs = tuple(TraceRequest(f"r{i}", i * gap_s, 16, output) for i in range(n))
    return Trace(reqs, source="test", format="test", digest="0" * 64)


def run(trace: Trace, out: Path, server_kw: dict[str, Any],
        **config_kw: Any) -> tuple[dict[str, Any], dict[str, RequestTimeline]]:
    async def go() -> dict[str, Any]:
        async with ScheduledStreamServer(ttft_s=0.01, itl_s=0.004, **server_kw) as server:
            return await replay(trace, ReplayConfig(target_url=server.url, **config_kw), out)

    summary = asyncio.run(go())
    return summary, {tl.request_id: tl for tl in read_records(out / RECORDS_FILE)}


@pytest.mark.parametrize("http_client", ["lean", "httpx"])
def test_a_16_mib_event_is_a_protocol_error_and_the_others_finish(tmp_path: Path,
                                                                  http_client: str) -> None:
    assert "protocol_error" in ERROR_KINDS
    trace = make_trace(8)  # each request streams for ~90 ms: r2's giant event lands mid-run
    summary, rows = run(trace, tmp_path, {"faults": {"r2": "giant_event"}},
                        http_client=http_client, timeout_s=30.0)
    bad = rows["r2"]
    assert bad.error_kind == "protocol_error", (bad.error_kind, bad.error_message)
    assert "bytes" in bad.error_message and bad.chunk_num_tokens == (1, 1)
    for rid, tl in rows.items():
        if rid != "r2":
            assert tl.ok and tl.output_tokens == 20, (rid, tl.error_kind, tl.error_message)
    assert summary["failures"] == {"protocol_error": 1}


def test_the_cap_is_configurable(tmp_path: Path) -> None:
    trace = make_trace(2)
    _, rows = run(trace, tmp_path, {"faults": {"r0": "giant_event"},
                                    "giant_event_bytes": 300_000},
                  max_event_bytes=1_000_000)
    # under the cap the 300 kB event is read whole, as one more chunk; then the fault ends
    # the body without [DONE]
    assert rows["r0"].chunk_num_tokens == (1, 1, 1)
    assert rows["r0"].error_kind == "stream_cut"
    with pytest.raises(ValueError, match="max_event_bytes"):
        ReplayConfig(target_url="http://127.0.0.1:1", max_event_bytes=0).validate()


@pytest.mark.parametrize("http_client", ["lean", "httpx"])
def test_a_200_that_is_not_an_event_stream_is_a_protocol_error(tmp_path: Path,
                                                               http_client: str) -> None:
    trace = make_trace(3)
    summary, rows = run(trace, tmp_path, {"faults": {"r1": "not_sse"}}, http_client=http_client)
    bad = rows["r1"]
    assert bad.error_kind == "protocol_error", (bad.error_kind, bad.error_message)
    assert "application/json" in bad.error_message and "not an event stream" in bad.error_message
    assert '"choices"' in bad.error_message  # the start of the body, for the user to see
    assert rows["r0"].ok and rows["r2"].ok
    assert summary["failures"] == {"protocol_error": 1}
