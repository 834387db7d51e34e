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


def test_an_error_body_that_echoes_a_secret_is_masked_in_every_row(tmp_path: Path) -> None:
    """A server's error may quote what it was started with (a launched engine's environment,
    handed in as ``secrets``) or the URL it was reached by, credentials included: neither
    reaches a row, on disk or in the summary."""
    reqs = tuple(TraceRequest(f"r{i}", i * 0.01, 8, 5) for i in range(3))
    trace = Trace(source="memory", format="synthetic", digest="0" * 64, requests=reqs)

    def refuse(req: TraceRequest, body: bytes) -> Reply:
        # an error event in the stream, as vLLM sends one
        return [(0.0, b'data: {"error": {"message": "token hf_engine_token_4821 refused for '
                      b'http://alice:pw-4821-secret@memory/v1/completions", "code": 400}}'
                      b'\n\n')]

    config = ReplayConfig(target_url="http://alice:pw-4821-secret@memory", protocol="openai",
                          model="m")
    summary = asyncio.run(replay(trace, config, tmp_path, wire=MemoryWire(refuse),
                                 secrets=frozenset({"hf_engine_token_4821"})))
    assert summary["num_failed"] == 3
    rows = pq.read_table(tmp_path / "requests.parquet").to_pylist()
    assert all("refused for" in r["error_message"] for r in rows)  # the rest of it is kept
    for path in tmp_path.iterdir():
        data = path.read_bytes()
        assert b"hf_engine_token_4821" not in data and b"pw-4821-secret" not in data, path.name
