"""The wire: how one request reaches the server and its stream is read, stamped at the socket.

``LeanWire`` (default) parses in the socket callback; ``HttpxWire`` goes through httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from harness.live.config import (
    DRAIN_TIMEOUT_S,
    ReplayConfig,
)
from harness.live.http_pool import WIRE_MARKS, LifoPoolTransport, WireMarks
from harness.live.protocols import (
    PATHS,
    SseDecoder,
    StreamParser,
    error_kind_for_status,
)
from harness.live.sse_client import SseClient, is_event_stream
from harness.manifest import batchlab_version
from harness.traces import TraceRequest


@dataclass(slots=True)
class Attempt:
    """A request in flight (mutable, private to the run)."""

    req: TraceRequest
    arrival_s: float
    scheduled_s: float | None
    parser: StreamParser
    sent_ns: int | None = None
    end_ns: int | None = None  # the end of stream (or failure) instant
    eof: bool = False
    error_kind: str | None = None
    error_message: str = ""
    http_status: int | None = None
    decoder: SseDecoder = field(default_factory=SseDecoder)
    num_retries: int = 0  # sent again on a fresh connection (a reused one closed first)

    # -- as the lean client's BodySink (harness.live.sse_client)

    def on_sent(self, t_ns: int) -> None:
        self.sent_ns = t_ns

    def on_body(self, data: bytes, t_ns: int) -> bool:
        """Feed one read's bytes; True once the stream's end (or an error in it) was seen."""
        for event in self.decoder.feed(data):
            if self.parser.on_event(event, t_ns):
                self.end_ns = t_ns
                return True
        if self.decoder.error is not None:  # an event over the size cap
            self.parser.protocol_error(self.decoder.error)
            self.end_ns = t_ns
            return True
        return False

    def fail(self, kind: str, message: str) -> None:
        if self.error_kind is None:
            self.error_kind = kind
            self.error_message = message[:500]
        if self.end_ns is None:
            self.end_ns = time.perf_counter_ns()




# ---------------------------------------------------------------- the wire


class Wire(Protocol):
    """How requests reach the server. ``prepare`` runs before the request's instant (so its
    cost is not send lag); ``stream`` sends it and fills the attempt: send instant, chunks
    (through ``att.on_body``), end instant, and failures as ``att.fail`` values."""

    def prepare(self, req: TraceRequest, body: bytes) -> object: ...

    async def stream(self, att: Attempt, prepared: object) -> None: ...

    async def warm_up(self) -> None: ...

    async def aclose(self) -> None: ...


class LeanWire:
    """``harness.live.sse_client``: the parsing runs in the socket's data callback."""

    def __init__(self, config: ReplayConfig, max_connections: int | None) -> None:
        self._path = PATHS[config.protocol]
        headers = {k: v for k, v in request_headers(config).items() if k != "Accept-Encoding"}
        self._client = SseClient(config.target_url, max_connections=max_connections,
                                 headers=headers, connect_timeout_s=config.timeout_s)

    def prepare(self, req: TraceRequest, body: bytes) -> bytes:
        return self._client.encode_request("POST", self._path, body,
                                           {"X-Request-Id": req.request_id})

    async def stream(self, att: Attempt, prepared: object) -> None:
        assert isinstance(prepared, bytes)
        ex = await self._client.exchange(prepared, att)
        att.sent_ns = ex.sent_ns
        att.http_status = ex.status
        att.num_retries = ex.num_retries
        if ex.end == "connect_error":
            att.fail("connect_error", ex.message)
        elif ex.status is not None and not 200 <= ex.status < 300:
            att.fail(error_kind_for_status(ex.status), f"HTTP {ex.status}: "
                     + ex.error_body.decode("utf-8", errors="replace"))
        elif ex.end == "not_event_stream":
            att.fail("protocol_error", not_event_stream_message(ex.status, ex.content_type,
                                                                ex.error_body))
        elif ex.end == "cut":
            att.fail("stream_cut", ex.message)
        elif ex.end == "protocol_error":
            att.fail("protocol_error", f"malformed HTTP response: {ex.message}")
        elif ex.end == "complete":  # the body ended without the sink seeing the stream's end
            att.eof = True
            att.end_ns = ex.end_ns

    async def warm_up(self) -> None:
        request = self._client.encode_request("GET", "/health", b"")
        await self._client.exchange(request, IgnoreBody())

    async def aclose(self) -> None:
        await self._client.aclose()


# One scripted reply: (seconds to wait, bytes that then arrive), in order.
Reply = list[tuple[float, bytes]]


class MemoryWire:
    """An in-memory wire for tests: ``respond(request, body)`` scripts each reply as the
    pieces of its HTTP body (an SSE stream) and the pause before each; no socket, no server.
    Everything after the wire (parsing, timing, records, summaries) runs as in a live run."""

    def __init__(self, respond: Callable[[TraceRequest, bytes], Reply],
                 *, status: int = 200) -> None:
        self._respond = respond
        self._status = status
        self.sent: list[str] = []  # request ids, in send order

    def prepare(self, req: TraceRequest, body: bytes) -> tuple[TraceRequest, bytes]:
        return (req, body)

    async def stream(self, att: Attempt, prepared: object) -> None:
        assert isinstance(prepared, tuple)
        req, body = prepared
        att.sent_ns = time.perf_counter_ns()
        att.http_status = self._status
        self.sent.append(req.request_id)
        for delay_s, data in self._respond(req, body):
            await asyncio.sleep(delay_s)
            if att.on_body(data, time.perf_counter_ns()):
                return
        att.eof = True
        att.end_ns = time.perf_counter_ns()

    async def warm_up(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


class IgnoreBody:
    def on_sent(self, t_ns: int) -> None:
        pass

    def on_body(self, data: bytes, t_ns: int) -> bool:
        return False


class HttpxWire:
    """httpx with ``harness.live.http_pool``'s transport (socket-level instants via WireMarks)."""

    def __init__(self, config: ReplayConfig, max_connections: int | None) -> None:
        self._url = config.url
        self._health_url = config.target_url.rstrip("/") + "/health"
        self._headers = request_headers(config)
        self._client = httpx.AsyncClient(
            transport=LifoPoolTransport(max_connections=max_connections),
            timeout=httpx.Timeout(config.timeout_s, pool=None),
            trust_env=False,  # a proxy from the environment must not sit in between
        )

    def prepare(self, req: TraceRequest, body: bytes) -> httpx.Request:
        return self._client.build_request(
            "POST", self._url, content=body,
            headers={**self._headers, "X-Request-Id": req.request_id})

    async def stream(self, att: Attempt, prepared: object) -> None:
        assert isinstance(prepared, httpx.Request)
        marks = WireMarks()
        token = WIRE_MARKS.set(marks)
        try:
            await self._exchange(att, prepared, marks)
        except httpx.RemoteProtocolError as exc:
            # h11 says so both for a connection closed early ("Server disconnected ...",
            # "peer closed connection ...") and for framing it cannot parse
            text = str(exc).lower()
            cut = "disconnect" in text or "closed" in text
            att.fail("stream_cut" if cut else "protocol_error", f"{type(exc).__name__}: {exc}")
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            att.fail("connect_error", f"{type(exc).__name__}: {exc}")
        except (httpx.ReadError, httpx.WriteError) as exc:
            att.fail("stream_cut", f"{type(exc).__name__}: {exc}")
        except httpx.TimeoutException as exc:
            att.fail("timeout", f"{type(exc).__name__}: {exc}")
        except httpx.HTTPError as exc:
            att.fail("http_error", f"{type(exc).__name__}: {exc}")
        finally:
            if marks.sent_ns:
                att.sent_ns = marks.sent_ns
            att.num_retries = marks.num_retries
            WIRE_MARKS.reset(token)

    async def _exchange(self, att: Attempt, request: httpx.Request, marks: WireMarks) -> None:
        response = await self._client.send(request, stream=True)
        try:
            att.http_status = response.status_code
            if not 200 <= response.status_code < 300:
                text = (await response.aread())[:300].decode("utf-8", errors="replace")
                att.fail(error_kind_for_status(response.status_code),
                         f"HTTP {response.status_code}: {text}")
                return
            content_type = response.headers.get("content-type", "")
            if not is_event_stream(content_type):
                head = b""
                async for data in response.aiter_raw():
                    head += data
                    if len(head) >= 300:
                        break
                att.fail("protocol_error", not_event_stream_message(
                    response.status_code, content_type, head))
                return
            chunks = response.aiter_raw()  # identity encoding was asked for; skip decoders
            async for data in chunks:
                if att.on_body(data, marks.last_read_ns or time.perf_counter_ns()):
                    break
            else:
                att.eof = True
                att.end_ns = time.perf_counter_ns()
            if att.parser.done and not att.eof and att.parser.outcome(eof=False).completed:
                # Read the body's end so the connection goes back to the pool.
                with contextlib.suppress(TimeoutError, httpx.HTTPError):
                    async with asyncio.timeout(DRAIN_TIMEOUT_S):
                        async for _ in chunks:
                            pass
        finally:
            await response.aclose()

    async def warm_up(self) -> None:
        # Also loads httpx's lazily imported I/O backend (~50 ms, which would otherwise land
        # on the first requests as send lag).
        response = await self._client.get(self._health_url, headers=self._headers)
        await response.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()


def wire_for(config: ReplayConfig) -> Wire:
    """The replay's HTTP client as ``config`` chooses it, capped at its concurrency (the open
    loop's ``max_concurrency``, the closed loop's users)."""
    cap = config.max_concurrency if config.mode == "open" else config.concurrency
    return LeanWire(config, cap) if config.http_client == "lean" else HttpxWire(config, cap)


def not_event_stream_message(status: int | None, content_type: str, head: bytes) -> str:
    text = head[:300].decode("utf-8", errors="replace")
    return f"HTTP {status} with Content-Type {content_type!r}, not an event stream: {text}"


def request_headers(config: ReplayConfig) -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        "Accept": "text/event-stream",
        "Accept-Encoding": "identity",
        "User-Agent": f"batchlab/{batchlab_version()}",
    }
    if config.api_key_env is not None:
        headers["Authorization"] = f"Bearer {os.environ[config.api_key_env]}"
    return headers


