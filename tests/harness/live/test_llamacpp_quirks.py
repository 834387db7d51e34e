"""The replay client against a fake server with llama.cpp's streaming quirks.

``LlamaCppLikeServer`` streams ``/v1/completions`` the way llama.cpp's ``llama-server`` does
(``tools/server/server-context.cpp`` and ``server-task.cpp`` in the vendored llama.cpp of the
llama-cpp-python 0.3.36 sdist, read 2026-11):

- it announces keep-alive, then closes the connection after every streamed reply; here it
  waits for the next request's first bytes and then closes, the race at its worst;
- a token that ends inside a UTF-8 character gets no event (its bytes go out with the next);
- a special token gets an event with empty text;
- the last event has empty text, ``finish_reason`` and ``usage`` (and ``timings``);
- with ``"timings_per_token": true`` every event carries ``timings.predicted_n``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from harness.live.protocols import SseEvent, StreamParser, parse_stream
from harness.live.recorder import RECORDS_FILE, read_records
from harness.live.replay import ReplayConfig, replay
from harness.timeline import TOKEN_COUNT_SOURCES, RequestTimeline
from harness.traces import Trace, TraceRequest

NUM_TOKENS = 20  # per request: 3 held back (i % 6 == 2), 3 special (i % 6 == 5), 14 with text
NUM_TEXT_EVENTS = 14


def token_events(num_tokens: int) -> list[tuple[str, int]]:
    """(text, predicted_n) of each event llama.cpp would send for ``num_tokens`` tokens."""
    events, held = [], ""
    for i in range(num_tokens):
        if i % 6 == 2:
            held = "\u00e9"  # ends inside a UTF-8 character: no event; sent with the next
        elif i % 6 == 5:
            events.append(("", i + 1))  # a special token: an event with empty text
        else:
            events.append((held + f" t{i}", i + 1))
            held = ""
    return events


class LlamaCppLikeServer:
    """See the module docstring. ``bodies``: the request bodies it read."""

    def __init__(self, *, close_after_reply: bool = True) -> None:
        self.close_after_reply = close_after_reply
        self.bodies: list[dict[str, Any]] = []
        self.num_connections = 0
        self._server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> LlamaCppLikeServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.num_connections += 1
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                length = 0
                for line in head.split("\r\n"):
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                if head.startswith("GET /health"):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: 15\r\nKeep-Alive: timeout=5, max=100\r\n\r\n"
                                 b'{"status":"ok"}')
                    await writer.drain()
                    continue
                await self._stream(json.loads(body), writer)
                if self.close_after_reply:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(reader.read(1), 5.0)  # the next request comes
                    return  # ... and finds the connection closing under it
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    async def _stream(self, request: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        self.bodies.append(request)
        timings = bool(request.get("timings_per_token"))
        num_tokens = int(request["max_tokens"])
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\nKeep-Alive: timeout=5, max=100\r\n\r\n")

        def send(obj: dict[str, Any] | str) -> None:
            data = obj if isinstance(obj, str) else json.dumps(obj)
            event = f"data: {data}\n\n".encode()
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))

        for text, predicted_n in token_events(num_tokens):
            obj: dict[str, Any] = {"choices": [{"text": text, "index": 0, "logprobs": None,
                                                "finish_reason": None}],
                                   "object": "text_completion"}
            if timings:
                obj["timings"] = {"predicted_n": predicted_n, "prompt_n": 3}
            send(obj)
            await writer.drain()
            await asyncio.sleep(0.001)
        send({"choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}],
              "object": "text_completion",
              "usage": {"completion_tokens": num_tokens, "prompt_tokens": 3,
                        "total_tokens": num_tokens + 3},
              "timings": {"predicted_n": num_tokens, "prompt_n": 3}})
        send("[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()


def make_trace(n: int) -> Trace:
    reqs = tuple(TraceRequest(f"r{i}", i * 0.01, 3, NUM_TOKENS) for i in range(n))
    return Trace(reqs, source="test", format="test", digest="0" * 64)


def run(out: Path, n: int, server_kw: dict[str, Any] | None = None, **config_kw: Any,
        ) -> tuple[dict[str, Any], list[RequestTimeline], LlamaCppLikeServer]:
    async def go() -> tuple[dict[str, Any], LlamaCppLikeServer]:
        async with LlamaCppLikeServer(**(server_kw or {})) as server:
            config = ReplayConfig(target_url=server.url, **config_kw)
            return await replay(make_trace(n), config, out), server

    summary, server = asyncio.run(go())
    rows = sorted(read_records(out / RECORDS_FILE), key=lambda tl: int(tl.request_id[1:]))
    return summary, rows, server


# ---------------------------------------------------------------- 1. stale connections


@pytest.mark.parametrize("http_client", ["lean", "httpx"])
def test_a_closed_loop_loses_no_request_when_the_server_closes_after_each_reply(
        tmp_path: Path, http_client: str) -> None:
    summary, rows, server = run(tmp_path, 6, mode="closed", concurrency=1,
                                http_client=http_client)
    assert [tl.error_kind for tl in rows] == [None] * 6, [tl.error_message for tl in rows]
    # the first request reuses the warm-up's connection, which the server keeps; every later
    # one goes out on a connection the server then closes unanswered, and is sent again
    assert [tl.num_retries for tl in rows] == [0, 1, 1, 1, 1, 1]
    assert summary["num_retries"] == 5
    table = pq.read_table(tmp_path / "requests.parquet").sort_by("arrival_s")
    assert table.column("num_retries").to_pylist() == [0, 1, 1, 1, 1, 1]
    assert len(server.bodies) == 6  # (the closing server never read the first copies)


def test_a_server_that_keeps_its_connections_needs_no_retry(tmp_path: Path) -> None:
    summary, rows, server = run(tmp_path, 4, {"close_after_reply": False}, mode="closed",
                                concurrency=1)
    assert all(tl.ok and tl.num_retries == 0 for tl in rows)
    assert summary["num_retries"] == 0 and server.num_connections == 1


# ---------------------------------------------------------------- 2. phantom final chunk


def test_the_empty_final_usage_event_is_not_a_chunk(tmp_path: Path) -> None:
    _, rows, _ = run(tmp_path, 3)
    for tl in rows:
        assert tl.ok, (tl.error_kind, tl.error_message)
        assert tl.output_tokens == NUM_TOKENS  # the server's total
        assert tl.token_count_source == "usage_total"
        # one chunk per event with text; the final total adds no chunk of 20 tokens
        assert tl.chunk_num_tokens == (1,) * NUM_TEXT_EVENTS
    chunks = pq.read_table(tmp_path / "chunks.parquet")
    assert sum(chunks.column("num_tokens").to_pylist()) == 3 * NUM_TEXT_EVENTS


def test_a_repeated_running_total_adds_nothing() -> None:
    # vLLM-style running usage, then a last event with no text that repeats the total
    events = [{"choices": [{"text": "a"}], "usage": {"completion_tokens": 1}},
              {"choices": [{"text": "b"}], "usage": {"completion_tokens": 2}},
              {"choices": [{"text": "", "finish_reason": "length"}],
               "usage": {"completion_tokens": 2}}]
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    out = parse_stream("openai", [body])
    assert out.chunk_num_tokens == (1, 1) and out.count_source == "usage"
    assert out.usage_num_output_tokens == 2 and out.completed


# ---------------------------------------------------------------- 3. events are not tokens


def test_timings_per_token_counts_held_back_and_special_tokens(tmp_path: Path) -> None:
    summary, rows, server = run(tmp_path, 3, timings_per_token=True)
    assert all(body["timings_per_token"] is True for body in server.bodies)
    expected = tuple(2 if text.startswith("\u00e9") else 1
                     for text, _ in token_events(NUM_TOKENS))
    for tl in rows:
        assert tl.ok and tl.token_count_source == "timings"
        assert tl.chunk_num_tokens == expected and sum(expected) == NUM_TOKENS
        assert tl.output_tokens == NUM_TOKENS
    assert summary["num_output_tokens"] == 3 * NUM_TOKENS
    assert "timings" in TOKEN_COUNT_SOURCES and "usage_total" in TOKEN_COUNT_SOURCES


def test_timings_per_token_is_not_sent_unless_asked(tmp_path: Path) -> None:
    _, _, server = run(tmp_path, 1)
    assert "timings_per_token" not in server.bodies[0]


def test_a_finish_event_without_text_or_a_count_keeps_the_running_count() -> None:
    """Every token event carried a running usage count, then a finish with neither text nor a
    count: the chunk sizes came from the running count (exact), yet were labelled as counted
    one per event with text."""
    events = [{"choices": [{"text": " a"}], "usage": {"completion_tokens": 1}},
              {"choices": [{"text": " b c"}], "usage": {"completion_tokens": 3}},
              {"choices": [{"text": "", "finish_reason": "length"}]},
              {"choices": [], "usage": {"completion_tokens": 3, "prompt_tokens": 5}}]
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    out = parse_stream("openai", [body + b"data: [DONE]\n\n"])
    assert out.chunk_num_tokens == (1, 2) and out.usage_num_output_tokens == 3
    assert out.count_source == "usage" and out.finish_reason == "length" and out.completed


def test_a_running_count_missing_from_one_event_falls_back_to_events() -> None:
    p = StreamParser("openai")
    p.on_event(SseEvent('{"choices":[{"text":"a"}],"timings":{"predicted_n":1}}'), 1)
    p.on_event(SseEvent('{"choices":[{"text":"b"}]}'), 2)  # no timings: trust events from here
    p.on_event(SseEvent('{"choices":[{"text":"c"}],"timings":{"predicted_n":3}}'), 3)
    p.on_event(SseEvent('{"choices":[{"text":"","finish_reason":"length"}],'
                        '"usage":{"completion_tokens":3}}'), 4)
    out = p.outcome(eof=True)
    assert out.chunk_num_tokens == (1, 1, 1) and out.chunk_times_ns == (1, 2, 3)
    assert out.count_source == "usage_total" and out.usage_num_output_tokens == 3


def test_a_chat_role_event_without_the_count_does_not_end_the_running_count() -> None:
    # llama.cpp's chat stream: the first token's deltas are a role-only event (no timings)
    # and the content event that carries timings
    events = [{"choices": [{"delta": {"role": "assistant", "content": None}, "index": 0}]},
              {"choices": [{"delta": {"content": "a"}, "index": 0}],
               "timings": {"predicted_n": 1}},
              {"choices": [{"delta": {}, "index": 0}], "timings": {"predicted_n": 2}},
              {"choices": [{"delta": {}, "index": 0, "finish_reason": "length"}],
               "usage": {"completion_tokens": 2}, "timings": {"predicted_n": 2}}]
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    out = parse_stream("openai-chat", [body + b"data: [DONE]\n\n"])
    assert out.chunk_num_tokens == (1, 1) and out.count_source == "timings"
    assert out.usage_num_output_tokens == 2 and out.completed
