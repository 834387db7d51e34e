"""Live replay: send a trace to a serving engine over HTTP and record every streamed chunk.

One run, one ``httpx.AsyncClient``, one clock::

    t0 = perf_counter_ns() when the run starts; every instant below is (perf_counter_ns - t0)/1e9

    arrival_s    scheduled_s         sent_s          chunk instants ...            finished_s
    (trace)      (gate released it)  (POST went out) (bytes of each SSE event read) (end of stream)

- **Open loop** (default): a single scheduler coroutine sleeps until each request's arrival
  (``asyncio.sleep`` to ~2 ms before, then yields in a loop, so it is late by microseconds,
  not by the event loop's millisecond timer) and starts the request as its own task.
  ``max_concurrency`` puts a gate in front: requests pass in arrival order as slots free up, and
  a request that had to wait goes out no sooner than one mean trace inter-arrival gap after the
  previous one, so slots freed in a lump never release a burst (vLLM PR #45502 describes the
  burst). Its gate wait is ``scheduled_s - arrival_s``; its send lag, ``sent_s - scheduled_s``.
- **Closed loop**: ``concurrency`` users; each takes the next trace request (in order) when its
  previous one ends. Trace arrival times are not used: ``arrival_s`` is the instant the user
  became free.

Failures are rows, never exceptions: each request ends as exactly one ``RequestTimeline``
appended to ``records.jsonl`` (``harness.recorder``) with an ``error_kind`` from
``harness.timeline.ERROR_KINDS``. At the end (also after Ctrl-C) the rows are consolidated into
``requests.parquet``/``chunks.parquet`` and ``summary.json``; ``rebuild_summary`` does the same
from ``records.jsonl`` after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, Protocol

import httpx

from harness.http_pool import WIRE_MARKS, LifoPoolTransport, WireMarks
from harness.metrics import DEFAULT_CLIENT_LAG_THRESHOLD_S, Slo, summarize
from harness.prompts import (
    DEFAULT_PREFIX_BLOCK_NUM_TOKENS,
    PromptBuilder,
    TextTokenizer,
    count_output_tokens,
    load_tokenizer,
)
from harness.protocols import (
    LENGTH_CONTROLS,
    OUTPUT_LENGTH_CONTROL,
    PATHS,
    PRIORITY_FIELD,
    PROTOCOLS,
    LengthControl,
    ProtocolName,
    SseDecoder,
    StreamOutcome,
    StreamParser,
    build_body,
    encode_body,
    error_kind_for_status,
)
from harness.recorder import RECORDS_FILE, RecordWriter, read_records
from harness.results import (
    CHUNKS_FILE,
    REQUESTS_FILE,
    SUMMARY_FILE,
    read_timelines,
    write_json_atomic,
    write_timelines,
)
from harness.sse_client import SseClient
from harness.timeline import RequestTimeline
from harness.traces import Trace, TraceRequest

log = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
SPIN_WINDOW_NS = 2_000_000  # the last 2 ms before a send are yielded through, not slept
PROGRESS_INTERVAL_NS = 100_000_000
DRAIN_TIMEOUT_S = 0.5  # after the end event, wait this long for the body's end to reuse the socket


class TelemetrySource(Protocol):
    """Something that samples the engine while the replay runs (e.g. a Prometheus scraper).

    ``run`` starts when the replay starts and must return soon after ``stop`` is set."""

    async def run(self, stop: asyncio.Event) -> None: ...


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """How to replay a trace against one server. Validated once, by ``validate``."""

    target_url: str  # e.g. http://127.0.0.1:8000
    protocol: ProtocolName = "openai"
    model: str | None = None  # the served model name; omitted from requests when None
    mode: Literal["open", "closed"] = "open"
    concurrency: int | None = None  # closed loop: number of users
    max_concurrency: int | None = None  # open loop: cap on requests in flight
    timeout_s: float = 600.0  # per request, from send to the end of its stream
    tokenizer_path: str | None = None  # local HF tokenizer folder or tokenizer.json; no hub
    slo: Slo | None = None
    client_lag_threshold_s: float = DEFAULT_CLIENT_LAG_THRESHOLD_S
    api_key_env: str | None = None  # name of the env var holding a bearer key; never logged
    seed: int = 0  # prompt content
    prefix_block_num_tokens: int = DEFAULT_PREFIX_BLOCK_NUM_TOKENS  # per prefix hash (Mooncake)
    fsync_interval_s: float = 1.0
    # Build every request body before t0 when the trace's prompts total at most this many tokens;
    # above it, each body is built just before its request (while the scheduler waits).
    prebuild_max_prompt_tokens: int = 20_000_000
    # "lean": harness.sse_client parses responses in the socket callback (the fast path);
    # "httpx": httpx with harness.http_pool's transport. Both time at the socket.
    http_client: Literal["lean", "httpx"] = "lean"
    length_control: LengthControl = "vllm"  # how an OpenAI server is asked for exact lengths
    # Sleep until this long before each send, then yield to the event loop until the instant:
    # the loop's timers are only millisecond-precise. 0 = plain sleeps.
    spin_window_s: float = SPIN_WINDOW_NS / 1e9

    def validate(self) -> None:
        url = httpx.URL(self.target_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"target_url: {self.target_url!r} is not an http(s)://host[:port] URL")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol: {self.protocol!r} is not one of {', '.join(PROTOCOLS)}")
        if self.length_control not in LENGTH_CONTROLS:
            raise ValueError(f"length_control: {self.length_control!r} is not one of "
                             f"{', '.join(LENGTH_CONTROLS)}")
        if self.http_client not in ("lean", "httpx"):
            raise ValueError(f"http_client: {self.http_client!r} is not lean or httpx")
        if self.mode not in ("open", "closed"):
            raise ValueError(f"mode: {self.mode!r} is not open or closed")
        if self.mode == "closed" and self.concurrency is None:
            raise ValueError("concurrency: the closed loop needs a number of users (--concurrency)")
        if self.mode == "open" and self.concurrency is not None:
            raise ValueError("concurrency: only for the closed loop; the open loop's cap is "
                             "max_concurrency (--max-concurrency)")
        if self.mode == "closed" and self.max_concurrency is not None:
            raise ValueError("max_concurrency: only for the open loop; the closed loop's users "
                             "are --concurrency")
        for name in ("concurrency", "max_concurrency", "prefix_block_num_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        if not (isinstance(self.spin_window_s, int | float) and 0 <= self.spin_window_s < 1):
            raise ValueError(
                f"spin_window_s: must be in [0, 1) seconds, got {self.spin_window_s!r}")
        for name in ("timeout_s", "client_lag_threshold_s", "fsync_interval_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: must be a positive number of seconds, got {value!r}")
        if self.api_key_env is not None and self.api_key_env not in os.environ:
            raise ValueError(f"api_key_env: environment variable {self.api_key_env} is not set")

    @property
    def url(self) -> str:
        return self.target_url.rstrip("/") + PATHS[self.protocol]

    def as_manifest(self) -> dict[str, Any]:
        d = asdict(self)
        d["slo"] = self.slo.as_dict() if self.slo is not None else None
        return d  # api_key_env is a variable name, never the key


# ---------------------------------------------------------------- precise waiting


async def sleep_until_ns(deadline_ns: int, *, spin_ns: int = SPIN_WINDOW_NS) -> None:
    """Return at ``deadline_ns`` (perf_counter_ns), late by microseconds rather than a timer tick.

    The event loop's timers have millisecond granularity (epoll), so sleep until ``spin_ns``
    before the deadline, then yield to the loop until it passes: other tasks keep running."""
    while True:
        remaining = deadline_ns - time.perf_counter_ns()
        if remaining <= 0:
            return
        if remaining > spin_ns:
            await asyncio.sleep((remaining - spin_ns) / 1e9)
        else:
            await asyncio.sleep(0)


class _Gate:
    """``max_concurrency`` slots, taken only by the one scheduler coroutine (so in arrival order).

    ``acquire`` returns the instant a slot freed up when it had to wait, None when one was free."""

    def __init__(self, num_slots: int) -> None:
        self._free = num_slots
        self._waiter: asyncio.Future[None] | None = None
        self._freed_at_ns = 0

    async def acquire(self) -> int | None:
        if self._free > 0:
            self._free -= 1
            return None
        while self._free == 0:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        self._free -= 1
        return self._freed_at_ns

    def on_done(self, _task: asyncio.Task[None]) -> None:
        self.release()

    def release(self) -> None:
        self._free += 1
        self._freed_at_ns = time.perf_counter_ns()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


# ---------------------------------------------------------------- one request


@dataclass(slots=True)
class _Attempt:
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

    # -- as the lean client's BodySink (harness.sse_client)

    def on_sent(self, t_ns: int) -> None:
        self.sent_ns = t_ns

    def on_body(self, data: bytes, t_ns: int) -> bool:
        """Feed one read's bytes; True once the stream's end (or an error in it) was seen."""
        for event in self.decoder.feed(data):
            if self.parser.on_event(event, t_ns):
                self.end_ns = t_ns
                return True
        return False

    def fail(self, kind: str, message: str) -> None:
        if self.error_kind is None:
            self.error_kind = kind
            self.error_message = message[:500]
        if self.end_ns is None:
            self.end_ns = time.perf_counter_ns()


class _Bodies:
    """Request bodies, encoded once: all before t0 when they fit, else each just in time."""

    def __init__(self, requests: Sequence[TraceRequest], config: ReplayConfig,
                 builder: PromptBuilder) -> None:
        self._requests = requests
        self._config = config
        self._builder = builder
        self._built: list[bytes | None] = [None] * len(requests)

    def prebuild(self) -> bool:
        total = sum(r.num_prompt_tokens for r in self._requests)
        if total > self._config.prebuild_max_prompt_tokens:
            return False
        for i in range(len(self._requests)):
            self._built[i] = self._build(i)
        return True

    def take(self, i: int) -> bytes:
        body = self._built[i]
        self._built[i] = None  # sent once; free the memory
        return body if body is not None else self._build(i)

    def _build(self, i: int) -> bytes:
        req = self._requests[i]
        prompt = self._builder.build(req)
        priority = req.priority if PRIORITY_FIELD[self._config.protocol] else None
        return encode_body(build_body(self._config.protocol, prompt,
                                      num_output_tokens=max(req.num_output_tokens, 1),
                                      model=self._config.model, priority=priority,
                                      length_control=self._config.length_control))


class _Run:
    """The state of one replay: client, clock, writer, requests in flight."""

    def __init__(self, config: ReplayConfig, wire: _Wire, writer: RecordWriter,
                 bodies: _Bodies, tokenizer: TextTokenizer | None, num_total: int,
                 progress: Callable[[int, int], None] | None) -> None:
        self.config = config
        self.wire = wire
        self.writer = writer
        self.bodies = bodies
        self.tokenizer = tokenizer
        self.num_total = num_total
        self.progress = progress
        self.spin_ns = round(config.spin_window_s * 1e9)
        self.t0_ns = time.perf_counter_ns()
        self.timelines: list[RequestTimeline] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.num_sent = 0
        self._last_progress_ns = 0

    def s(self, t_ns: int) -> float:
        return (t_ns - self.t0_ns) / 1e9

    # -- load generators

    async def open_loop(self, requests: Sequence[TraceRequest]) -> None:
        gate = _Gate(self.config.max_concurrency) if self.config.max_concurrency else None
        gap_ns = _mean_gap_ns(requests)
        last_release_ns = self.t0_ns
        behind = False  # the previous request was held past its arrival by the gate
        for i, req in enumerate(requests):
            request = self.wire.prepare(req, self.bodies.take(i))  # built before the arrival
            arrival_ns = self.t0_ns + round(req.arrival_s * 1e9)
            await sleep_until_ns(arrival_ns, spin_ns=self.spin_ns)
            scheduled_ns: int | None = None
            if gate is not None:
                freed_ns = await gate.acquire()
                earliest_ns = arrival_ns if freed_ns is None else max(arrival_ns, freed_ns)
                if freed_ns is not None or behind:
                    # While the gate holds requests back, send no faster than the trace's mean
                    # rate, so slots freed in a lump never release a burst; once the schedule
                    # is caught up (arrival later than that), requests go at their arrival.
                    earliest_ns = max(earliest_ns, last_release_ns + gap_ns)
                behind = earliest_ns > arrival_ns
                if behind:
                    scheduled_ns = earliest_ns
                    await sleep_until_ns(scheduled_ns, spin_ns=self.spin_ns)
            last_release_ns = arrival_ns if scheduled_ns is None else scheduled_ns
            task = asyncio.create_task(self.execute(
                req, request, req.arrival_s,
                None if scheduled_ns is None else self.s(scheduled_ns)))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            if gate is not None:
                task.add_done_callback(gate.on_done)
            # Let the new request go out now, before building the next one.
            await asyncio.sleep(0)
        await self.wait_all()

    async def closed_loop(self, requests: Sequence[TraceRequest]) -> None:
        assert self.config.concurrency is not None
        queue = iter(enumerate(requests))  # shared by the users; next() never yields

        async def user() -> None:
            for i, req in queue:
                arrival_s = self.s(time.perf_counter_ns())
                request = self.wire.prepare(req, self.bodies.take(i))
                await self.execute(req, request, arrival_s, None)

        for _ in range(min(self.config.concurrency, len(requests))):
            task = asyncio.create_task(user())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        await self.wait_all()

    async def wait_all(self) -> None:
        while self.tasks:
            await asyncio.wait(list(self.tasks))

    async def cancel_all(self) -> None:
        """Cancel what is in flight; each request records itself as not_finished."""
        for task in list(self.tasks):
            task.cancel()
        while self.tasks:
            await asyncio.wait(list(self.tasks))

    # -- one request

    async def execute(self, req: TraceRequest, request: object, arrival_s: float,
                      scheduled_s: float | None) -> None:
        att = _Attempt(req, arrival_s, scheduled_s, StreamParser(self.config.protocol))
        att.sent_ns = time.perf_counter_ns()  # until the wire knows better
        self.num_sent += 1
        try:
            try:
                async with asyncio.timeout(self.config.timeout_s):
                    await self.wire.stream(att, request)
            except TimeoutError:
                att.fail("timeout", f"no end of stream within {self.config.timeout_s:g} s")
            except Exception as exc:  # a bug must not stop the replay; the row says what it was
                log.exception("request %s failed in the client", req.request_id)
                att.fail("http_error", f"client error {type(exc).__name__}: {exc}")
        except asyncio.CancelledError:
            finished = (att.error_kind is None and att.end_ns is not None
                        and att.parser.outcome(eof=att.eof).completed)
            if not finished:  # (a cancel while draining a finished stream changes nothing)
                att.error_kind = att.error_kind or "not_finished"
                att.error_message = (att.error_message
                                     or "the run ended before the request finished")
                att.end_ns = None
            self._record(att)
            raise
        self._record(att)

    def _record(self, att: _Attempt) -> None:
        tl = self._timeline(att)
        self.writer.write(tl)
        self.timelines.append(tl)
        if self.progress is not None:
            # at most every PROGRESS_INTERVAL_NS: a progress bar redraw costs the event loop
            now = time.perf_counter_ns()
            done = len(self.timelines)
            if now - self._last_progress_ns >= PROGRESS_INTERVAL_NS or done == self.num_total:
                self._last_progress_ns = now
                self.progress(done, self.num_total)

    def _timeline(self, att: _Attempt) -> RequestTimeline:
        out: StreamOutcome = att.parser.outcome(eof=att.eof)
        kind = att.error_kind or out.error_kind
        message = att.error_message if att.error_kind else out.error_message
        if out.usage_num_output_tokens is not None:
            num_output, source = out.usage_num_output_tokens, "usage"
        elif self.tokenizer is not None and out.text:
            num_output, source = count_output_tokens(self.tokenizer, out.text), "tokenizer"
        else:
            num_output, source = None, "chunks"
        extra: dict[str, Any] = {}
        if att.http_status is not None:
            extra["http_status"] = att.http_status
        if out.usage_num_prompt_tokens is not None:
            extra["server_num_prompt_tokens"] = out.usage_num_prompt_tokens
        return RequestTimeline(
            request_id=att.req.request_id,
            arrival_s=att.arrival_s,
            num_prompt_tokens=att.req.num_prompt_tokens,
            num_target_output_tokens=att.req.num_output_tokens,
            priority=att.req.priority,
            sent_s=None if att.sent_ns is None else self.s(att.sent_ns),
            scheduled_s=att.scheduled_s,
            chunk_times_s=tuple(self.s(t) for t in out.chunk_times_ns),
            chunk_num_tokens=out.chunk_num_tokens,
            finished_s=None if att.end_ns is None else self.s(att.end_ns),
            num_output_tokens=num_output,
            error_kind=kind,
            error_message=message,
            finish_reason=out.finish_reason,
            token_count_source=source,
            extra=extra,
        )


# ---------------------------------------------------------------- the wire


class _Wire(Protocol):
    """How requests reach the server. ``prepare`` runs before the request's instant (so its
    cost is not send lag); ``stream`` sends it and fills the attempt: send instant, chunks
    (through ``att.on_body``), end instant, and failures as ``att.fail`` values."""

    def prepare(self, req: TraceRequest, body: bytes) -> object: ...

    async def stream(self, att: _Attempt, prepared: object) -> None: ...

    async def warm_up(self) -> None: ...

    async def aclose(self) -> None: ...


class _LeanWire:
    """``harness.sse_client``: the parsing runs in the socket's data callback."""

    def __init__(self, config: ReplayConfig, max_connections: int | None) -> None:
        self._path = PATHS[config.protocol]
        headers = {k: v for k, v in _headers(config).items() if k != "Accept-Encoding"}
        self._client = SseClient(config.target_url, max_connections=max_connections,
                                 headers=headers, connect_timeout_s=config.timeout_s)

    def prepare(self, req: TraceRequest, body: bytes) -> bytes:
        return self._client.encode_request("POST", self._path, body,
                                           {"X-Request-Id": req.request_id})

    async def stream(self, att: _Attempt, prepared: object) -> None:
        assert isinstance(prepared, bytes)
        ex = await self._client.exchange(prepared, att)
        att.sent_ns = ex.sent_ns
        att.http_status = ex.status
        if ex.end == "connect_error":
            att.fail("connect_error", ex.message)
        elif ex.status is not None and not 200 <= ex.status < 300:
            att.fail(error_kind_for_status(ex.status), f"HTTP {ex.status}: "
                     + ex.error_body.decode("utf-8", errors="replace"))
        elif ex.end == "cut":
            att.fail("stream_cut", ex.message)
        elif ex.end == "protocol_error":
            att.fail("http_error", f"malformed HTTP response: {ex.message}")
        elif ex.end == "complete":  # the body ended without the sink seeing the stream's end
            att.eof = True
            att.end_ns = ex.end_ns

    async def warm_up(self) -> None:
        request = self._client.encode_request("GET", "/health", b"")
        await self._client.exchange(request, _IgnoreBody())

    async def aclose(self) -> None:
        await self._client.aclose()


class _IgnoreBody:
    def on_sent(self, t_ns: int) -> None:
        pass

    def on_body(self, data: bytes, t_ns: int) -> bool:
        return False


class _HttpxWire:
    """httpx with ``harness.http_pool``'s transport (socket-level instants via WireMarks)."""

    def __init__(self, config: ReplayConfig, max_connections: int | None) -> None:
        self._url = config.url
        self._health_url = config.target_url.rstrip("/") + "/health"
        self._headers = _headers(config)
        self._client = httpx.AsyncClient(
            transport=LifoPoolTransport(max_connections=max_connections),
            timeout=httpx.Timeout(config.timeout_s, pool=None),
            trust_env=False,  # a proxy from the environment must not sit in between
        )

    def prepare(self, req: TraceRequest, body: bytes) -> httpx.Request:
        return self._client.build_request(
            "POST", self._url, content=body,
            headers={**self._headers, "X-Request-Id": req.request_id})

    async def stream(self, att: _Attempt, prepared: object) -> None:
        assert isinstance(prepared, httpx.Request)
        marks = WireMarks()
        token = WIRE_MARKS.set(marks)
        try:
            await self._exchange(att, prepared, marks)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            att.fail("connect_error", f"{type(exc).__name__}: {exc}")
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            att.fail("stream_cut", f"{type(exc).__name__}: {exc}")
        except httpx.TimeoutException as exc:
            att.fail("timeout", f"{type(exc).__name__}: {exc}")
        except httpx.HTTPError as exc:
            att.fail("http_error", f"{type(exc).__name__}: {exc}")
        finally:
            if marks.sent_ns:
                att.sent_ns = marks.sent_ns
            WIRE_MARKS.reset(token)

    async def _exchange(self, att: _Attempt, request: httpx.Request, marks: WireMarks) -> None:
        response = await self._client.send(request, stream=True)
        try:
            att.http_status = response.status_code
            if not 200 <= response.status_code < 300:
                text = (await response.aread())[:300].decode("utf-8", errors="replace")
                att.fail(error_kind_for_status(response.status_code),
                         f"HTTP {response.status_code}: {text}")
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


def _headers(config: ReplayConfig) -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        "Accept": "text/event-stream",
        "Accept-Encoding": "identity",
        "User-Agent": f"batchlab/{batchlab_version()}",
    }
    if config.api_key_env is not None:
        headers["Authorization"] = f"Bearer {os.environ[config.api_key_env]}"
    return headers


def _mean_gap_ns(requests: Sequence[TraceRequest]) -> int:
    if len(requests) < 2:
        return 0
    span = requests[-1].arrival_s - requests[0].arrival_s
    return max(0, round(span / (len(requests) - 1) * 1e9))


# ---------------------------------------------------------------- the run


def batchlab_version() -> str:
    try:
        return metadata.version("batchlab")
    except metadata.PackageNotFoundError:
        return "unknown"


def _priority_note(trace: Trace, protocol: ProtocolName) -> str:
    if not any(r.priority is not None for r in trace.requests):
        return "none: no request has a priority"
    fld = PRIORITY_FIELD[protocol]
    if fld is None:
        return f"not applied: the {protocol} protocol has no priority field"
    return f"applied: sent in the request's {fld!r} field"


def _manifest(trace: Trace, config: ReplayConfig, builder: PromptBuilder,
              command: Sequence[str] | None) -> dict[str, Any]:
    return {
        "kind": "live",
        "trace": {
            "source": trace.source,
            "format": trace.format,
            "digest": trace.digest,
            "notes": list(trace.notes),
            "counts": dict(trace.counts),
            "num_requests": len(trace.requests),
        },
        "command": list(command) if command is not None else None,
        "batchlab_version": batchlab_version(),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "target": config.target_url,
        "protocol": config.protocol,
        "model": config.model,
        "mode": config.mode,
        "replay": config.as_manifest(),
        "prompt_mode": builder.mode,
        "priority": _priority_note(trace, config.protocol),
        "output_length": OUTPUT_LENGTH_CONTROL[config.protocol],
        "slo": config.slo.as_dict() if config.slo is not None else None,
        "client_lag_threshold_s": config.client_lag_threshold_s,
        "clock": "time.perf_counter_ns, instants in seconds from t0 (run start)",
        "status": "running",
    }


def _write_manifest(out_dir: Path, fields: dict[str, Any]) -> None:
    path = out_dir / MANIFEST_FILE
    merged: dict[str, Any] = {}
    if path.exists():
        with contextlib.suppress(ValueError, OSError):
            merged = json.loads(path.read_text())
    merged.update(fields)
    write_json_atomic(merged, path)


def _consolidate(out_dir: Path, timelines: Sequence[RequestTimeline], *, slo: Slo | None,
                 client_lag_threshold_s: float) -> dict[str, Any]:
    ordered = sorted(timelines, key=lambda tl: tl.arrival_s)
    write_timelines(out_dir, ordered, live=True)
    summary = summarize(ordered, slo=slo, client_lag_threshold_s=client_lag_threshold_s)
    write_json_atomic(summary, out_dir / SUMMARY_FILE)
    return summary


async def replay(
    trace: Trace,
    config: ReplayConfig,
    out_dir: Path,
    *,
    telemetry: TelemetrySource | None = None,
    progress: Callable[[int, int], None] | None = None,
    command: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Replay ``trace`` against ``config.target_url``; write the run folder; return the summary.

    Cancelled (Ctrl-C), it records the requests in flight as ``not_finished``, still writes
    the parquet files and ``summary.json`` from what was measured, then re-raises."""
    config.validate()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in (RECORDS_FILE, REQUESTS_FILE, CHUNKS_FILE, SUMMARY_FILE):
        (out_dir / stale).unlink(missing_ok=True)
    tokenizer = load_tokenizer(config.tokenizer_path) if config.tokenizer_path else None
    builder = PromptBuilder(config.protocol, tokenizer, seed=config.seed,
                            block_num_tokens=config.prefix_block_num_tokens)
    requests = trace.requests
    bodies = _Bodies(requests, config, builder)
    prebuilt = bodies.prebuild()
    _write_manifest(out_dir, _manifest(trace, config, builder, command))

    cap = config.max_concurrency if config.mode == "open" else config.concurrency
    wire: _Wire = (_LeanWire(config, cap) if config.http_client == "lean"
                   else _HttpxWire(config, cap))
    try:
        await _warm_up(wire, config)
    except BaseException:
        await wire.aclose()
        raise
    writer = RecordWriter(out_dir / RECORDS_FILE, fsync_interval_s=config.fsync_interval_s)
    stop = asyncio.Event()
    run = _Run(config, wire, writer, bodies, tokenizer, len(requests), progress)  # t0
    sync_task = asyncio.create_task(writer.sync_loop(stop))
    telemetry_task = (asyncio.create_task(telemetry.run(stop)) if telemetry is not None
                      else None)
    status = "interrupted"
    try:
        try:
            if config.mode == "open":
                await run.open_loop(requests)
            else:
                await run.closed_loop(requests)
            status = "finished"
        finally:
            await run.cancel_all()
            await wire.aclose()
            stop.set()
            if telemetry_task is not None:
                await _stop_telemetry(telemetry_task)
            with contextlib.suppress(Exception):
                await sync_task
    finally:
        sync_task.cancel()
        writer.close()
        summary = _consolidate(out_dir, run.timelines, slo=config.slo,
                               client_lag_threshold_s=config.client_lag_threshold_s)
        stats = builder.stats
        _write_manifest(out_dir, {
            "status": status,
            "t0_perf_counter_ns": run.t0_ns,
            "num_sent": run.num_sent,
            "num_recorded": len(run.timelines),
            "num_not_sent": len(requests) - len(run.timelines),
            "bodies_prebuilt": prebuilt,
            "num_prompts_inexact": stats.num_inexact,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "client_limited": summary.get("client_limited"),
        })
    return summary


async def _warm_up(wire: _Wire, config: ReplayConfig) -> None:
    """One GET /health before t0: opens a first connection, and warms what the first requests
    would otherwise pay as send lag. Its outcome does not matter."""
    with contextlib.suppress(httpx.HTTPError, OSError):
        async with asyncio.timeout(min(config.timeout_s, 5.0)):
            await wire.warm_up()


async def _stop_telemetry(task: asyncio.Task[None], grace_s: float = 5.0) -> None:
    try:
        async with asyncio.timeout(grace_s):
            await asyncio.shield(task)
    except TimeoutError:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    except Exception:  # telemetry failing must not lose the replay's results
        log.exception("telemetry source failed")


def replay_sync(
    trace: Trace,
    config: ReplayConfig,
    out_dir: Path,
    *,
    telemetry: TelemetrySource | None = None,
    progress: Callable[[int, int], None] | None = None,
    command: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``replay`` under ``asyncio.run``. On Ctrl-C, asyncio cancels the replay, which records
    what was in flight and writes the run folder; then KeyboardInterrupt propagates."""
    return asyncio.run(replay(trace, config, out_dir, telemetry=telemetry, progress=progress,
                              command=command))


def rebuild_summary(out_dir: Path, *, slo: Slo | None = None) -> dict[str, Any]:
    """Rebuild ``requests.parquet``, ``chunks.parquet`` and ``summary.json`` of a run folder
    from its ``records.jsonl`` (after a crash), or re-summarise its parquet files.

    ``slo`` defaults to the one in the folder's manifest. Keys of an existing summary that
    ``summarize`` does not produce (e.g. a simulation's step count) are kept."""
    out_dir = Path(out_dir)
    manifest: dict[str, Any] = {}
    with contextlib.suppress(ValueError, OSError):
        manifest = json.loads((out_dir / MANIFEST_FILE).read_text())
    if slo is None and manifest.get("slo"):
        slo = Slo(**manifest["slo"])
    threshold = float(manifest.get("client_lag_threshold_s") or DEFAULT_CLIENT_LAG_THRESHOLD_S)
    records = out_dir / RECORDS_FILE
    if records.exists():
        timelines = sorted(read_records(records), key=lambda tl: tl.arrival_s)
        write_timelines(out_dir, timelines, live=True)
    elif (out_dir / REQUESTS_FILE).exists():
        timelines = read_timelines(out_dir)
    else:
        raise ValueError(f"{out_dir}: no {RECORDS_FILE} or {REQUESTS_FILE} to summarise")
    summary = summarize(timelines, slo=slo, client_lag_threshold_s=threshold)
    old_path = out_dir / SUMMARY_FILE
    if old_path.exists():
        with contextlib.suppress(ValueError, OSError):
            old = json.loads(old_path.read_text())
            derived = {"slo", "goodput", "send_lag_s", "client_limited", "client_lag_threshold_s",
                       "gate_wait_s", "by_priority"}
            for key, value in old.items():
                if key not in summary and key not in derived:
                    summary[key] = value
    write_json_atomic(summary, old_path)
    return summary
