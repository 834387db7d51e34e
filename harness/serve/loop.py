"""The reference engine on the wall clock: ``EngineCore`` stepped in an asyncio loop.

    HTTP request  -> stamped received_s on entry, validated, prompt counted
                  arrival_s = received_s + frontend_latency_s -> pending (arrival order)
    step loop:    admit pending requests with arrival_s <= next_step_at_s    (as simulate does)
                  nothing to run?  sleep until the first pending arrival_s (a request still
                                   in the front end), or wait for a request;
                                   next_step_at_s = that arrival_s
                  out = core.step(next_step_at_s)       (schedule, cost, update: one step)
                  sleep until out.end_s                 (an absolute deadline: late wake-ups
                                                         never accumulate)
                  next_step_at_s = out.end_s; stream the tokens out lists

so a request's tokens leave the server at the instants ``simulate`` predicts for the same
arrivals (late by the event loop's timer granularity, under a millisecond, plus any time the
server spends behind; ``batchlab_reference_step_lateness_seconds`` measures it). There is no
multi-step shortcut: every step is scheduled and costed on its own.

The profile's ``frontend_latency_s`` is the front end a real engine has between its socket and
its scheduler (HTTP, tokenizing, the hand-over to the engine loop). ``simulate`` adds it to
each arrival; here a request likewise reaches the scheduler that long after the server
received it, and waits out the delay in ``pending`` (abortable, blocking nothing: the step loop
runs the other requests, or sleeps until the first arrival). TTFT and E2E are measured from
``received_s``, so they include the modelled front end; this machine's own HTTP time (before
``received_s``, and the token's way back) comes on top, as a real engine's would.

A client that disconnects aborts its request (``abort``, called by the HTTP handlers through
``cancel``): it leaves the pending queue or the scheduler, its KV blocks freed, between steps.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from adapters.reference.config import ReferenceConfig
from adapters.reference.engine import EngineCore, StepLog
from adapters.reference.request import Request, chain_block_hashes
from adapters.reference.scheduler import StepOutput

log = logging.getLogger(__name__)

ENGINE_NAME = "batchlab-reference"  # in /version, /v1/models and /info
MAX_STEP_LOG_ROWS = 10_000  # the server keeps only recent steps' rows (memory stays bounded)


@dataclass(frozen=True, slots=True)
class Rejection:
    """A request the engine can never run (the reason, as the scheduler would give it)."""

    message: str


class TokenStream:
    """One request's output as it is produced; the HTTP handler iterates ``tokens()``."""

    __slots__ = ("_event", "done", "error", "num_tokens", "received_s", "request")

    def __init__(self, request: Request, received_s: float) -> None:
        self.request = request
        # When the server received it; the engine's arrival is frontend_latency_s later.
        # TTFT and E2E are measured from here, as simulate measures them from the user's send.
        self.received_s = received_s
        self.num_tokens = 0  # tokens produced and released so far
        self.done = False
        self.error: str | None = None  # set when the engine failed this request
        self._event = asyncio.Event()  # binds to the running loop at its first wait

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def notify(self) -> None:
        self._event.set()

    async def tokens(self) -> AsyncIterator[int]:
        """Yield the index of each output token as soon as its step's end instant is reached."""
        num_sent = 0
        while True:
            while num_sent < self.num_tokens:
                yield num_sent
                num_sent += 1
            if self.done:
                return
            self._event.clear()  # no await since the checks above: no wake-up is lost
            await self._event.wait()


class EngineObserver:
    """What the step loop reports as it goes; the Prometheus metrics are one observer."""

    def on_step(self, num_tokens: int, num_preemptions: int) -> None: ...

    def on_first_token(self, stream: TokenStream, at_s: float) -> None: ...

    def on_tokens(self, num_tokens: int) -> None: ...

    def on_finished(self, stream: TokenStream) -> None: ...

    def on_aborted(self, stream: TokenStream) -> None: ...

    def on_lateness(self, lateness_s: float) -> None: ...


class ServedEngine:
    """``EngineCore`` driven on a clock, one step at a time, with requests arriving at any time.

    ``submit`` queues a request stamped with its arrival at the engine (its receipt plus the
    profile's ``frontend_latency_s``); ``step`` runs the next step (or returns None when there
    is nothing to run); ``deliver`` releases the step's tokens once its
    end instant is reached; ``run`` is the asyncio loop that ties them to the wall clock. The
    synchronous trio is what a test drives to check the loop against ``simulate``.
    """

    def __init__(self, config: ReferenceConfig, *,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.config = config
        self.core = EngineCore(config)
        self.frontend_s = config.params.frontend_latency_s  # receipt -> arrival at the engine
        self._clock = clock
        self._epoch = clock()
        self._pending: deque[TokenStream] = deque()  # arrived, not yet given to the scheduler
        self._streams: dict[str, TokenStream] = {}  # every request the scheduler holds
        self._wake = asyncio.Event()
        self._num_submitted = 0
        self._last_received_s = -math.inf
        self.next_step_at_s = 0.0
        self.num_steps = 0
        self.num_admitted = 0  # requests given to the scheduler
        self.failure: str | None = None  # the step loop crashed: the server is unhealthy
        self.observer: EngineObserver | None = None

    # -- time

    def now_s(self) -> float:
        """Seconds since the engine started (the clock every engine instant is on)."""
        return self._clock() - self._epoch

    def published_config(self) -> dict[str, Any]:
        """The configuration /version and /info publish: the reference's settings and the
        front-end delay of its cost model (not a knob, but part of every TTFT it serves)."""
        return {**self.config.as_dict(), "frontend_latency_s": self.frontend_s}

    # -- requests in

    def rejection(self, num_prompt_tokens: int, max_output_tokens: int) -> str:
        """Why a request of these sizes can never run ('' when it can): the scheduler's rule,
        the one ``simulate`` rejects by, asked before the request is accepted (HTTP 400)."""
        return self.core.scheduler.rejection(num_prompt_tokens, max_output_tokens)

    def submit(self, num_prompt_tokens: int, max_output_tokens: int, *, priority: int = 0,
               request_id: str | None = None, received_s: float | None = None,
               prompt_keys: Sequence[int] = ()) -> TokenStream | Rejection:
        """Queue a request the server received now (or at ``received_s``: the handler's stamp,
        or a trace's arrival in tests). It reaches the scheduler ``frontend_s`` later, as in
        ``simulate``. ``prompt_keys`` (token identities) let prefix caching find shared prompt
        blocks."""
        reason = self.rejection(num_prompt_tokens, max_output_tokens)
        if reason:
            return Rejection(reason)
        index = self._num_submitted
        self._num_submitted += 1
        # Pending stays in arrival order: a handler that read its body late (its receipt was
        # stamped before the read) counts as received with the request submitted before it.
        received_s = max(self.now_s() if received_s is None else received_s,
                         self._last_received_s)
        self._last_received_s = received_s
        arrival_s = received_s + self.frontend_s
        hashes = (chain_block_hashes(prompt_keys[:num_prompt_tokens], self.config.block_size)
                  if prompt_keys and self.config.prefix_caching else ())
        request = Request(request_id or f"req-{index}", num_prompt_tokens, max_output_tokens,
                          arrival_s=arrival_s, priority=priority, index=index,
                          block_hashes=hashes)
        stream = TokenStream(request, received_s)
        if self.failure is not None:  # the step loop is gone: fail now rather than hang
            stream.error = f"engine failure: {self.failure}"
            stream.done = True
            return stream
        self._pending.append(stream)
        self._wake.set()
        return stream

    def abort(self, stream: TokenStream) -> bool:
        """End ``stream``'s request now, its client gone (vLLM's abort on disconnect): out of
        the pending queue, or out of the scheduler with its KV blocks freed. False when there
        was nothing to abort: it had finished (or finishes in the step now running, whose
        ``deliver`` ends it), or failed."""
        if stream.done:
            return False
        request_id = stream.request_id
        if stream in self._pending:
            self._pending.remove(stream)
        elif (self._streams.get(request_id) is not stream
              or self.core.scheduler.abort(request_id) is None):
            return False
        else:
            del self._streams[request_id]
        stream.error = "aborted"
        stream.done = True
        stream.notify()
        if self.observer is not None:
            self.observer.on_aborted(stream)
        return True

    @property
    def num_pending(self) -> int:
        """Requests not yet given to the scheduler, those still in the front end included."""
        return len(self._pending)

    @property
    def num_waiting(self) -> int:
        """Requests queued: in the scheduler's waiting queue, or arrived at the engine since the
        last step (not those still in the front end, which simulate does not count either)."""
        now_s = self.now_s()
        num_arrived = 0
        for stream in self._pending:  # in arrival order
            if stream.request.arrival_s > now_s:
                break
            num_arrived += 1
        return len(self.core.scheduler.waiting) + num_arrived

    @property
    def num_running(self) -> int:
        return len(self.core.scheduler.running)

    # -- one step

    def _admit_due(self) -> None:
        """Give the scheduler every request that arrived by the coming step's start."""
        pending = self._pending
        while pending and pending[0].request.arrival_s <= self.next_step_at_s:
            stream = pending.popleft()
            if self.core.add_request(stream.request):
                self._streams[stream.request_id] = stream
                self.num_admitted += 1
            else:  # rejection() and the scheduler disagree: fail the request, keep serving
                stream.error = stream.request.error_message or "rejected by the scheduler"
                stream.done = True
                stream.notify()

    def step(self, *, start_by_s: float = math.inf) -> StepOutput | None:
        """Run the next step, starting at ``next_step_at_s``; None when there is nothing to run.

        Idle, the next step starts at the first pending request's arrival (as ``simulate``
        jumps its clock to the next arrival), unless that is after ``start_by_s``: the wall-clock
        loop passes its now, so that a request still in the front end reaches the scheduler at
        its arrival, not before (an abort in the meantime then never touches the engine)."""
        self._admit_due()
        if not self.core.has_unfinished():
            if not self._pending or self._pending[0].request.arrival_s > start_by_s:
                return None
            self.next_step_at_s = max(self.next_step_at_s, self._pending[0].request.arrival_s)
            self._admit_due()
            if not self.core.has_unfinished():
                return None
        num_preemptions = self.core.scheduler.num_preemptions
        out = self.core.step(self.next_step_at_s)
        self.next_step_at_s = out.end_s
        self.num_steps += 1
        if self.observer is not None:
            cols = self.core.steps.columns
            num_tokens = int(cols["num_prefill_tokens"][-1]) + int(cols["num_decode_tokens"][-1])
            self.observer.on_step(num_tokens,
                                  self.core.scheduler.num_preemptions - num_preemptions)
        if len(self.core.steps) >= MAX_STEP_LOG_ROWS:
            # A server runs for days: keep the step log (which simulate returns) bounded.
            self.core.steps = StepLog(self.core.num_kv_blocks_total)
        return out

    def deliver(self, out: StepOutput) -> None:
        """Release the tokens and finishes of a step whose end instant has been reached."""
        streams = self._streams
        woken: list[TokenStream] = []
        for request_id in out.token_request_ids:
            stream = streams.get(request_id)
            if stream is None:  # aborted after its step ran: nobody to stream to
                continue
            stream.num_tokens += 1
            woken.append(stream)
            if stream.num_tokens == 1 and self.observer is not None:
                self.observer.on_first_token(stream, out.end_s)
        if self.observer is not None:
            self.observer.on_tokens(len(out.token_request_ids))
        for request_id in out.finished_request_ids:
            stream = streams.pop(request_id, None)
            if stream is None:
                continue
            stream.done = True
            woken.append(stream)
            if self.observer is not None:
                self.observer.on_finished(stream)
        for stream in woken:
            stream.notify()

    # -- the wall-clock loop

    async def run(self) -> None:
        """Step forever on the wall clock; returns only when cancelled."""
        try:
            while True:
                out = self.step(start_by_s=self.now_s())
                if out is None:
                    await self._idle()
                    continue
                delay = out.end_s - self.now_s()
                await asyncio.sleep(delay if delay > 0 else 0)
                if self.observer is not None:
                    self.observer.on_lateness(self.now_s() - out.end_s)
                self.deliver(out)
        except asyncio.CancelledError:
            self.fail_all("the server is shutting down")
            raise
        except Exception as exc:
            log.exception("the reference engine's step loop failed")
            self.failure = f"{type(exc).__name__}: {exc}"
            self.fail_all(f"engine failure: {self.failure}")

    async def _idle(self) -> None:
        """Nothing to run now: sleep until the first pending request reaches the engine (it is
        in the front end), or wait for a request. A later request cannot arrive before the
        first pending one (pending is in arrival order), so the sleep needs no wake-up."""
        if self._pending:
            delay = self._pending[0].request.arrival_s - self.now_s()
            await asyncio.sleep(delay if delay > 0 else 0)
            return
        self._wake.clear()
        await self._wake.wait()

    def fail_all(self, message: str) -> None:
        """End every request in flight with an error (shutdown, or a crashed step loop)."""
        for stream in [*self._pending, *self._streams.values()]:
            stream.error = stream.error or message
            stream.done = True
            stream.notify()
        self._pending.clear()
        self._streams.clear()
