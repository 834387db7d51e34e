"""A stream that ended with ``[DONE]`` is a completed request, whatever comes after it.

The httpx client reads the rest of the HTTP body after ``[DONE]`` so that its connection goes
back to the pool; a server that sends the body's end late made that read outlast the request's
timeout, and the completed request was recorded as a ``timeout`` failure (its TTFT, TPOT and
E2E lost) while the default client recorded the same stream as a success.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from harness.live.recorder import RECORDS_FILE, read_records
from harness.live.replay import ReplayConfig, replay
from harness.traces import Trace, TraceRequest

EVENTS = (b'data: {"choices":[{"text":" a","finish_reason":null}],'
          b'"usage":{"completion_tokens":1}}\n\n',
          b'data: {"choices":[{"text":" b","finish_reason":"length"}],'
          b'"usage":{"completion_tokens":2}}\n\n',
          b"data: [DONE]\n\n")
BODY_END_AFTER_S = 1.0  # well past the requests' timeout below


async def late_body_end(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Every POST: the whole stream at once, then the chunked body's end a second later."""
    with contextlib.suppress(asyncio.CancelledError, ConnectionError,
                             asyncio.IncompleteReadError):
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length")), 0)
            if length:
                await reader.readexactly(length)
            if head.startswith(b"GET"):  # the client's warm-up
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
                continue
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            for event in EVENTS:
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(BODY_END_AFTER_S)
            writer.write(b"0\r\n\r\n")
            await writer.drain()


@pytest.mark.parametrize("http_client", ["lean", "httpx"])
def test_a_late_end_of_body_after_done_is_still_a_completed_request(
        tmp_path: Path, http_client: str) -> None:
    trace = Trace((TraceRequest("r0", 0.0, 16, 2),), source="test", format="test",
                  digest="0" * 64)

    async def go() -> dict:
        server = await asyncio.start_server(late_body_end, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            return await replay(trace, ReplayConfig(target_url=url, http_client=http_client,
                                                    timeout_s=0.3), tmp_path)
        finally:
            server.close()

    summary = asyncio.run(go())
    (row,) = read_records(tmp_path / RECORDS_FILE)
    assert row.ok, (row.error_kind, row.error_message)
    assert row.output_tokens == 2
    assert summary["num_completed"] == 1 and summary["failures"] == {}
