"""The lean streaming HTTP/1.1 client (harness.live.sse_client): framing, reuse, failures."""

from __future__ import annotations

import asyncio
import itertools
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.live.sse_client import Exchange, SseClient, _Connection, _Pending
from harness.live.testing import ScheduledStreamServer


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


class Sink:
    def __init__(self, stop_after: bytes | None = None) -> None:
        self.body = b""
        self.times: list[int] = []
        self.sent_ns = 0
        self.stop_after = stop_after

    def on_sent(self, t_ns: int) -> None:
        self.sent_ns = t_ns

    def on_body(self, data: bytes, t_ns: int) -> bool:
        self.body += data
        self.times.append(t_ns)
        return self.stop_after is not None and self.stop_after in self.body


def feed(pieces: list[bytes], sink: Sink | None = None
         ) -> tuple[tuple[str, int, str] | None, _Connection, Sink, list[_Connection]]:
    """Run one exchange over a fake socket; returns (end, t, message) or None if unresolved."""
    loop = asyncio.new_event_loop()
    try:
        idled: list[_Connection] = []
        conn = _Connection(idled.append)
        conn.connection_made(FakeTransport())
        sink = sink or Sink()
        future = loop.create_future()
        conn.start(b"GET / HTTP/1.1\r\n\r\n", _Pending(sink, future))
        for piece in pieces:
            if piece:
                conn.data_received(piece)
        result = future.result() if future.done() else None
        return result, conn, sink, idled
    finally:
        loop.close()


CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n"
           b"f\r\ndata: {\"a\":1}\n\n\r\n"
           b"10;ext=1\r\ndata: {\"b\":22}\n\n\r\n"
           b"0\r\nX-Trailer: t\r\n\r\n")
CHUNKED_BODY = b'data: {"a":1}\n\ndata: {"b":22}\n\n'


def test_chunked_response() -> None:
    result, conn, sink, _ = feed([CHUNKED])
    assert result is not None and result[0] == "complete"
    assert sink.body == CHUNKED_BODY
    assert conn.idle  # ready for the next request


@settings(max_examples=80, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(CHUNKED)), max_size=10))
def test_chunked_response_split_anywhere(cuts: list[int]) -> None:
    points = sorted({0, len(CHUNKED), *cuts})
    pieces = [CHUNKED[a:b] for a, b in itertools.pairwise(points)]
    result, conn, sink, _ = feed(pieces)
    assert result is not None and result[0] == "complete"
    assert sink.body == CHUNKED_BODY and conn.idle


def test_sized_and_interim_responses() -> None:
    raw = (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
    result, conn, sink, _ = feed([raw])
    assert result is not None and result[0] == "complete"
    assert sink.body == b"hello" and conn.idle


def test_body_until_close() -> None:
    loop = asyncio.new_event_loop()
    try:
        conn = _Connection(lambda c: None)
        conn.connection_made(FakeTransport())
        sink = Sink()
        future = loop.create_future()
        conn.start(b"GET / HTTP/1.1\r\n\r\n", _Pending(sink, future))
        conn.data_received(b"HTTP/1.0 200 OK\r\n\r\npart one, ")
        conn.data_received(b"part two")
        assert not future.done()
        conn.connection_lost(None)
        assert future.result()[0] == "complete"
        assert sink.body == b"part one, part two"
        assert not conn.idle
    finally:
        loop.close()


def test_connection_close_header_is_not_reused() -> None:
    raw = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    result, conn, _, _ = feed([raw])
    assert result is not None and result[0] == "complete"
    assert not conn.idle


def test_error_status_keeps_the_start_of_the_body() -> None:
    body = b'{"error": "' + b"x" * 1000 + b'"}'
    raw = b"HTTP/1.1 429 Too Many\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    loop = asyncio.new_event_loop()
    try:
        conn = _Connection(lambda c: None)
        conn.connection_made(FakeTransport())
        sink = Sink()
        pending = _Pending(sink, loop.create_future())
        conn.start(b"GET / HTTP/1.1\r\n\r\n", pending)
        conn.data_received(raw)
        assert pending.future.result()[0] == "complete"
        assert pending.status == 429
        assert bytes(pending.error_body) == body[:300]
        assert sink.body == b""  # an error body is not the stream
    finally:
        loop.close()


@pytest.mark.parametrize("raw", [
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY",
    b"SSH-2.0-OpenSSH\r\n\r\n",
])
def test_malformed_http_is_a_protocol_error(raw: bytes) -> None:
    result, conn, _, _ = feed([raw])
    assert result is not None and result[0] == "protocol_error" and result[2]
    assert not conn.idle


def test_cut_inside_the_body() -> None:
    loop = asyncio.new_event_loop()
    try:
        conn = _Connection(lambda c: None)
        conn.connection_made(FakeTransport())
        future = loop.create_future()
        conn.start(b"GET / HTTP/1.1\r\n\r\n", _Pending(Sink(), future))
        conn.data_received(CHUNKED[:80])
        conn.connection_lost(ConnectionResetError("reset"))
        end, _, message = future.result()
        assert end == "cut" and "inside the response body" in message
    finally:
        loop.close()


def test_stop_early_then_the_tail_returns_the_connection() -> None:
    sink = Sink(stop_after=b'{"a":1}')
    head_and_first = CHUNKED[:CHUNKED.index(b"10;ext")]
    loop = asyncio.new_event_loop()
    try:
        idled: list[_Connection] = []
        conn = _Connection(idled.append)
        conn.connection_made(FakeTransport())
        future = loop.create_future()
        conn.start(b"GET / HTTP/1.1\r\n\r\n", _Pending(sink, future))
        conn.data_received(head_and_first)
        assert future.result()[0] == "stopped"
        assert not conn.idle  # the rest of the body is still to come
        conn.awaiting_tail = True  # what the pool sets when the exchange returns first
        conn.data_received(CHUNKED[len(head_and_first):])
        assert conn.idle and idled == [conn]
        assert sink.body == b'data: {"a":1}\n\n'  # nothing after the stop reaches the sink
    finally:
        loop.close()


# ---------------------------------------------------------------- against a real socket

BODY = b'{"max_tokens": 3, "stream": true}'


async def _exchange(client: SseClient, rid: str) -> tuple[Exchange, Sink]:
    sink = Sink()
    request = client.encode_request("POST", "/v1/completions", BODY, {"X-Request-Id": rid})
    return await client.exchange(request, sink), sink


def test_reuses_one_connection_and_times_the_send() -> None:
    async def go() -> int:
        async with ScheduledStreamServer(ttft_s=0.001, itl_s=0.001) as server:
            client = SseClient(server.url)
            for i in range(5):
                ex, sink = await _exchange(client, f"r{i}")
                assert ex.end == "complete" and ex.status == 200
                assert sink.body.endswith(b"data: [DONE]\n\n")
                assert 0 < ex.sent_ns == sink.sent_ns <= sink.times[0] <= ex.end_ns
            n = client.num_open
            await client.aclose()
            return n

    assert asyncio.run(go()) == 1


def test_connection_cap() -> None:
    async def go() -> tuple[int, int]:
        async with ScheduledStreamServer(ttft_s=0.01, itl_s=0.005) as server:
            client = SseClient(server.url, max_connections=2)
            results = await asyncio.gather(*(_exchange(client, f"r{i}") for i in range(6)))
            assert all(ex.end == "complete" for ex, _ in results)
            n = client.num_open
            await client.aclose()
            return server.stats.max_active, n

    max_active, num_open = asyncio.run(go())
    assert max_active <= 2 and num_open <= 2


def test_closed_connection_is_not_reused() -> None:
    async def go() -> None:
        async with ScheduledStreamServer(ttft_s=0.001, itl_s=0.001,
                                         faults={"a": "close"}) as server:
            client = SseClient(server.url)
            ex, _ = await _exchange(client, "a")
            assert ex.end == "complete"  # a well-formed body that lacks [DONE]
            await asyncio.sleep(0.05)  # the server's close reaches the client
            ex, sink = await _exchange(client, "b")
            assert ex.end == "complete" and sink.body.endswith(b"data: [DONE]\n\n")
            await client.aclose()

    asyncio.run(go())


def test_connect_error_is_a_value() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go() -> Exchange:
        client = SseClient(f"http://127.0.0.1:{port}")
        ex, _ = await _exchange(client, "x")
        await client.aclose()
        return ex

    ex = asyncio.run(go())
    assert ex.end == "connect_error" and "Connect" in ex.message


def test_bad_base_url() -> None:
    with pytest.raises(ValueError, match="http"):
        SseClient("localhost:8000")
