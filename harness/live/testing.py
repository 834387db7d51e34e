"""A loopback server that streams tokens on a known schedule, with injectable faults.

Used by the replay tests and by ``bench/client_capacity.py``. It speaks just enough of the three
protocols (OpenAI completions and chat, TGI ``/generate_stream``) for the replay client: each
request gets its first chunk ``ttft_s`` after its body was read, then one chunk every ``itl_s``,
``max_tokens`` / ``max_new_tokens`` tokens in all, with the usage fields each protocol defines.
It is a raw asyncio HTTP/1.1 server (keep-alive, chunked transfer) so that it costs little
next to the client it measures.

Faults, per request id (the ``X-Request-Id`` header) or for every request::

    kill            abort the connection after ``fault_after_tokens`` tokens (a crash)
    close           end the body cleanly mid-stream: no [DONE], no final event
    hang            stop sending after ``fault_after_tokens`` tokens, keep the socket open
    malformed       send a chunk that is not JSON
    error_event     an error event inside the 200 stream (each protocol's shape)
    overload_event  TGI's overload answer: HTTP 200 and an ``overloaded`` error event
    giant_event     one event of ``giant_event_bytes`` (16 MiB) after ``fault_after_tokens``
    not_sse         HTTP 200 with a JSON body (Content-Type application/json), not a stream
    429 / 500 / 503 answer with that status and a JSON error body

``python -m harness.live.testing --port 0`` runs it standalone and prints its URL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

FAULTS = ("kill", "close", "hang", "malformed", "error_event", "overload_event",
          "giant_event", "not_sse", "429", "500", "503")
STREAM_PATHS = {"/v1/completions": "openai", "/v1/chat/completions": "openai-chat",
                "/generate_stream": "tgi"}


@dataclass(slots=True)
class ServerStats:
    """What the server saw; read it from the test, or over ``GET /_stats``."""

    num_requests: int = 0
    num_active: int = 0
    max_active: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)  # when keep_bodies
    headers: list[dict[str, str]] = field(default_factory=list)  # when keep_bodies
    request_ids: list[str] = field(default_factory=list)  # in the order the server read them
    # request id -> [receive instant, then each chunk's send instant] (perf_counter_ns)
    event_log: dict[str, list[int]] = field(default_factory=dict)


class ScheduledStreamServer:
    """``async with ScheduledStreamServer(ttft_s=0.02, itl_s=0.005) as server: server.url``."""

    def __init__(
        self,
        *,
        ttft_s: float = 0.02,
        itl_s: float = 0.005,
        tokens_per_chunk: int = 1,
        faults: Mapping[str, str] | None = None,
        default_fault: str | None = None,
        fault_after_tokens: int = 2,
        eos_after_tokens: int | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        keep_bodies: bool = False,
        log_events: bool = False,
        send_usage: bool = True,
        giant_event_bytes: int = 16 << 20,
    ) -> None:
        for fault in [*(faults or {}).values(), default_fault]:
            if fault is not None and fault not in FAULTS:
                raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.tokens_per_chunk = tokens_per_chunk
        self.faults = dict(faults or {})
        self.default_fault = default_fault
        self.fault_after_tokens = fault_after_tokens
        # Stop after this many tokens as if the model emitted EOS, unless ignore_eos is set
        # (TGI cannot set it, so a TGI request then falls short of its target).
        self.eos_after_tokens = eos_after_tokens
        self.host = host
        self.port = port
        self.keep_bodies = keep_bodies
        self.log_events = log_events
        self.send_usage = send_usage  # False: a server that ignores stream_options / details
        self.giant_event_bytes = giant_event_bytes
        self.stats = ServerStats()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._hung: set[asyncio.Future[None]] = set()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and drop every connection (also how a test "kills" the server)."""
        if self._server is not None:
            self._server.close()
        for fut in list(self._hung):
            if not fut.done():
                fut.set_result(None)
        for writer in list(self._writers):
            writer.transport.abort()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    async def __aenter__(self) -> ScheduledStreamServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------ HTTP

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                try:
                    method, path, _version = lines[0].split(" ", 2)
                except ValueError:
                    return
                headers = {}
                for line in lines[1:]:
                    name, sep, value = line.partition(":")
                    if sep:
                        headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0") or 0)
                try:
                    body = await reader.readexactly(length) if length else b""
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                recv_ns = time.perf_counter_ns()
                keep_alive = await self._dispatch(method, path.split("?")[0], headers, body,
                                                  recv_ns, writer)
                if not keep_alive or headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()
                # a connection the client reset leaves its error on the stream's close
                # waiter: taken here, it is not logged as "never retrieved" when collected
                await writer.wait_closed()

    async def _dispatch(self, method: str, path: str, headers: dict[str, str], body: bytes,
                        recv_ns: int, writer: asyncio.StreamWriter) -> bool:
        if method == "GET" and path == "/health":
            return await _respond(writer, 200, b"{}")
        if method == "GET" and path == "/_stats":
            s = self.stats
            payload = {"num_requests": s.num_requests, "num_active": s.num_active,
                       "max_active": s.max_active}
            return await _respond(writer, 200, json.dumps(payload).encode())
        if method == "GET" and path == "/_log":
            data = json.dumps(self.stats.event_log).encode()
            self.stats.event_log = {}
            return await _respond(writer, 200, data)
        protocol = STREAM_PATHS.get(path)
        if method != "POST" or protocol is None:
            return await _respond(writer, 404, b'{"error": "not found"}')
        try:
            request = json.loads(body) if body else {}
        except ValueError:
            return await _respond(writer, 400, b'{"error": "body is not JSON"}')
        rid = headers.get("x-request-id") or f"anon-{self.stats.num_requests}"
        self.stats.num_requests += 1
        self.stats.request_ids.append(rid)
        if self.keep_bodies:
            self.stats.bodies.append(request)
            self.stats.headers.append(headers)
        fault = self.faults.get(rid, self.default_fault)
        if fault in ("429", "500", "503"):
            assert fault is not None
            message = json.dumps({"error": {"message": f"injected {fault}", "code": int(fault)}})
            return await _respond(writer, int(fault), message.encode())
        if fault == "not_sse":  # as a server that ignores "stream": true would answer
            return await _respond(writer, 200, json.dumps({"id": rid, "choices": [
                {"index": 0, "text": " tok", "finish_reason": "length"}]}).encode())
        self.stats.num_active += 1
        self.stats.max_active = max(self.stats.max_active, self.stats.num_active)
        try:
            return await self._stream(protocol, request, rid, fault, recv_ns, writer)
        finally:
            self.stats.num_active -= 1

    async def _stream(self, protocol: str, request: dict[str, Any], rid: str, fault: str | None,
                      recv_ns: int, writer: asyncio.StreamWriter) -> bool:
        if protocol == "tgi":
            params = request.get("parameters") or {}
            num_tokens = int(params.get("max_new_tokens") or 20)
            ignore_eos = False
            details = bool(params.get("details")) and self.send_usage
            include_usage = continuous = False
        else:
            num_tokens = int(request.get("max_tokens") or request.get("max_completion_tokens")
                             or 16)
            ignore_eos = bool(request.get("ignore_eos"))
            opts = request.get("stream_options") or {}
            include_usage = bool(opts.get("include_usage", True)) if opts else False
            continuous = bool(opts.get("continuous_usage_stats")) and self.send_usage
            include_usage = include_usage and self.send_usage
            details = False
        finish_reason = "length"
        if self.eos_after_tokens is not None and not ignore_eos and \
                self.eos_after_tokens < num_tokens:
            num_tokens = self.eos_after_tokens
            finish_reason = "eos_token" if protocol == "tgi" else "stop"
        log = self.stats.event_log.setdefault(rid, [recv_ns]) if self.log_events else None
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
        if protocol == "openai-chat":
            _write_chunk(writer, _sse(protocol, {"id": rid, "object": "chat.completion.chunk",
                                                 "choices": [{"index": 0, "delta": {
                                                     "role": "assistant", "content": ""},
                                                     "finish_reason": None}],
                                                 **({"usage": _usage(0)} if continuous else {})}))
        if fault == "overload_event":
            _write_chunk(writer, _sse(protocol, {"error": "Model is overloaded",
                                                 "error_type": "overloaded"}))
            return _end(writer)
        sent = 0
        chunk_index = 0
        while sent < num_tokens:
            deadline = recv_ns + round((self.ttft_s + chunk_index * self.itl_s) * 1e9)
            delay = (deadline - time.perf_counter_ns()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            if fault is not None and sent >= self.fault_after_tokens:
                return await self._fault(fault, protocol, writer)
            n = min(self.tokens_per_chunk, num_tokens - sent)
            sent += n
            last = sent >= num_tokens
            _write_chunk(writer, _sse(protocol, self._event(
                protocol, rid, chunk_index, n, sent, last, finish_reason, continuous, details)))
            if log is not None:
                log.append(time.perf_counter_ns())
            chunk_index += 1
            await writer.drain()
        if protocol != "tgi":
            if include_usage and not continuous:
                _write_chunk(writer, _sse(protocol, {"id": rid, "choices": [],
                                                     "usage": _usage(sent)}))
            _write_chunk(writer, b"data: [DONE]\n\n")
        end = _end(writer)
        await writer.drain()
        return end

    def _event(self, protocol: str, rid: str, index: int, n: int, sent: int, last: bool,
               finish_reason: str, continuous: bool, details: bool) -> dict[str, Any]:
        text = " tok" * n
        if protocol == "tgi":
            return {
                "index": sent,
                "token": {"id": 1000 + index, "text": text, "logprob": -0.1, "special": False},
                "generated_text": (" tok" * sent) if last else None,
                "details": ({"finish_reason": finish_reason, "generated_tokens": sent,
                             "seed": 0, "input_length": 0} if last and details else None),
            }
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason if last else None}
        if protocol == "openai-chat":
            choice["delta"] = {"content": text}
            obj: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk",
                                   "choices": [choice]}
        else:
            choice["text"] = text
            choice["logprobs"] = None
            obj = {"id": rid, "object": "text_completion", "choices": [choice]}
        if continuous:
            obj["usage"] = _usage(sent)
        return obj

    async def _fault(self, fault: str, protocol: str, writer: asyncio.StreamWriter) -> bool:
        if fault == "kill":
            writer.transport.abort()
            return False
        if fault == "close":
            _end(writer)
            await writer.drain()
            return False  # and close the connection
        if fault == "hang":
            await writer.drain()
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._hung.add(fut)
            try:
                await fut
            finally:
                self._hung.discard(fut)
            writer.transport.abort()
            return False
        if fault == "malformed":
            prefix = b"data:" if protocol == "tgi" else b"data: "
            _write_chunk(writer, prefix + b'{"choices": [{"text": " to\n\n')
            await writer.drain()
            return _end(writer)
        if fault == "giant_event":
            padding = b"x" * self.giant_event_bytes
            _write_chunk(writer, b'data: {"choices": [{"index": 0, "text": "' + padding
                         + b'"}]}\n\n')
            await writer.drain()
            return _end(writer)
        if fault == "error_event":
            if protocol == "tgi":
                _write_chunk(writer, _sse(protocol, {"error": "injected failure",
                                                     "error_type": "generation"}))
            else:
                _write_chunk(writer, _sse(protocol, {"error": {
                    "message": "injected failure", "type": "InternalServerError",
                    "code": 500}}))
                _write_chunk(writer, b"data: [DONE]\n\n")
            return _end(writer)
        raise ValueError(f"fault {fault!r} does not apply mid-stream")


def _usage(completion: int) -> dict[str, int]:
    return {"prompt_tokens": 0, "completion_tokens": completion, "total_tokens": completion}


def _sse(protocol: str, obj: Mapping[str, Any]) -> bytes:
    # TGI's axum SSE writes no space after the colon; the OpenAI servers do.
    prefix = b"data:" if protocol == "tgi" else b"data: "
    return prefix + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _write_chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))


def _end(writer: asyncio.StreamWriter) -> bool:
    writer.write(b"0\r\n\r\n")
    return True


async def _respond(writer: asyncio.StreamWriter, status: int, body: bytes) -> bool:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests",
              500: "Internal Server Error", 503: "Service Unavailable"}.get(status, "Status")
    writer.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                 % (status, reason.encode(), len(body)) + body)
    await writer.drain()
    return True


# ---------------------------------------------------------------- standalone


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m harness.live.testing",
        description="Serve tokens on a fixed schedule over OpenAI and TGI streaming routes.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft-s", type=float, default=0.02, help="delay before the first chunk")
    p.add_argument("--itl-s", type=float, default=0.005, help="interval between chunks")
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--log-events", action="store_true",
                   help="keep each chunk's send instant, served (and cleared) at GET /_log")
    args = p.parse_args(argv)

    async def serve() -> None:
        server = ScheduledStreamServer(ttft_s=args.ttft_s, itl_s=args.itl_s,
                                       tokens_per_chunk=args.tokens_per_chunk, host=args.host,
                                       port=args.port, log_events=args.log_events)
        await serve_until_signal(server, announce=True)

    asyncio.run(serve())
    return 0


async def serve_until_signal(server: ScheduledStreamServer, *, announce: bool = False) -> None:
    """Start ``server``, serve until SIGINT or SIGTERM, then stop it."""
    await server.start()
    if announce:
        print(f"listening on {server.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop()


@dataclass(frozen=True)
class ServerProcess:
    url: str
    pid: int


@contextlib.contextmanager
def server_process(*args: str) -> Iterator[ServerProcess]:
    """This server in a process of its own (``args``: this module's flags, ``--port 0``
    already given); stopped on exit."""
    proc = subprocess.Popen([sys.executable, "-m", "harness.live.testing", "--port", "0", *args],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"the loopback server did not start: {line!r}")
        yield ServerProcess(line.split()[-1], proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())


class FullAfter:
    """A file whose disk fills after ``num_writes`` writes: then every write is ENOSPC (the
    full-disk tests wrap a run's records file in it). Sent records (``harness.live.recorder``)
    are not counted, only refused once the disk is full: the rows written are then
    ``num_writes``, whatever the sends between them. ``on_full`` is called at the first
    write refused (other files of the disk fill then too)."""

    def __init__(self, file: Any, num_writes: int,
                 on_full: Callable[[], object] | None = None) -> None:
        self._file = file
        self._left = num_writes
        self._on_full = on_full

    def write(self, data: Any) -> int:
        if self._left <= 0:
            if self._on_full is not None:
                self._on_full()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._file.name)
        if _SENT_MARK not in bytes(data):
            self._left -= 1
        return int(self._file.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


_SENT_MARK = b'"batchlab_sent": 1'  # harness.live.recorder.SENT_KEY's (not imported: the
# server process started from this module stays light)


@contextlib.contextmanager
def server_in_thread(**kwargs: Any) -> Iterator[ScheduledStreamServer]:
    """A ``ScheduledStreamServer`` (``kwargs``) on an event loop of its own thread, so that
    other processes (replay workers) reach it over TCP while the caller blocks."""
    loop = asyncio.new_event_loop()
    srv = ScheduledStreamServer(**kwargs)
    loop.run_until_complete(srv.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        asyncio.run_coroutine_threadsafe(srv.stop(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
