"""A client that disconnects aborts its request, as vLLM and TGI do.

    streaming      ``AbortOnClose``: a StreamingResponse that, however it ends (all tokens
                   sent, the client gone, the server stopping), calls ``engine.abort(stream)``,
                   a no-op for a request that finished
    not streaming  ``wait_or_abort``: wait for the last token while listening for the client's
                   ``http.disconnect``; the first to come wins (vLLM's ``with_cancellation``,
                   ``vllm/entrypoints/utils.py``)

The aborted request leaves the scheduler with its KV blocks freed and is counted in
``vllm:request_success_total{finished_reason="abort"}``. Nothing is logged: a client going away
is a normal end, not an error.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, Mapping

from starlette.requests import ClientDisconnect
from starlette.requests import Request as StarletteRequest
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from harness.serve.loop import ServedEngine, TokenStream

# nginx's status for "the client closed the connection before the response": a non-streaming
# request whose client went away answers it, to no one.
CLIENT_CLOSED_REQUEST = 499


class AbortOnClose(StreamingResponse):
    """Stream ``body``; when the response ends, however it ends, abort ``stream``'s request
    unless it finished (the client went away, or the send failed)."""

    def __init__(self, body: AsyncIterable[bytes], engine: ServedEngine, stream: TokenStream,
                 *, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(body, media_type="text/event-stream", headers=headers)
        self._engine = engine
        self._stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def receive_or_abort() -> Message:
            # Abort the moment the server reports the disconnect: the token stream then ends
            # and so does the response. Starlette also cancels the streaming task, but under
            # load that cancellation can be put off indefinitely (anyio skips a task whose
            # awaited future is already done, and the step loop completes one every step).
            message = await receive()
            if message["type"] == "http.disconnect":
                self._engine.abort(self._stream)
            return message

        try:
            await super().__call__(scope, receive_or_abort, send)
        except ClientDisconnect:  # ASGI 2.4 servers: a failed send is the client going away
            pass
        finally:
            self._engine.abort(self._stream)


async def wait_or_abort(request: StarletteRequest, engine: ServedEngine,
                        stream: TokenStream) -> bool:
    """Wait until ``stream`` has all its tokens (True), or until the client disconnects: then
    its request is aborted (False). The body must have been read already."""
    finished = asyncio.ensure_future(_until_done(stream))
    gone = asyncio.ensure_future(_until_disconnect(request))
    try:
        await asyncio.wait((finished, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (finished, gone):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if stream.done:
        return True
    engine.abort(stream)
    return False


async def _until_done(stream: TokenStream) -> None:
    async for _ in stream.tokens():
        pass


async def _until_disconnect(request: StarletteRequest) -> None:
    # After the body, the server's next message for this request is ``http.disconnect``.
    while (await request.receive())["type"] != "http.disconnect":
        pass
