"""The replay client's connection pool: reuse, the connection cap, stale sockets, errors."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from harness.live.http_pool import LifoPoolTransport
from harness.live.testing import ScheduledStreamServer

BODY = b'{"max_tokens": 3, "stream": true}'


async def _post(client: httpx.AsyncClient, url: str, rid: str) -> bytes:
    async with client.stream("POST", url + "/v1/completions", content=BODY,
                             headers={"X-Request-Id": rid}) as response:
        return await response.aread()


def test_sequential_requests_reuse_one_connection() -> None:
    async def go() -> int:
        async with ScheduledStreamServer(ttft_s=0.001, itl_s=0.001) as server:
            transport = LifoPoolTransport()
            async with httpx.AsyncClient(transport=transport) as client:
                for i in range(5):
                    body = await _post(client, server.url, f"r{i}")
                    assert body.endswith(b"data: [DONE]\n\n")
                return transport.num_open

    assert asyncio.run(go()) == 1


def test_connection_cap_queues_requests() -> None:
    async def go() -> tuple[int, int]:
        async with ScheduledStreamServer(ttft_s=0.01, itl_s=0.005) as server:
            transport = LifoPoolTransport(max_connections=2)
            async with httpx.AsyncClient(transport=transport) as client:
                bodies = await asyncio.gather(*(_post(client, server.url, f"r{i}")
                                                for i in range(6)))
                assert all(b.endswith(b"data: [DONE]\n\n") for b in bodies)
                return server.stats.max_active, transport.num_open

    max_active, num_open = asyncio.run(go())
    assert max_active <= 2 and num_open <= 2


def test_a_closed_connection_is_not_reused() -> None:
    async def go() -> None:
        server = ScheduledStreamServer(ttft_s=0.001, itl_s=0.001, faults={"a": "close"})
        async with server, httpx.AsyncClient(transport=LifoPoolTransport()) as client:
            cut = await _post(client, server.url, "a")  # the server closes after this one
            assert b"[DONE]" not in cut
            assert (await _post(client, server.url, "b")).endswith(b"data: [DONE]\n\n")

    asyncio.run(go())


def test_errors_are_httpx_errors() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go() -> None:
        async with httpx.AsyncClient(transport=LifoPoolTransport()) as client:
            with pytest.raises(httpx.ConnectError):
                await _post(client, f"http://127.0.0.1:{port}", "x")

    asyncio.run(go())
