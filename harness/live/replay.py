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
appended to ``records.jsonl`` (``harness.live.recorder``) with an ``error_kind`` from
``harness.timeline.ERROR_KINDS``. Before that, as it goes out, a sent record goes there (its
text made before the request's instant; once its bytes are on the socket, one ``write``), so a
replay killed outright (SIGKILL) still leaves every request it sent on disk, those in flight
as ``not_finished``. At the end (also after Ctrl-C) the rows are consolidated into
``requests.parquet``/``chunks.parquet`` and ``summary.json``; ``rebuild_summary`` does the same
from ``records.jsonl`` after a crash. When the disk refuses a row (full), the run stops there:
what is in flight is recorded as ``not_finished``, the rows already written stay, the manifest
says where it stopped, and ``RunWriteError`` is raised (a sent record it refuses does the
same).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from pathlib import Path
from typing import Any

import httpx

from harness.live.config import (
    PROGRESS_INTERVAL_NS,
    SPIN_WINDOW_NS,
    ReplayConfig,
    TelemetrySource,
)
from harness.live.early_stop import watch_early_stop
from harness.live.prompts import (
    PromptBuilder,
    TextTokenizer,
    count_output_tokens,
    load_tokenizer,
)
from harness.live.protocols import (
    SseDecoder,
    StreamOutcome,
    StreamParser,
    build_body,
    encode_body,
)
from harness.live.recorder import RECORDS_FILE, RecordWriter, SentRecord
from harness.live.rundir import finish_run_folder, replay_manifest, update_manifest_quietly
from harness.live.wire import Attempt, Wire, wire_for
from harness.manifest import update_manifest
from harness.redact import scrub_text, secret_values
from harness.results import (
    CHUNKS_FILE,
    REQUESTS_FILE,
    SUMMARY_FILE,
)
from harness.runfolder import RunIdentity, RunWriteError, claim_run_dir, release_run_dir
from harness.target import EarlyStop
from harness.timeline import RequestTimeline
from harness.traces import Trace, TraceRequest

log = logging.getLogger(__name__)


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


class _Bodies:
    """Request bodies, encoded once: all before t0 when they fit, else each just in time."""

    def __init__(self, requests: Sequence[TraceRequest], config: ReplayConfig,
                 builder: PromptBuilder) -> None:
        self._requests = requests
        self._config = config
        self._builder = builder
        self._built: list[bytes | None] = [None] * len(requests)
        # whether requests carry their priority (the manifest's note says why, or why not)
        self._send_priority = config.priority_plan(requests).send

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
        priority = req.priority if self._send_priority else None
        # build_body writes it in the scale of the engine behind the server (config.engine)
        return encode_body(build_body(self._config.protocol, prompt,
                                      num_output_tokens=max(req.num_output_tokens, 1),
                                      model=self._config.model, priority=priority,
                                      length_control=self._config.length_control,
                                      timings_per_token=self._config.timings_per_token,
                                      engine=self._config.engine))


class _Run:
    """The state of one replay: client, clock, writer, requests in flight."""

    def __init__(self, config: ReplayConfig, wire: Wire, writer: RecordWriter,
                 bodies: _Bodies, tokenizer: TextTokenizer | None, num_total: int,
                 progress: Callable[[int, int], None] | None, t0_ns: int | None = None,
                 secrets: Iterable[str] = ()) -> None:
        self.config = config
        self.wire = wire
        self.writer = writer
        self.bodies = bodies
        self.tokenizer = tokenizer
        self.num_total = num_total
        self.progress = progress
        self.spin_ns = round(config.spin_window_s * 1e9)
        self.t0_ns = time.perf_counter_ns() if t0_ns is None else t0_ns  # given: shared
        self.timelines: list[RequestTimeline] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.num_sent = 0
        self._last_progress_ns = 0
        self.last_send_lag_s: float | None = None  # the latest send's lateness
        self.stop_reason: str | None = None  # an early-stop check ended the run
        self.write_error: OSError | None = None  # the disk refused a row: the run stops
        self.stopped_at_s: float | None = None
        self.on_write_error: Callable[[], object] | None = None
        # a server may echo the API key in an error body, an error may quote the target URL
        # with its credentials, a launched server its environment: never into a row
        self.secrets = secret_values(api_key_env=config.api_key_env,
                                     urls=(config.target_url,)) | frozenset(secrets)

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
            sent_record = SentRecord(req)
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
                None if scheduled_ns is None else self.s(scheduled_ns), sent_record))
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
        await sleep_until_ns(self.t0_ns, spin_ns=self.spin_ns)  # a t0 given ahead (workers)

        async def user() -> None:
            for i, req in queue:
                sent_record = SentRecord(req)
                arrival_s = self.s(time.perf_counter_ns())
                request = self.wire.prepare(req, self.bodies.take(i))
                await self.execute(req, request, arrival_s, None, sent_record)

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
                      scheduled_s: float | None, sent_record: SentRecord | None = None) -> None:
        att = Attempt(req, arrival_s, scheduled_s, StreamParser(self.config.protocol),
                      decoder=SseDecoder(self.config.max_event_bytes))
        att.sent_ns = time.perf_counter_ns()  # until the wire knows better
        self.num_sent += 1
        self.last_send_lag_s = self.s(att.sent_ns) - (arrival_s if scheduled_s is None
                                                      else scheduled_s)
        # The sent record is written once this task first waits in the wire: the request's
        # bytes are then on the socket (the lean client writes them before it waits), so the
        # write costs its send lag nothing. A row written first (a wire that never waited)
        # makes it moot.
        noting = asyncio.get_running_loop().call_soon(
            self._note_sent, sent_record or SentRecord(req), att)
        try:
            try:
                async with asyncio.timeout(self.config.timeout_s):
                    await self.wire.stream(att, request)
            except TimeoutError:
                if not _finished(att):  # (the timeout hit while draining a finished stream)
                    att.fail("timeout", f"no end of stream within {self.config.timeout_s:g} s")
            except Exception as exc:  # a bug must not stop the replay; the row says what it was
                log.exception("request %s failed in the client", req.request_id)
                att.fail("http_error", f"client error {type(exc).__name__}: {exc}")
        except asyncio.CancelledError:
            if not _finished(att):  # (a cancel while draining a finished stream changes nothing)
                att.error_kind = att.error_kind or "not_finished"
                att.error_message = (att.error_message
                                     or "the run ended before the request finished")
                att.end_ns = None
            noting.cancel()
            self._record(att)
            raise
        noting.cancel()
        self._record(att)

    def _note_sent(self, sent_record: SentRecord, att: Attempt) -> None:
        """Write the request's sent record (``harness.live.recorder``); a full disk stops the
        run as a row it refuses does."""
        if self.write_error is not None:
            return
        assert att.sent_ns is not None
        try:
            self.writer.write_sent(sent_record.line(att.arrival_s, att.scheduled_s,
                                                    self.s(att.sent_ns)))
        except OSError as exc:
            self._write_failed(exc)

    def _write_failed(self, exc: OSError) -> None:
        """A full disk: stop the run here, keep what was written."""
        self.write_error = exc
        self.stopped_at_s = self.s(time.perf_counter_ns())
        if self.on_write_error is not None:
            self.on_write_error()

    def _record(self, att: Attempt) -> None:
        tl = self._timeline(att)
        if self.write_error is None:
            try:
                self.writer.write(tl)
            except OSError as exc:
                self._write_failed(exc)
        self.timelines.append(tl)
        if self.progress is not None:
            # at most every PROGRESS_INTERVAL_NS: a progress bar redraw costs the event loop
            now = time.perf_counter_ns()
            done = len(self.timelines)
            if now - self._last_progress_ns >= PROGRESS_INTERVAL_NS or done == self.num_total:
                self._last_progress_ns = now
                self.progress(done, self.num_total)

    def _timeline(self, att: Attempt) -> RequestTimeline:
        out: StreamOutcome = att.parser.outcome(eof=att.eof)
        kind = att.error_kind or out.error_kind
        message = att.error_message if att.error_kind else out.error_message
        if message and self.secrets:
            message = scrub_text(message, self.secrets)
        if out.usage_num_output_tokens is not None:
            num_output, source = out.usage_num_output_tokens, out.count_source
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
            num_retries=att.num_retries,
            extra=extra,
        )




def _finished(att: Attempt) -> bool:
    """The stream ended as a completed request: a timeout or cancel after that (while the
    client reads the rest of the HTTP body, so that the connection can be reused) changes
    nothing about the request."""
    return (att.error_kind is None and att.end_ns is not None
            and att.parser.outcome(eof=att.eof).completed)


def _mean_gap_ns(requests: Sequence[TraceRequest]) -> int:
    if len(requests) < 2:
        return 0
    span = requests[-1].arrival_s - requests[0].arrival_s
    return max(0, round(span / (len(requests) - 1) * 1e9))


# ---------------------------------------------------------------- the run




async def replay(
    trace: Trace,
    config: ReplayConfig,
    out_dir: Path,
    *,
    telemetry: TelemetrySource | None = None,
    progress: Callable[[int, int], None] | None = None,
    command: Sequence[str] | None = None,
    on_t0: Callable[[int], None] | None = None,
    run_id: str | None = None,
    overwrite: bool = False,
    early_stop: EarlyStop | None = None,
    t0_ns: int | None = None,
    wire: Wire | None = None,
    secrets: Iterable[str] = (),
    on_start: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Replay ``trace`` against ``config.target_url``; write the run folder; return the summary.

    ``on_t0`` receives the run's clock origin (``perf_counter_ns`` at t0) when the run starts,
    so a caller can put other signals (telemetry) on the same clock. ``run_id``: the folder
    was already claimed by the caller (``run_live``); otherwise it is claimed here
    (``harness.runfolder``; another run's folder is refused unless ``overwrite``).
    ``t0_ns`` sets the clock origin instead of now (a ``perf_counter_ns`` instant, possibly
    ahead: worker processes replaying parts of one trace share it). ``early_stop``: see
    ``harness.live.early_stop``; the reason is written to summary and manifest (``stopped_early``).
    ``secrets``: values masked in every row's error message besides the API key and the
    target URL's credentials (a launched server's environment: ``run_live``). ``on_start``
    is called once the folder is claimed and its manifest written, before the first request:
    what the caller records there (the server's own record) survives a run killed outright.

    Cancelled (Ctrl-C), it records the requests in flight as ``not_finished``, still writes
    the parquet files and ``summary.json`` from what was measured, then re-raises. Raises
    ``RunWriteError`` when the disk refused a row (module doc)."""
    config.validate()
    out_dir = Path(out_dir)
    def run(run_id: str) -> Coroutine[Any, Any, dict[str, Any]]:
        return _replay(trace, config, out_dir, run_id, telemetry=telemetry, progress=progress,
                       command=command, on_t0=on_t0, early_stop=early_stop, t0_ns=t0_ns,
                       wire=wire, secrets=secrets, on_start=on_start)

    if run_id is not None:  # claimed, and let go, by the caller
        return await run(run_id)
    run_id = claim_run_dir(out_dir, RunIdentity("live", trace.digest, target=config.target_url),
                           overwrite=overwrite)
    try:
        return await run(run_id)
    finally:
        release_run_dir(out_dir)  # the run has ended: another process may write the folder


async def _replay(trace: Trace, config: ReplayConfig, out_dir: Path, run_id: str, *,
                  telemetry: TelemetrySource | None, progress: Callable[[int, int], None] | None,
                  command: Sequence[str] | None, on_t0: Callable[[int], None] | None,
                  early_stop: EarlyStop | None, t0_ns: int | None, wire: Wire | None,
                  secrets: Iterable[str], on_start: Callable[[], None] | None
                  ) -> dict[str, Any]:
    """``replay`` into a folder claimed already."""
    for stale in (RECORDS_FILE, REQUESTS_FILE, CHUNKS_FILE, SUMMARY_FILE):
        (out_dir / stale).unlink(missing_ok=True)
    requests = trace.requests
    try:  # before t0: stopped here, nothing was sent, and the manifest must say so
        tokenizer = load_tokenizer(config.tokenizer_path) if config.tokenizer_path else None
        builder = PromptBuilder(config.protocol, tokenizer, seed=config.seed,
                                block_num_tokens=config.prefix_block_num_tokens,
                                salt=config.prompt_salt)
        bodies = _Bodies(requests, config, builder)
        prebuilt = bodies.prebuild()
        update_manifest(out_dir, replay_manifest(trace, config, builder, command))
        if on_start is not None:
            on_start()
        if wire is None:  # tests hand in harness.live.wire.MemoryWire
            wire = wire_for(config)
        try:
            await _warm_up(wire, config)
            prepare = getattr(telemetry, "prepare", None)
            if prepare is not None:  # its HTTP client built now, not at t0 beside the sends
                prepare()
            baseline = getattr(telemetry, "baseline", None)
            if baseline is not None:  # counters read now, before the first request, not racing it
                await baseline()
        except BaseException:
            await wire.aclose()
            raise
    except BaseException as exc:
        interrupted = isinstance(exc, KeyboardInterrupt | asyncio.CancelledError)
        said = ("interrupted before the first request was sent" if interrupted else
                f"failed before the first request was sent: {type(exc).__name__}: {exc}")
        update_manifest_quietly(out_dir, {
            "status": "interrupted" if interrupted else "failed",
            "error": f"{said}: nothing was measured", "num_sent": 0, "num_recorded": 0,
            "num_planned": len(requests), "num_not_sent": len(requests)})
        raise
    writer = RecordWriter(out_dir / RECORDS_FILE, fsync_interval_s=config.fsync_interval_s,
                          run_id=run_id)
    stop = asyncio.Event()
    run = _Run(config, wire, writer, bodies, tokenizer, len(requests), progress, t0_ns,
               secrets)  # t0
    if on_t0 is not None:
        on_t0(run.t0_ns)
    sync_task = asyncio.create_task(writer.sync_loop(stop))
    telemetry_task = (asyncio.create_task(telemetry.run(stop)) if telemetry is not None
                      else None)
    status = "interrupted"
    try:
        try:
            load = asyncio.create_task(run.open_loop(requests) if config.mode == "open"
                                       else run.closed_loop(requests))
            run.on_write_error = load.cancel
            watch = (asyncio.create_task(watch_early_stop(run, early_stop, telemetry, load))
                     if early_stop is not None else None)
            try:
                await load
                status = "finished"
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if ((run.write_error is None and run.stop_reason is None)
                        or (current is not None and current.cancelling())):
                    raise
                # the disk refused a row, or the early-stop check said so (finally records
                # the rest)
                status = "failed" if run.write_error is not None else "stopped"
            finally:
                if watch is not None:
                    watch.cancel()
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
        # how the run ended and how much of the trace it sent, in the summary too: a job that
        # reads only summary.json must not take an interrupted run's figures for a whole run
        ended = {"status": status, "num_planned": len(requests),
                 "num_not_sent": len(requests) - len(run.timelines),
                 **({"stopped_early": run.stop_reason} if run.stop_reason is not None else {})}
        summary, stopped = finish_run_folder(
            out_dir, run.timelines, config, run_id=run_id, error=run.write_error or writer.error,
            stopped_at_s=run.stopped_at_s, num_on_disk=writer.num_written, fields=ended)
        if stopped is not None:
            status = "failed"
        stats = builder.stats
        update_manifest_quietly(out_dir, {
            **(stopped or {}),
            "status": status,
            "t0_perf_counter_ns": run.t0_ns,
            "num_sent": run.num_sent,
            "num_recorded": len(run.timelines),
            "num_not_sent": len(requests) - len(run.timelines),
            "num_planned": len(requests),
            "bodies_prebuilt": prebuilt,
            "num_prompts_inexact": stats.num_inexact,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "client_limited": summary.get("client_limited"),
            **({"stopped_early": run.stop_reason} if run.stop_reason is not None else {}),
        })
    if stopped is not None:
        raise RunWriteError(stopped["error"])
    return summary


async def _warm_up(wire: Wire, config: ReplayConfig) -> None:
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
    overwrite: bool = False,
    on_start: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """``replay`` under ``asyncio.run``. On Ctrl-C, asyncio cancels the replay, which records
    what was in flight and writes the run folder; then KeyboardInterrupt propagates."""
    return asyncio.run(replay(trace, config, out_dir, telemetry=telemetry, progress=progress,
                              command=command, overwrite=overwrite, on_start=on_start))


