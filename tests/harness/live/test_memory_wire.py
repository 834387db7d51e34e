"""The replay loop over an in-memory wire (``MemoryWire``): no socket, no server; parsing,
timing, records and the summary run as in a live run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pyarrow.parquet as pq

from harness.live.config import ReplayConfig
from harness.live.replay import replay
from harness.live.wire import MemoryWire, Reply
from harness.traces import Trace, TraceRequest


def _event(text: str, finish: str | None = None, usage: int | None = None) -> bytes:
    body: dict[str, object] = {"id": "cmpl-1", "object": "text_completion", "model": "m",
                               "choices": [{"index": 0, "text": text,
                                            "finish_reason": finish}]}
    if usage is not None:
        body["usage"] = {"prompt_tokens": 8, "completion_tokens": usage,
                         "total_tokens": 8 + usage}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _reply(req: TraceRequest, body: bytes) -> Reply:
    n = req.num_output_tokens
    pieces: Reply = [(0.02, _event("t", usage=1))]
    pieces += [(0.005, _event("t", usage=i + 1)) for i in range(1, n - 1)]
    pieces += [(0.005, _event("t", "length", usage=n)), (0.0, b"data: [DONE]\n\n")]
    return pieces


def test_replay_over_a_memory_wire(tmp_path: Path) -> None:
    reqs = tuple(TraceRequest(f"r{i}", i * 0.01, 8, 5) for i in range(6))
    trace = Trace(source="memory", format="synthetic", digest="0" * 64, requests=reqs)
    wire = MemoryWire(_reply)
    config = ReplayConfig(target_url="http://memory", protocol="openai", model="m")
    summary = asyncio.run(replay(trace, config, tmp_path, wire=wire))
    assert sorted(wire.sent) == [r.request_id for r in reqs]
    assert summary["num_requests"] == 6 and summary["num_completed"] == 6
    rows = pq.read_table(tmp_path / "requests.parquet").to_pylist()
    assert all(r["num_output_tokens"] == 5 and r["error_kind"] is None for r in rows)
    # TTFT is the scripted 20 ms plus the event loop's lateness, never less.
    assert all(r["ttft_s"] >= 0.02 for r in rows)
    chunks = pq.read_table(tmp_path / "chunks.parquet")
    assert sum(chunks["num_tokens"].to_pylist()) == 30
