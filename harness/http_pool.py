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
in FIFO order for a free one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import AsyncIterator, Iterator

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
        self._idle: dict[_Key, list[httpcore.AsyncHTTPConnection]] = {}
        self._open: set[httpcore.AsyncHTTPConnection] = set()
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def num_open(self) -> int:
        return len(self._open)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        key: _Key = (url.raw_scheme, url.raw_host,
                     url.port or (443 if url.scheme == "https" else 80))
        conn = await self._checkout(key)
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port,
                             target=url.raw_path),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        try:
            with _mapped():
                response = await conn.handle_async_request(core_request)
        except BaseException:
            await self._discard(conn)
            raise
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(self, conn, key, response, request),
            extensions=response.extensions,
        )

    async def _checkout(self, key: _Key) -> httpcore.AsyncHTTPConnection:
        stack = self._idle.get(key)
        while stack:
            conn = stack.pop()
            if conn.is_available() and not conn.has_expired():
                return conn
            await self._discard(conn)
        while self._max_connections is not None and len(self._open) >= self._max_connections:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            stack = self._idle.get(key)
            while stack:
                conn = stack.pop()
                if conn.is_available() and not conn.has_expired():
                    return conn
                await self._discard(conn)
        conn = httpcore.AsyncHTTPConnection(httpcore.Origin(*key), ssl_context=self._ssl_context,
                                            keepalive_expiry=self._keepalive_expiry_s)
        self._open.add(conn)
        return conn

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
