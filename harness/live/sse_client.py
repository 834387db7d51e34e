"""A lean HTTP/1.1 client for streamed responses: the replay client's fast path.

The replay client spends its time per streamed chunk. Through httpx, each chunk climbs anyio's
read (with a cancel scope), h11's event parser, httpcore's and httpx's async generators, some
400 Python calls; ``bench/client_capacity.py`` measured that stack falling behind vLLM's own
benchmark client (aiohttp) near 200 requests/s on two busy cores. This client parses the
response inside ``asyncio.Protocol.data_received``: status line and headers, then chunked (or
sized, or until-close) framing, handing each read's body bytes straight to a sink in the same
callback, with the instant of the read. No coroutine wakes per chunk; the request's coroutine
waits on one future for the whole exchange.

What it does not do, because no serving engine needs it: redirects, cookies, proxies,
compression (it asks for ``identity``), HTTP/2, pipelining. HTTPS works through asyncio's TLS.

- A send on a reused connection that closes before any response byte is sent again once on a
  fresh connection (``Exchange.num_retries``), as HTTP clients do for idempotent requests: a
  server may close a keep-alive connection as the next request goes out (llama.cpp's server
  announces keep-alive, then closes after every streamed reply).
- Every read is acknowledged at once (``TCP_QUICKACK``). A server with Nagle's algorithm on
  holds its first SSE event until the response headers sent before it are acknowledged, which
  Linux delays up to 40 ms on a reused connection, and bunches later events the same way.
  uvicorn on the standard asyncio loop, serving a socket made with ``proto`` 0, is such a
  server: asyncio sets ``TCP_NODELAY`` only where ``proto`` is ``IPPROTO_TCP``
  (``_set_nodelay`` in CPython 3.11's ``asyncio/base_events.py``); uvloop sets it on every
  connection (``uvloop/handles/tcp.pyx``). ``bench/ttft_side_by_side.py`` measures it.

Timing, same clock as the rest (``time.perf_counter_ns``):

    sent_ns   the start of the TCP connect when the request opens a connection, else the
              instant its bytes (headers and body, one write) were handed to the socket
    t_ns      of each body piece: the instant data_received ran for the read that carried it

Outcomes are values (``Exchange``), never exceptions, except cancellation (the caller's
timeout or Ctrl-C), after which the connection is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol
from urllib.parse import urlsplit

MAX_HEADER_BYTES = 64 * 1024
MAX_ERROR_BODY_BYTES = 300  # kept of a non-2xx response, for its error message
TAIL_TIMEOUT_S = 0.5  # after a stream's end event, how long the body's end may take

End = Literal["stopped", "complete", "cut", "connect_error", "protocol_error",
              "not_event_stream"]
# Linux only: acknowledge received data at once instead of delaying the ACK (see above).
_QUICKACK: int = getattr(socket, "TCP_QUICKACK", 0)  # 0: not on this platform


class BodySink(Protocol):
    """Receives a 2xx response's body as it arrives. ``on_body`` returns True when it has seen
    all it needs (the stream's end event, or an error in it): the exchange then ends as
    ``stopped`` while the connection reads on to the body's end. ``on_sent`` gets the send
    instant as soon as it is known (so a cancelled exchange still has it)."""

    def on_sent(self, t_ns: int) -> None: ...

    def on_body(self, data: bytes, t_ns: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class Exchange:
    """How one request/response went."""

    end: End
    sent_ns: int
    end_ns: int  # when the end was seen
    status: int | None = None
    # the first bytes of a non-2xx body, or of a 2xx body that is not an event stream
    error_body: bytes = b""
    message: str = ""
    content_type: str = ""  # of the response ("" when it had none)
    num_retries: int = 0  # sent again on a fresh connection (see the module docstring)


class _Pending:
    """The exchange a connection is carrying (mutable; private)."""

    __slots__ = ("content_type", "error_body", "event_stream", "future", "got_bytes", "sink",
                 "status", "stopped")

    def __init__(self, sink: BodySink, future: asyncio.Future[tuple[End, int, str]]) -> None:
        self.sink = sink
        self.future = future
        self.status: int | None = None
        self.content_type = ""
        self.event_stream = True  # no Content-Type, or text/event-stream
        self.stopped = False
        self.got_bytes = False  # any byte of the response arrived
        self.error_body = bytearray()

    def resolve(self, end: End, t_ns: int, message: str = "") -> None:
        if not self.future.done():
            self.future.set_result((end, t_ns, message))


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: parses each response as its bytes arrive.

    Response parsing states::

        head ──(2xx/non-2xx headers)──► chunk_size ─► chunk_data ─► chunk_crlf ─┐
          ▲                        │    ▲  └─(size 0)─► trailer ─► done       │
          └──── 1xx ◄──────────────┤    └────────────────────────────────────────┘
                                   ├──► sized (Content-Length) ─► done
                                   └──► until_close ─► (connection closes) done
    """

    def __init__(self, on_idle: Callable[[_Connection], None]) -> None:
        self.transport: asyncio.Transport | None = None
        self.alive = True  # False once the peer closed or the connection broke
        self.reusable = True
        # The exchange already returned (its stream's end event came before the body's end);
        # the connection tells the pool through on_idle once it has read the rest.
        self.awaiting_tail = False
        self._on_idle = on_idle
        self._buf = bytearray()
        self._state = "idle"
        self._remaining = 0
        self._pending: _Pending | None = None
        self._sock: socket.socket | None = None  # for TCP_QUICKACK, where there is one
        self.num_exchanges = 0  # started on this connection

    # -- asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if _QUICKACK and sock is not None and sock.family in (
                socket.AF_INET, socket.AF_INET6):
            self._sock = sock

    def data_received(self, data: bytes) -> None:
        t_ns = time.perf_counter_ns()
        if self._sock is not None:  # the ACK now: see the module docstring
            with contextlib.suppress(OSError):
                self._sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        if self._pending is None:  # bytes nobody asked for: the connection is unusable
            self.reusable = False
            self._close()
            return
        self._pending.got_bytes = True
        self._buf += data
        try:
            self._parse(t_ns)
        except ValueError as exc:
            self._fail("protocol_error", t_ns, str(exc))

    def eof_received(self) -> bool | None:
        self._on_close(None)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_close(exc)

    # -- exchange

    def start(self, request: bytes, pending: _Pending) -> None:
        assert self.transport is not None and self._state == "idle"
        self.num_exchanges += 1
        if not self.alive:  # closed by the server since it was opened: nothing will come
            pending.resolve("cut", time.perf_counter_ns(), "connection closed before the send")
            return
        self._pending = pending
        self._state = "head"
        self._buf.clear()
        self.transport.write(request)

    def abandon(self) -> None:
        """The caller stopped waiting mid-exchange (timeout, cancel): drop the connection."""
        self.reusable = False
        if self.transport is not None:
            self.transport.abort()

    @property
    def idle(self) -> bool:
        return self._state == "idle" and self.alive and self.reusable

    # -- parsing

    def _parse(self, t_ns: int) -> None:
        pending = self._pending
        assert pending is not None
        body = bytearray()
        while True:
            state = self._state
            if state == "head":
                end = self._buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buf) > MAX_HEADER_BYTES:
                        raise ValueError("response headers exceed 64 KiB")
                    break
                head = bytes(self._buf[:end])
                del self._buf[:end + 4]
                self._on_head(head, pending)
            elif state == "chunk_size":
                end = self._buf.find(b"\r\n")
                if end < 0:
                    if len(self._buf) > 1024:
                        raise ValueError("chunk size line too long")
                    break
                line = bytes(self._buf[:end]).split(b";", 1)[0].strip()
                del self._buf[:end + 2]
                try:
                    size = int(line, 16)
                except ValueError:
                    raise ValueError(f"bad chunk size {line[:20]!r}") from None
                if size == 0:
                    self._state = "trailer"
                else:
                    self._remaining = size
                    self._state = "chunk_data"
            elif state in ("chunk_data", "sized"):
                take = min(self._remaining, len(self._buf))
                if take:
                    body += self._buf[:take]
                    del self._buf[:take]
                    self._remaining -= take
                if self._remaining:
                    break
                if state == "sized":
                    self._state = "done"
                else:
                    self._state = "chunk_crlf"
            elif state == "chunk_crlf":
                if len(self._buf) < 2:
                    break
                if self._buf[:2] != b"\r\n":
                    raise ValueError("chunk not followed by CRLF")
                del self._buf[:2]
                self._state = "chunk_size"
            elif state == "trailer":
                end = self._buf.find(b"\r\n")
                if end < 0:
                    break
                del self._buf[:end + 2]
                if end == 0:
                    self._state = "done"
            elif state == "until_close":
                body += self._buf
                self._buf.clear()
                break
            else:  # "done"
                break
        if body:
            self._deliver(pending, bytes(body), t_ns)
        if self._state == "done":
            if self._buf:  # bytes after the response: not a connection to reuse
                self.reusable = False
            self._state = "idle"
            self._pending = None
            pending.resolve(_end_of(pending), t_ns)
            if not self.reusable:
                self._close()
            if self.awaiting_tail:
                self.awaiting_tail = False
                self._on_idle(self)

    def _on_head(self, head: bytes, pending: _Pending) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise ValueError(f"not an HTTP response: {lines[0][:40]!r}")
        try:
            status = int(parts[1])
        except ValueError:
            raise ValueError(f"bad status line {lines[0][:40]!r}") from None
        if 100 <= status < 200:
            return  # an interim response; the real one follows
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        pending.status = status
        content_type = headers.get(b"content-type", b"").decode("latin-1")
        pending.content_type = content_type
        pending.event_stream = is_event_stream(content_type)
        if headers.get(b"connection", b"").lower() == b"close" or parts[0] == b"HTTP/1.0":
            self.reusable = False
        if status in (204, 304):
            self._state = "done"
        elif b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            self._state = "chunk_size"
        elif b"content-length" in headers:
            try:
                self._remaining = int(headers[b"content-length"])
            except ValueError:
                raise ValueError("bad Content-Length") from None
            self._state = "sized" if self._remaining else "done"
        else:
            self._state = "until_close"
            self.reusable = False

    def _deliver(self, pending: _Pending, data: bytes, t_ns: int) -> None:
        status = pending.status or 0
        if not 200 <= status < 300 or not pending.event_stream:
            room = MAX_ERROR_BODY_BYTES - len(pending.error_body)
            if room > 0:
                pending.error_body += data[:room]
            if not pending.event_stream and len(pending.error_body) >= MAX_ERROR_BODY_BYTES:
                # seen enough of a body that is not an event stream; drop the rest
                self._fail("not_event_stream", t_ns, "")
            return
        if pending.stopped:
            return  # read on to the body's end, for the connection's sake
        if pending.sink.on_body(data, t_ns):
            pending.stopped = True
            pending.resolve("stopped", t_ns)

    def _on_close(self, exc: Exception | None) -> None:
        self.alive = False
        if self.awaiting_tail:
            self.awaiting_tail = False
            self._on_idle(self)
        pending = self._pending
        if pending is None:
            return
        t_ns = time.perf_counter_ns()
        if self._state == "until_close":
            self._state = "idle"
            self._pending = None
            pending.resolve(_end_of(pending), t_ns)
            return
        self._pending = None
        self._state = "idle"
        where = "before the response" if pending.status is None else "inside the response body"
        reason = f": {exc}" if exc else ""
        pending.resolve("cut", t_ns, f"connection closed {where}{reason}")

    def _fail(self, end: End, t_ns: int, message: str) -> None:
        pending = self._pending
        self._pending = None
        self._state = "idle"
        self.reusable = False
        self._close()
        if pending is not None:
            pending.resolve(end, t_ns, message)

    def _close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


def is_event_stream(content_type: str) -> bool:
    """Whether a response's Content-Type allows an SSE body (a missing one does)."""
    media_type = content_type.split(";", 1)[0].strip().lower()
    return not media_type or media_type == "text/event-stream"


def _end_of(pending: _Pending) -> End:
    """How an exchange whose body ended went."""
    if pending.stopped:
        return "stopped"
    ok = pending.status is not None and 200 <= pending.status < 300
    return "not_event_stream" if ok and not pending.event_stream else "complete"


class SseClient:
    """Streams requests to one origin over a LIFO pool of keep-alive connections.

    ``max_connections`` caps open connections (``None``: no cap); requests beyond it wait in
    FIFO order. One client per run; ``aclose`` drops every connection."""

    def __init__(self, base_url: str, *, max_connections: int | None = None,
                 headers: Mapping[str, str] | None = None,
                 ssl_context: ssl.SSLContext | None = None,
                 connect_timeout_s: float | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{base_url!r} is not an http(s)://host[:port] URL")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self._ssl = ssl_context or ssl.create_default_context()
        self._prefix = parts.path.rstrip("/")
        host_header = self.host if ":" not in self.host else f"[{self.host}]"
        if parts.port is not None:
            host_header = f"{host_header}:{self.port}"
        fixed = {"Host": host_header, "Accept-Encoding": "identity", **(headers or {})}
        self._fixed_headers = "".join(f"{k}: {v}\r\n" for k, v in fixed.items())
        self._max_connections = max_connections
        self._connect_timeout_s = connect_timeout_s
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._num_connecting = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def num_open(self) -> int:
        return len(self._open)

    def encode_request(self, method: str, path: str, body: bytes,
                       headers: Mapping[str, str] | None = None) -> bytes:
        """The request's bytes, built once (before its send instant)."""
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (f"{method} {self._prefix}{path} HTTP/1.1\r\n{self._fixed_headers}{extra}"
                f"Content-Length: {len(body)}\r\n\r\n")
        return head.encode("latin-1") + body

    async def exchange(self, request: bytes, sink: BodySink) -> Exchange:
        """Send ``request`` (from ``encode_request``); feed a 2xx body to ``sink``; report.

        A send on a reused connection that closes before any response byte is repeated once
        on a fresh connection; ``sent_ns`` stays the first send's instant."""
        conn = await self._checkout()
        sent_ns = 0
        num_retries = 0
        while True:
            if conn is None:
                if not sent_ns:
                    sent_ns = time.perf_counter_ns()
                    sink.on_sent(sent_ns)
                try:
                    conn = await self._connect()
                except (OSError, TimeoutError, ssl.SSLError) as exc:
                    self._wake()
                    return Exchange("connect_error", sent_ns, time.perf_counter_ns(),
                                    message=f"{type(exc).__name__}: {exc}",
                                    num_retries=num_retries)
                except BaseException:  # cancelled: the place it held goes to a waiter
                    self._wake()
                    raise
            reused = conn.num_exchanges > 0
            future: asyncio.Future[tuple[End, int, str]] = (
                asyncio.get_running_loop().create_future())
            pending = _Pending(sink, future)
            if not sent_ns:
                sent_ns = time.perf_counter_ns()
                sink.on_sent(sent_ns)
            finished = False
            try:
                conn.start(request, pending)
                end, end_ns, message = await future
                finished = True
            finally:
                if not finished:
                    conn.abandon()
                    self._release(conn)
            if end == "cut" and reused and not pending.got_bytes and not num_retries:
                num_retries += 1
                self._drop(conn)  # (no _wake: the retry keeps its place under the cap)
                conn = None
                continue
            self._release(conn)
            return Exchange(end, sent_ns, end_ns, status=pending.status,
                            error_body=bytes(pending.error_body), message=message,
                            content_type=pending.content_type, num_retries=num_retries)

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        self._num_connecting += 1  # holds its place under max_connections while connecting
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self._on_idle), self.host, self.port, ssl=self._ssl,
                    server_hostname=self.host if self._ssl else None)
        finally:
            self._num_connecting -= 1
        self._open.add(conn)
        return conn

    def _pop_idle(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.idle:
                return conn
            self._drop(conn)
        return None

    async def _checkout(self) -> _Connection | None:
        """An idle connection, or None when there is room to open one (FIFO wait for that)."""
        while True:
            conn = self._pop_idle()
            if conn is not None:
                return conn
            if (self._max_connections is None
                    or len(self._open) + self._num_connecting < self._max_connections):
                return None
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    def _release(self, conn: _Connection) -> None:
        """After an exchange: back on the stack when it can carry another, else closed. A
        connection still reading a stopped stream's tail comes back through ``_on_idle``, or
        is dropped if the tail does not come within ``TAIL_TIMEOUT_S``."""
        if conn.idle:
            self._idle.append(conn)
        elif conn.alive and conn.reusable:
            conn.awaiting_tail = True
            asyncio.get_running_loop().call_later(TAIL_TIMEOUT_S, self._tail_overdue, conn)
            return
        else:
            self._drop(conn)
        self._wake()

    def _on_idle(self, conn: _Connection) -> None:
        if conn.idle and conn in self._open:
            self._idle.append(conn)
        else:
            self._drop(conn)
        self._wake()

    def _tail_overdue(self, conn: _Connection) -> None:
        if conn.awaiting_tail:
            conn.awaiting_tail = False
            conn.abandon()
            self._drop(conn)
            self._wake()

    def _drop(self, conn: _Connection) -> None:
        self._open.discard(conn)
        if conn.transport is not None and not conn.transport.is_closing():
            conn.transport.close()
    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        for conn in list(self._open):
            self._drop(conn)
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports close
