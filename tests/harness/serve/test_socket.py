"""The served reference's listening socket sends small writes at once (no Nagle).

With Nagle's algorithm on, the first SSE event waited for the client's delayed ACK of the
response headers (up to 40 ms on a reused connection); ``bench/ttft_side_by_side.py`` measures
it. Here only the socket options are checked: no timing.
"""

from __future__ import annotations

import socket

from harness.serve.app import bind_socket


def test_accepted_connections_have_tcp_nodelay() -> None:
    listener = bind_socket("127.0.0.1", 0)
    client = socket.create_connection(listener.getsockname()[:2])
    try:
        conn, _ = listener.accept()
        with conn:
            assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
            # asyncio (hence uvicorn) sets TCP_NODELAY itself only on sockets of this proto
            assert conn.proto == socket.IPPROTO_TCP
    finally:
        client.close()
        listener.close()
