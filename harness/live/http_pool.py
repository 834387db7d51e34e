"""An ``httpx`` transport whose connection pool costs O(1) per request, for load generation.

httpx's default transport uses httpcore's ``AsyncConnectionPool``, which on every request start
and end rescans all its connections, and for each idle one counts the idle ones again
(``_assign_requests_to_connections`` in httpcore 1.0): O(connections²) per event. At a few
hundred streams in flight that scan, not the server, sets the send lag (measured with
``bench/client_capacity.py``: about 2,500 ``is_idle`` calls per request at 200 req/s).

This transport keeps, per origin, a stack of idle HTTP/1.1 connections (httpcore's
``AsyncHTTPConnection``, the same protocol code): a request pops the most recently used one that
is still alive, or opens a new one; a response returns its connection to the stack once it was
read to the end. ``max_connections`` caps connections open at once (``None``: no cap), waiting
in FIFO order for a free one. A request that fails on a reused connection before its response
head (the server closed the keep-alive connection as the request went out) is sent again once on
a new connection, and counted in ``WireMarks.num_retries``.

It also stamps, with ``time.perf_counter_ns``, the two instants the replay client times requests
by, at the socket rather than after httpx's layers: the instant the request first touched the
network (``WireMarks.sent_ns``: the start of its connection's TCP connect when it needs a new one,
else the write of its first byte), and the instant of the latest read that returned response bytes
(``WireMarks.last_read_ns``: when a streamed chunk arrived). The client's own work before that
(httpx, the pool, HTTP framing) is thus the client's lateness, not the server's latency; connection
set-up stays in the latency, as in the peers' tools. A request opts in by setting ``WIRE_MARKS`` (a
context variable; httpcore reads and writes inside the caller's task) to a fresh ``WireMarks``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

# httpcore exception -> httpx exception, most specific first (the same table httpx uses).
_EXCEPTIONS: tuple[tuple[type[Exception], type[httpx.HTTPError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


_Key = tuple[bytes, bytes, int]  # scheme, host, port

# What a request sent on a connection the server had closed fails with, before any response.
_STALE_CONNECTION = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


@dataclass(slots=True)
class WireMarks:
    """Socket-level instants of one request (``perf_counter_ns``); 0 = not yet."""

    sent_ns: int = 0
    last_read_ns: int = 0
    num_retries: int = 0  # sent again on a new connection after a reused one failed

    def stamp_sent(self) -> None:
        if not self.sent_ns:
            self.sent_ns = time.perf_counter_ns()


WIRE_MARKS: ContextVar[WireMarks | None] = ContextVar("batchlab_wire_marks", default=None)


class _StampingStream(httpcore.AsyncNetworkStream):
    """A network stream that stamps the current request's ``WireMarks``."""

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = await self._inner.read(max_bytes, timeout)
        marks = WIRE_MARKS.get()
        if marks is not None and data:
            marks.last_read_ns = time.perf_counter_ns()
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        marks = WIRE_MARKS.get()
        if marks is not None and buffer:
            marks.stamp_sent()
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        # The handshake's own writes happen below this wrapper and are not stamped.
        return _StampingStream(await self._inner.start_tls(ssl_context, server_hostname,
                                                           timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


def _stamp_connect() -> None:
    marks = WIRE_MARKS.get()
    if marks is not None:
        marks.stamp_sent()


class _StampingBackend(httpcore.AsyncNetworkBackend):
    """httpcore's asyncio (anyio) backend, with stamping streams. Naming the backend also
    spares httpcore's per-connection detection of the async library."""

    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None
                          ) -> httpcore.AsyncNetworkStream:
        _stamp_connect()
        return _StampingStream(await self._inner.connect_tcp(
            host, port, timeout=timeout, local_address=local_address,
            socket_options=socket_options))

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None
                                  ) -> httpcore.AsyncNetworkStream:
        _stamp_connect()
        return _StampingStream(await self._inner.connect_unix_socket(
            path, timeout=timeout, socket_options=socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


@contextlib.contextmanager
def _mapped() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for core, mapped in _EXCEPTIONS:
            if isinstance(exc, core):
                raise mapped(str(exc) or type(exc).__name__) from exc
        raise


class LifoPoolTransport(httpx.AsyncBaseTransport):
    """Idle HTTP/1.1 connections on a stack per origin; see the module docstring."""

    def __init__(self, *, max_connections: int | None = None, keepalive_expiry_s: float = 5.0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        # ssl_context None: httpcore's default context (certifi) for https targets
        self._max_connections = max_connections
        self._keepalive_expiry_s = keepalive_expiry_s
        self._ssl_context = ssl_context
        self._idle: dict[_Key, list[httpcore.AsyncHTTPConnection]] = {}  # most recent last
        self._open: set[httpcore.AsyncHTTPConnection] = set()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._backend = _StampingBackend()

    @property
    def num_open(self) -> int:
        return len(self._open)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        key: _Key = (url.raw_scheme, url.raw_host,
                     url.port or (443 if url.scheme == "https" else 80))
        conn, reused = await self._checkout(key)
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port,
                             target=url.raw_path),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        while True:
            try:
                with _mapped():
                    response = await conn.handle_async_request(core_request)
                break
            except BaseException as exc:
                await self._discard(conn)
                if not (reused and isinstance(exc, _STALE_CONNECTION)):
                    raise
                marks = WIRE_MARKS.get()
                if marks is not None:
                    marks.num_retries += 1
                conn, reused = self._new_connection(key), False  # (no await since _discard)
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(self, conn, key, response, request),
            extensions=response.extensions,
        )

    async def _checkout(self, key: _Key) -> tuple[httpcore.AsyncHTTPConnection, bool]:
        """A connection for ``key``, and whether it carried a request before."""
        conn = await self._pop_idle(key)
        if conn is not None:
            return conn, True
        while self._max_connections is not None and len(self._open) >= self._max_connections:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            conn = await self._pop_idle(key)
            if conn is not None:
                return conn, True
        return self._new_connection(key), False

    def _new_connection(self, key: _Key) -> httpcore.AsyncHTTPConnection:
        conn = httpcore.AsyncHTTPConnection(httpcore.Origin(*key), ssl_context=self._ssl_context,
                                            keepalive_expiry=self._keepalive_expiry_s,
                                            network_backend=self._backend)
        self._open.add(conn)
        return conn

    async def _pop_idle(self, key: _Key) -> httpcore.AsyncHTTPConnection | None:
        stack = self._idle.get(key)
        while stack:
            conn = stack.pop()
            # has_expired() also polls the socket: a server may have closed it since.
            if conn.is_available() and not conn.has_expired():
                return conn
            await self._discard(conn)
        return None

    def _checkin(self, conn: httpcore.AsyncHTTPConnection, key: _Key) -> bool:
        """Back on the stack if it can carry another request; False if it must be closed."""
        if conn.is_idle() and not conn.is_closed():
            self._idle.setdefault(key, []).append(conn)
            self._wake()
            return True
        return False

    async def _discard(self, conn: httpcore.AsyncHTTPConnection) -> None:
        self._open.discard(conn)
        with contextlib.suppress(Exception):
            await conn.aclose()
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        for conn in list(self._open):
            await self._discard(conn)
        self._idle.clear()


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, transport: LifoPoolTransport, conn: httpcore.AsyncHTTPConnection,
                 key: _Key, response: httpcore.Response, request: httpx.Request) -> None:
        self._transport = transport
        self._conn = conn
        self._key = key
        self._response = response
        self._request = request
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _mapped():
            async for part in self._response.aiter_stream():
                yield part

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            with _mapped():
                await self._response.aclose()
        finally:
            if not self._transport._checkin(self._conn, self._key):
                await self._transport._discard(self._conn)
