"""The HTTP server: the Starlette app and its routes, and running it (``serve``, or a thread).

    ReferenceServer
      engine   ServedEngine       the step loop, started and stopped with the app (lifespan)
      openai   OpenAiRoutes       /v1/completions, /v1/chat/completions, /v1/models
      tgi      TgiRoutes          /generate, /generate_stream, POST /, /info
      metrics  PrometheusMetrics  /metrics (the step loop's observer)
      here                        /health, /ping, GET /, /version
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from adapters.process import NONCE_ENV
from adapters.reference.config import ReferenceConfig
from adapters.reference.prediction import prediction_record
from harness.manifest import batchlab_version
from harness.serve.loop import ENGINE_NAME, ServedEngine
from harness.serve.metrics import PrometheusMetrics
from harness.serve.openai import OpenAiRoutes
from harness.serve.prompts import PromptCounter
from harness.serve.tgi import TgiRoutes


class ReferenceServer:
    """The HTTP front of a ``ServedEngine``: ``app`` is an ASGI application."""

    def __init__(self, config: ReferenceConfig, *, served_model_name: str | None = None,
                 tokenizer_path: str | None = None,
                 on_ready: Callable[[], None] | None = None,
                 api_key: str | None = None) -> None:
        self.config = config
        self._prediction = prediction_record(config)
        self.engine = ServedEngine(config)
        self.model_name = served_model_name or config.model
        self.counter = PromptCounter(tokenizer_path)
        self.openai = OpenAiRoutes(self.engine, self.model_name, self.counter)
        self.tgi = TgiRoutes(self.engine, self.model_name, self.counter, self._prediction)
        self.metrics = PrometheusMetrics(self.engine, self.model_name)
        self.engine.observer = self.metrics
        self._on_ready = on_ready
        self._steps: asyncio.Task[None] | None = None  # the step loop, while the app runs
        self.app = Starlette(
            routes=[
                Route("/v1/completions", self.openai.completions, methods=["POST"]),
                Route("/v1/chat/completions", self.openai.chat_completions, methods=["POST"]),
                Route("/generate", self.tgi.generate, methods=["POST"]),
                Route("/generate_stream", self.tgi.generate_stream, methods=["POST"]),
                Route("/", self.tgi.compat, methods=["POST"]),
                Route("/", self.health, methods=["GET"]),  # TGI answers health checks here too
                Route("/health", self.health, methods=["GET"]),
                Route("/ping", self.health, methods=["GET", "POST"]),
                Route("/v1/models", self.openai.models, methods=["GET"]),
                Route("/version", self.version, methods=["GET"]),
                Route("/info", self.tgi.info, methods=["GET"]),
                Route("/metrics", self.prometheus, methods=["GET"]),
            ],
            lifespan=self._lifespan,
        )
        self.asgi: Any = self.app if not api_key else _RequireApiKey(self.app, api_key)

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        self._steps = asyncio.create_task(self.engine.run(), name="reference-engine-steps")
        if self._on_ready is not None:
            self._on_ready()
        try:
            yield
        finally:
            await self.stop_engine()

    async def stop_engine(self) -> None:
        """Stop the step loop: every request in flight ends with an error event saying the
        server is shutting down (and ``[DONE]`` on the OpenAI routes), so that its client
        reads an ending rather than a cut connection. Safe to call twice."""
        task = self._steps
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def health(self, _request: StarletteRequest) -> Response:
        if self.engine.failure is not None:
            return JSONResponse({"error": "unhealthy", "error_type": "healthcheck"},
                                status_code=503)
        return Response(status_code=200)

    async def version(self, _request: StarletteRequest) -> Response:
        # launch_nonce: the launcher's BATCHLAB_LAUNCH_NONCE, so it can tell this server from
        # another one answering on the same port (adapters.process.ServerProcess.wait_ready).
        # prediction: every timing this server produces is a prediction; a live run keeps this
        # answer in its manifest (engine.version_probe), and its report says so.
        # reference: its configuration, as /info publishes it: a run attached to this server
        # records the knobs it ran with rather than "unknown"; with the cost model's
        # frontend_latency_s, the delay every request spends before reaching the scheduler
        return JSONResponse({"version": batchlab_version(), "engine": ENGINE_NAME,
                             "launch_nonce": os.environ.get(NONCE_ENV),
                             "prediction": self._prediction,
                             "reference": self.engine.published_config()})

    async def prometheus(self, _request: StarletteRequest) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


class _RequireApiKey:
    """vLLM's ``--api-key``: every ``/v1`` route answers 401 ``{"error": "Unauthorized"}``
    unless the request carries ``Authorization: Bearer <key>``; the others (health, metrics,
    version, TGI's routes) stay open, as in vLLM. The key is compared in constant time and
    never logged."""

    def __init__(self, app: Any, key: str) -> None:
        self._app = app
        self._expected = f"Bearer {key}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") == "http" and str(scope.get("path", "")).startswith("/v1"):
            given = dict(scope.get("headers") or ()).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                body = json.dumps({"error": "Unauthorized"}).encode()
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self._app(scope, receive, send)

# ---------------------------------------------------------------- running it


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """How to serve: where to listen and what to call the model."""

    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port
    served_model_name: str | None = None  # default: the reference config's model name
    tokenizer_path: str | None = None  # count text prompts with this local tokenizer
    log_level: str = "warning"
    access_log: bool = False
    graceful_shutdown_s: int = 5  # on SIGTERM/SIGINT, let streams finish this long
    api_key: str | None = field(default=None, repr=False)  # /v1 routes need it (vLLM's)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0 picks a free one); raises OSError when it cannot bind.

    Its connections send each SSE event at once (TCP_NODELAY). asyncio turns Nagle's algorithm
    off only for sockets made with proto IPPROTO_TCP, and uvicorn serving a socket made with
    proto 0 left it on: the first event waited for the client's delayed ACK of the response
    headers, up to 40 ms on a reused connection (``bench/ttft_side_by_side.py``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # (accepted ones inherit it)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def socket_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


# How long the streams still open when the graceful period ends get to send their ending (the
# engine's error event, [DONE]); anything open after that is cancelled.
ENDING_S = 3.0
_log = logging.getLogger("uvicorn.error")  # uvicorn's own log: its level is --log-level


class _UvicornServer(uvicorn.Server):
    """uvicorn, shutting down as docs/reference-server.md says (SIGTERM, Ctrl-C, ``stop()``):

    1. admit nothing new: the listening sockets close, idle connections close, and a busy
       one closes once its response is complete;
    2. the step loop keeps stepping for up to the graceful period, so open streams finish;
    3. then the engine stops: each request still open ends with an error event saying the
       server is shutting down (and ``[DONE]`` on the OpenAI routes), sent by its handler;
    4. a request still open ``ENDING_S`` later is cancelled; then the app's lifespan ends.

    uvicorn's own shutdown does (1) and (2), but then cancels the handlers of the streams
    still open, cutting them mid-token with a traceback in the log, and stops the engine only
    afterwards, in the lifespan. A second Ctrl-C skips the graceful period, as in uvicorn, and
    logs one line: the streams still open get their ending at once (3 does not wait on the
    step loop: it takes no longer than writing two events), and the lifespan still ends, as
    it does not in uvicorn (the engine is stopped already, so it is quick; a lifespan left
    running is cancelled at exit, with a traceback)."""

    def __init__(self, config: uvicorn.Config, reference: ReferenceServer) -> None:
        super().__init__(config)
        self._reference = reference

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        _log.info("Shutting down")
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        grace_s = float(self.config.timeout_graceful_shutdown or 0)
        if not await self._all_closed(grace_s, until_forced=True):
            if self.force_exit:
                _log.warning("Forced exit: ending %d open stream(s) now",
                             len(self.server_state.connections))
            else:
                _log.warning("%d stream(s) still open after the graceful period (%g s): "
                             "ending them", len(self.server_state.connections), grace_s)
        await self._reference.stop_engine()
        if await self._all_closed(ENDING_S, until_forced=False):
            for server in self.servers:
                await server.wait_closed()
        else:
            for task in self.server_state.tasks:
                task.cancel(msg="the server is shutting down")
        await self.lifespan.shutdown()

    async def _all_closed(self, timeout_s: float, *, until_forced: bool) -> bool:
        """Wait up to ``timeout_s`` (and, ``until_forced``, not past a second Ctrl-C) for every
        connection and request task to end; whether they did."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        state = self.server_state
        while (state.connections or state.tasks) and loop.time() < deadline \
                and not (until_forced and self.force_exit):
            await asyncio.sleep(0.05)
        return not (state.connections or state.tasks)


def _uvicorn_server(server: ReferenceServer, options: ServerOptions) -> uvicorn.Server:
    return _UvicornServer(uvicorn.Config(
        server.asgi, log_level=options.log_level, access_log=options.access_log,
        lifespan="on", ws="none", timeout_graceful_shutdown=options.graceful_shutdown_s,
    ), server)


def serve(config: ReferenceConfig, options: ServerOptions,
          on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn's graceful shutdown). Blocks; main thread.

    ``on_ready(url)`` is called once the engine loop runs and the socket listens."""
    url = ""  # known once bound; the server calls on_ready after that

    def ready() -> None:
        if on_ready is not None:
            on_ready(url)

    server = ReferenceServer(config, served_model_name=options.served_model_name,
                             tokenizer_path=options.tokenizer_path, on_ready=ready,
                             api_key=options.api_key)
    sock = bind_socket(options.host, options.port)
    url = socket_url(sock)
    try:
        _uvicorn_server(server, options).run(sockets=[sock])
    finally:
        sock.close()


@dataclass(frozen=True)
class RunningServer:
    """A server started by ``start_server_in_thread``: its URL and how to stop it."""

    url: str
    server: ReferenceServer
    stop: Callable[[], None]

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def __iter__(self) -> Iterator[Any]:  # base_url, stop = start_server_in_thread(...)
        return iter((self.url, self.stop))


def start_server_in_thread(config: ReferenceConfig, options: ServerOptions | None = None, *,
                           host: str = "127.0.0.1", port: int = 0,
                           startup_timeout_s: float = 30.0) -> RunningServer:
    """Start a server on a background thread (its own event loop); for tests and benchmarks.

    ``options`` wins over ``host``/``port``. ``stop()`` shuts it down and joins the thread."""
    options = options or ServerOptions(host=host, port=port)
    server = ReferenceServer(config, served_model_name=options.served_model_name,
                             tokenizer_path=options.tokenizer_path, api_key=options.api_key)
    sock = bind_socket(options.host, options.port)
    uv = _uvicorn_server(server, options)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(uv.serve(sockets=[sock]))
        except BaseException as exc:  # reported by start (if not started) or stop
            failure.append(exc)

    thread = threading.Thread(target=run, name="reference-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not uv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            uv.should_exit = True
            thread.join(5)
            sock.close()
            raise RuntimeError(f"the reference server did not start: {failure or 'timeout'}")
        time.sleep(0.005)

    def stop() -> None:
        uv.should_exit = True
        thread.join(options.graceful_shutdown_s + 10)
        sock.close()

    return RunningServer(socket_url(sock), server, stop)
