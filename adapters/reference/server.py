"""The reference engine served over HTTP: vLLM's OpenAI routes, TGI's routes, Prometheus metrics.

The same ``EngineCore`` (scheduler + cost-model executor) that ``simulate`` drives on a virtual
clock runs here on the wall clock, one step at a time, in an asyncio loop::

    HTTP request  -> validated, prompt counted, stamped arrival_s -> pending (arrival order)
    step loop:    admit pending requests with arrival_s <= next_step_at_s    (as simulate does)
                  nothing to run?  wait for a request; next_step_at_s = its arrival_s
                  out = core.step(next_step_at_s)       (schedule, cost, update: one step)
                  sleep until out.end_s                 (an absolute deadline: late wake-ups
                                                         never accumulate)
                  next_step_at_s = out.end_s; stream the tokens out lists

so a request's tokens leave the server at the instants ``simulate`` predicts for the same
arrivals (late by the event loop's timer granularity, under a millisecond, plus any time the
server spends behind; ``batchlab_reference_step_lateness_seconds`` measures it). There is no
multi-step shortcut: every step is scheduled and costed on its own.

What a client sees (docs/reference-server.md has the details):

- Output: the reference never samples EOS, so every request produces exactly its
  ``max_tokens`` / ``max_new_tokens`` tokens (``ignore_eos`` and ``min_tokens`` are accepted and
  change nothing). Token ``i`` is the word ``OUTPUT_WORDS[i % len(OUTPUT_WORDS)]``, one token in
  common BPE vocabularies, so clients can count tokens by text.
- Prompt length: a list of token ids counts exactly; text is counted by ``PromptCounter``
  (a local tokenizer when given, else one token per word and per punctuation mark).
- A request the engine can never run (too long for ``max_model_len`` or for the whole KV
  cache) is refused before streaming: HTTP 400 with vLLM's error body on the OpenAI routes,
  TGI's validation error on TGI's (422 on ``/generate``; HTTP 200 and an error event on
  ``/generate_stream``, as TGI does).
- A client that disconnects does not abort its request (the scheduler has no abort): the
  request runs to its length and its tokens are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from adapters.reference.config import ReferenceConfig
from adapters.reference.engine import EngineCore, StepLog
from adapters.reference.request import Request
from adapters.reference.scheduler import StepOutput

log = logging.getLogger(__name__)

# Token i of every response; each is one token (with its leading space) in GPT-2, Llama 2/3,
# Mistral and Qwen BPE, so a client that re-tokenizes the text counts the right number.
OUTPUT_WORDS = (" the", " of", " and", " to", " in", " is", " that", " for", " it", " as")
OUTPUT_TOKEN_ID_BASE = 1000  # token i has id OUTPUT_TOKEN_ID_BASE + i % len(OUTPUT_WORDS)
DEFAULT_COMPLETION_MAX_TOKENS = 16  # vLLM's default for /v1/completions
MAX_STEP_LOG_ROWS = 10_000  # the server keeps only recent steps' rows (memory stays bounded)
ENGINE_NAME = "batchlab-reference"

# vLLM's bucket edges (vllm/v1/metrics/loggers.py).
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
LATENESS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0)


def output_token_text(index: int) -> str:
    return OUTPUT_WORDS[index % len(OUTPUT_WORDS)]


def output_token_id(index: int) -> int:
    return OUTPUT_TOKEN_ID_BASE + index % len(OUTPUT_WORDS)


def output_text(num_tokens: int) -> str:
    return "".join(output_token_text(i) for i in range(num_tokens))


# ---------------------------------------------------------------- prompt length


class PromptCounter:
    """How many tokens a text prompt is: a local tokenizer's count, else words + punctuation.

    Without a tokenizer, a run of letters/digits is one token and so is each other non-space
    character ("Hello, world!" is 4). That is exact for the replay client's approximate-text
    prompts (one common word per token) and close for English prose. Token-id prompts never
    come here: they count exactly.
    """

    _PIECES = re.compile(r"\w+|[^\w\s]")

    def __init__(self, tokenizer_path: str | None = None) -> None:
        self.tokenizer_path = tokenizer_path
        self._tokenizer = None
        if tokenizer_path is not None:
            from harness.prompts import load_tokenizer

            self._tokenizer = load_tokenizer(tokenizer_path)

    @property
    def rule(self) -> str:
        if self.tokenizer_path is not None:
            return f"tokenizer {self.tokenizer_path} (special tokens included)"
        return "words and punctuation marks, one token each"

    def count(self, text: str) -> int:
        if self._tokenizer is not None:
            return len(self._tokenizer.encode(text, add_special_tokens=True))
        return sum(1 for _ in self._PIECES.finditer(text))


# ---------------------------------------------------------------- the engine on the wall clock


@dataclass(frozen=True, slots=True)
class Rejection:
    """A request the engine can never run (the reason, as the scheduler would give it)."""

    message: str


class TokenStream:
    """One request's output as it is produced; the HTTP handler iterates ``tokens()``."""

    __slots__ = ("_event", "done", "error", "num_tokens", "request")

    def __init__(self, request: Request) -> None:
        self.request = request
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


class ServedEngine:
    """``EngineCore`` driven on a clock, one step at a time, with requests arriving at any time.

    ``submit`` queues a request stamped with its arrival; ``step`` runs the next step (or
    returns None when there is nothing to run); ``deliver`` releases the step's tokens once its
    end instant is reached; ``run`` is the asyncio loop that ties them to the wall clock. The
    synchronous trio is what a test drives to check the loop against ``simulate``.
    """

    def __init__(self, config: ReferenceConfig, *,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.config = config
        self.core = EngineCore(config)
        self._clock = clock
        self._epoch = clock()
        self._pending: deque[TokenStream] = deque()  # arrived, not yet given to the scheduler
        self._streams: dict[str, TokenStream] = {}  # every request the scheduler holds
        self._wake = asyncio.Event()
        self._num_submitted = 0
        self._last_arrival_s = -math.inf
        self.next_step_at_s = 0.0
        self.num_steps = 0
        self.failure: str | None = None  # the step loop crashed: the server is unhealthy
        self.observer: EngineObserver | None = None

    # -- time

    def now_s(self) -> float:
        """Seconds since the engine started (the clock every engine instant is on)."""
        return self._clock() - self._epoch

    # -- requests in

    def rejection(self, num_prompt_tokens: int, max_output_tokens: int) -> str:
        """Why a request of these sizes can never run ('' when it can): the scheduler's rule."""
        if num_prompt_tokens < 1 or max_output_tokens < 1:
            return "a request needs at least one prompt token and one output token"
        max_len = self.config.resolved_max_model_len
        if num_prompt_tokens + max_output_tokens > max_len:
            return (f"prompt ({num_prompt_tokens}) + output ({max_output_tokens}) tokens "
                    f"exceed max_model_len ({max_len})")
        blocks = self.core.blocks
        need = blocks.blocks_for(num_prompt_tokens + max_output_tokens - 1)
        if need > blocks.num_gpu_blocks:
            return (f"needs {need} KV blocks even alone, but the KV cache has only "
                    f"{blocks.num_gpu_blocks}")
        return ""

    def submit(self, num_prompt_tokens: int, max_output_tokens: int, *, priority: int = 0,
               request_id: str | None = None,
               arrival_s: float | None = None) -> TokenStream | Rejection:
        """Queue a request that arrives now (or at ``arrival_s``, for tests)."""
        reason = self.rejection(num_prompt_tokens, max_output_tokens)
        if reason:
            return Rejection(reason)
        index = self._num_submitted
        self._num_submitted += 1
        # Pending stays in arrival order: a handler that read its body late (its arrival was
        # stamped before the read) counts as arriving with the request submitted before it.
        arrival_s = max(self.now_s() if arrival_s is None else arrival_s, self._last_arrival_s)
        self._last_arrival_s = arrival_s
        request = Request(request_id or f"req-{index}", num_prompt_tokens, max_output_tokens,
                          arrival_s=arrival_s, priority=priority, index=index)
        stream = TokenStream(request)
        if self.failure is not None:  # the step loop is gone: fail now rather than hang
            stream.error = f"engine failure: {self.failure}"
            stream.done = True
            return stream
        self._pending.append(stream)
        self._wake.set()
        return stream

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    @property
    def num_waiting(self) -> int:
        """Requests queued: in the scheduler's waiting queue, or arrived since the last step."""
        return len(self.core.scheduler.waiting) + len(self._pending)

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
            else:  # rejection() and the scheduler disagree: fail the request, keep serving
                stream.error = stream.request.error_message or "rejected by the scheduler"
                stream.done = True
                stream.notify()

    def step(self) -> StepOutput | None:
        """Run the next step, starting at ``next_step_at_s``; None when there is nothing to run.

        Idle, the next step starts at the first pending request's arrival (as ``simulate``
        jumps its clock to the next arrival)."""
        self._admit_due()
        if not self.core.has_unfinished():
            if not self._pending:
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
            stream = streams[request_id]
            stream.num_tokens += 1
            woken.append(stream)
            if stream.num_tokens == 1 and self.observer is not None:
                self.observer.on_first_token(stream.request, out.end_s)
        if self.observer is not None:
            self.observer.on_tokens(len(out.token_request_ids))
        for request_id in out.finished_request_ids:
            stream = streams.pop(request_id)
            stream.done = True
            woken.append(stream)
            if self.observer is not None:
                self.observer.on_finished(stream.request, stream.num_tokens)
        for stream in woken:
            stream.notify()

    # -- the wall-clock loop

    async def run(self) -> None:
        """Step forever on the wall clock; returns only when cancelled."""
        try:
            while True:
                out = self.step()
                if out is None:
                    self._wake.clear()
                    await self._wake.wait()
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

    def fail_all(self, message: str) -> None:
        """End every request in flight with an error (shutdown, or a crashed step loop)."""
        for stream in [*self._pending, *self._streams.values()]:
            stream.error = stream.error or message
            stream.done = True
            stream.notify()
        self._pending.clear()
        self._streams.clear()


# ---------------------------------------------------------------- metrics


class EngineObserver:
    """What the step loop reports as it goes; the Prometheus metrics are one observer."""

    def on_step(self, num_tokens: int, num_preemptions: int) -> None: ...

    def on_first_token(self, request: Request, at_s: float) -> None: ...

    def on_tokens(self, num_tokens: int) -> None: ...

    def on_finished(self, request: Request, num_tokens: int) -> None: ...

    def on_lateness(self, lateness_s: float) -> None: ...


class PrometheusMetrics(EngineObserver):
    """vLLM's metric names (labels ``model_name`` and ``engine="0"``) plus TGI's queue and batch
    gauges, in a private registry. Gauges read the engine when scraped."""

    def __init__(self, engine: ServedEngine, model_name: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        names = ("model_name", "engine")
        labels = {"model_name": model_name, "engine": "0"}
        blocks = engine.core.blocks
        block_size = engine.config.block_size
        num_blocks = engine.core.num_kv_blocks_total

        def gauge(name: str, doc: str, read: Callable[[], float], labelled: bool = True) -> None:
            if labelled:
                Gauge(name, doc, names, registry=r).labels(**labels).set_function(read)
            else:
                Gauge(name, doc, registry=r).set_function(read)

        gauge("vllm:num_requests_running", "Requests in the running batch.",
              lambda: engine.num_running)
        gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.",
              lambda: engine.num_waiting)
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage: 1 means 100 percent.",
              lambda: blocks.num_used_blocks / num_blocks)
        gauge("tgi_queue_size", "Requests waiting to be scheduled (TGI's name).",
              lambda: engine.num_waiting, labelled=False)
        gauge("tgi_batch_current_size", "Requests in the running batch (TGI's name).",
              lambda: engine.num_running, labelled=False)
        gauge("tgi_batch_current_max_tokens", "KV-cache tokens held by the batch (TGI's name).",
              lambda: blocks.num_used_blocks * block_size, labelled=False)
        gauge("tgi_batch_max_total_tokens", "KV-cache capacity in tokens (TGI's name).",
              lambda: num_blocks * block_size, labelled=False)

        self.preemptions = Counter("vllm:num_preemptions", "Cumulative preemptions.", names,
                                   registry=r).labels(**labels)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefilled prompt tokens.", names,
                                     registry=r).labels(**labels)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generated tokens.", names,
                                         registry=r).labels(**labels)
        self.success = Counter("vllm:request_success", "Finished requests.",
                               (*names, "finished_reason"), registry=r)
        self.success_labels = labels
        self.iteration_tokens = Histogram(
            "vllm:iteration_tokens_total", "Tokens scheduled per engine step.", names,
            buckets=ITERATION_TOKEN_BUCKETS, registry=r).labels(**labels)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Arrival to first token, engine clock.", names,
            buckets=TTFT_BUCKETS, registry=r).labels(**labels)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "Arrival to last token, engine clock.", names,
            buckets=REQUEST_LATENCY_BUCKETS, registry=r).labels(**labels)
        self.queue_time = Histogram(
            "vllm:request_queue_time_seconds", "Arrival to first scheduled step.", names,
            buckets=REQUEST_LATENCY_BUCKETS, registry=r).labels(**labels)
        self.lateness = Histogram(
            "batchlab_reference_step_lateness_seconds",
            "How long after its predicted end instant a step's tokens were released.",
            buckets=LATENESS_BUCKETS, registry=r)

    def on_step(self, num_tokens: int, num_preemptions: int) -> None:
        self.iteration_tokens.observe(num_tokens)
        if num_preemptions:
            self.preemptions.inc(num_preemptions)

    def on_first_token(self, request: Request, at_s: float) -> None:
        self.prompt_tokens.inc(request.num_prompt_tokens)
        self.ttft.observe(max(0.0, at_s - request.arrival_s))
        if request.first_scheduled_s is not None:
            self.queue_time.observe(max(0.0, request.first_scheduled_s - request.arrival_s))

    def on_tokens(self, num_tokens: int) -> None:
        self.generation_tokens.inc(num_tokens)

    def on_finished(self, request: Request, num_tokens: int) -> None:
        self.success.labels(**self.success_labels, finished_reason="length").inc()
        if request.finished_s is not None:
            self.e2e.observe(max(0.0, request.finished_s - request.arrival_s))

    def on_lateness(self, lateness_s: float) -> None:
        self.lateness.observe(max(0.0, lateness_s))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


# ---------------------------------------------------------------- request parsing


@dataclass(frozen=True, slots=True)
class ApiError:
    """A request refused before generation; each protocol renders it its own way."""

    status: int
    message: str
    type: str = "BadRequestError"
    param: str | None = None


@dataclass(frozen=True, slots=True)
class OpenAiRequest:
    """A validated ``/v1/completions`` or ``/v1/chat/completions`` request."""

    num_prompt_tokens: int
    max_tokens: int
    priority: int
    stream: bool
    include_usage: bool
    continuous_usage: bool


@dataclass(frozen=True, slots=True)
class TgiRequest:
    """A validated ``/generate`` or ``/generate_stream`` request."""

    inputs: str
    num_prompt_tokens: int
    max_new_tokens: int
    details: bool
    return_full_text: bool
    seed: int | None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_field(obj: Mapping[str, Any], name: str, minimum: int, status: int = 400,
               label: str | None = None) -> int | ApiError | None:
    value = obj.get(name)
    if value is None:
        return None
    if not _is_int(value) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        return ApiError(status, f"{label or name} must be {what}, got {value!r}", param=name)
    return int(value)


def _bool_field(obj: Mapping[str, Any], name: str, default: bool,
                status: int = 400) -> bool | ApiError:
    value = obj.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        return ApiError(status, f"{name} must be true or false, got {value!r}", param=name)
    return value


class _Protocols:
    """Request validation shared by the routes: model name, prompt length, limits."""

    def __init__(self, engine: ServedEngine, model_name: str, counter: PromptCounter) -> None:
        self.engine = engine
        self.model_name = model_name
        self.counter = counter
        self.max_model_len = engine.config.resolved_max_model_len

    # -- OpenAI (vLLM's dialect)

    def count_prompt(self, prompt: Any) -> int | ApiError:
        """``prompt``: text, or token ids (counted exactly); a list of one of either."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            n = self.counter.count(prompt)
        elif isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt) \
                and min(prompt) >= 0:  # (type(t) is int: bool is not a token id)
            n = len(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str | list)
                                                         for p in prompt):
            return ApiError(400, "batched prompts are not supported: send one prompt per "
                            "request", param="prompt")
        else:
            return ApiError(400, "prompt must be a non-empty string or a non-empty list of "
                            "token ids (integers >= 0)", param="prompt")
        if n < 1:
            return ApiError(400, "prompt is empty", param="prompt")
        return n

    def count_messages(self, messages: Any) -> int | ApiError:
        """Chat messages: their text contents counted; no chat template is modelled."""
        if not isinstance(messages, list) or not messages:
            return ApiError(400, "messages must be a non-empty list", param="messages")
        n = 0
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                return ApiError(400, f"messages[{i}] must be an object", param="messages")
            content = message.get("content")
            if isinstance(content, str):
                n += self.counter.count(content)
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        n += self.counter.count(part["text"])
            elif content is not None:
                return ApiError(400, f"messages[{i}].content must be a string or a list of "
                                "parts", param="messages")
        if n < 1:
            return ApiError(400, "messages carry no text", param="messages")
        return n

    def parse_openai(self, body: Mapping[str, Any], *, chat: bool) -> OpenAiRequest | ApiError:
        model = body.get("model")
        if model is not None and model != self.model_name:
            return ApiError(404, f"The model `{model}` does not exist.", "NotFoundError",
                            "model")
        num_prompt = (self.count_messages(body.get("messages")) if chat
                      else self.count_prompt(body.get("prompt")))
        if isinstance(num_prompt, ApiError):
            return num_prompt
        n = body.get("n")
        if n is not None and n != 1:
            return ApiError(400, "n: the reference engine returns one choice (n=1)", param="n")
        name = "max_completion_tokens" if chat and "max_completion_tokens" in body \
            else "max_tokens"
        max_tokens = _int_field(body, name, 1)
        min_tokens = _int_field(body, "min_tokens", 0)
        ignore_eos = _bool_field(body, "ignore_eos", False)
        stream = _bool_field(body, "stream", False)
        for value in (max_tokens, min_tokens, ignore_eos, stream):
            if isinstance(value, ApiError):
                return value
        assert not isinstance(max_tokens, ApiError) and not isinstance(min_tokens, ApiError)
        if max_tokens is None:  # vLLM: 16 for completions, up to max_model_len for chat
            max_tokens = (max(1, self.max_model_len - num_prompt) if chat
                          else DEFAULT_COMPLETION_MAX_TOKENS)
        if min_tokens is not None and min_tokens > max_tokens:
            return ApiError(400, f"min_tokens ({min_tokens}) must be less than or equal to "
                            f"max_tokens ({max_tokens})", param="min_tokens")
        options = body.get("stream_options")
        if options is not None:
            if stream is not True:
                return ApiError(400, "Stream options can only be defined when `stream=True`.",
                                param="stream_options")
            if not isinstance(options, dict):
                return ApiError(400, "stream_options must be an object", param="stream_options")
        include_usage = bool(options.get("include_usage", True)) if options else False
        continuous = include_usage and bool((options or {}).get("continuous_usage_stats", False))
        priority = body.get("priority", 0)
        if not _is_int(priority):
            return ApiError(400, f"priority must be an integer, got {priority!r}",
                            param="priority")
        if priority != 0 and self.engine.config.policy != "priority":
            return ApiError(400, f"Got priority {priority} but Priority scheduling is not "
                            "enabled (start the server with --policy priority).",
                            param="priority")
        if num_prompt + max_tokens > self.max_model_len:
            return ApiError(400, f"This model's maximum context length is {self.max_model_len} "
                            f"tokens. However, you requested {num_prompt + max_tokens} tokens "
                            f"({num_prompt} in the {'messages' if chat else 'prompt'}, "
                            f"{max_tokens} in the completion). Please reduce the length of the "
                            f"{'messages' if chat else 'prompt'} or completion.")
        reason = self.engine.rejection(num_prompt, max_tokens)
        if reason:
            return ApiError(400, f"the request can never run: {reason}")
        return OpenAiRequest(num_prompt, max_tokens, int(priority), bool(stream), include_usage,
                             continuous)

    # -- TGI

    def parse_tgi(self, body: Mapping[str, Any], *, stream: bool) -> TgiRequest | ApiError:
        def invalid(message: str) -> ApiError:
            return ApiError(422, message, "validation")

        inputs = body.get("inputs")
        if not isinstance(inputs, str) or not inputs:
            return invalid("`inputs` cannot be empty")
        params = body.get("parameters") or {}
        if not isinstance(params, dict):
            return invalid("`parameters` must be an object")
        max_new = _int_field(params, "max_new_tokens", 1, 422, "`max_new_tokens`")
        truncate = _int_field(params, "truncate", 1, 422, "`truncate`")
        seed = _int_field(params, "seed", 0, 422, "`seed`")
        details = _bool_field(params, "details", False, 422)
        full_text = _bool_field(params, "return_full_text", False, 422)
        for value in (max_new, truncate, seed, details, full_text):
            if isinstance(value, ApiError):
                return ApiError(422, value.message, "validation")
        assert not isinstance(max_new, ApiError) and not isinstance(truncate, ApiError)
        assert not isinstance(seed, ApiError)
        temperature, top_p = params.get("temperature"), params.get("top_p")
        if temperature is not None and (not isinstance(temperature, int | float)
                                        or temperature <= 0):
            return invalid("`temperature` must be strictly positive")
        if top_p is not None and (not isinstance(top_p, int | float) or not 0 < top_p < 1):
            return invalid("`top_p` must be > 0.0 and < 1.0")
        best_of = params.get("best_of")
        if best_of is not None and best_of != 1:
            return invalid("`best_of` != 1 is not allowed for this endpoint" if stream
                           else "`best_of` != 1 is not supported by the reference engine")
        if stream and params.get("decoder_input_details"):
            return invalid("`decoder_input_details` == true is not supported when streaming "
                           "tokens")
        num_prompt = self.counter.count(inputs)
        if truncate is not None:
            num_prompt = min(num_prompt, truncate)
        if num_prompt < 1:
            return invalid("`inputs` has no tokens")
        if max_new is None:  # TGI: up to max_total_tokens
            max_new = max(1, self.max_model_len - num_prompt)
        if num_prompt + max_new > self.max_model_len:
            return invalid(f"Input validation error: `inputs` tokens + `max_new_tokens` must be "
                           f"<= {self.max_model_len}. Given: {num_prompt} `inputs` tokens and "
                           f"{max_new} `max_new_tokens`")
        reason = self.engine.rejection(num_prompt, max_new)
        if reason:
            return invalid(f"Input validation error: the request can never run: {reason}")
        return TgiRequest(inputs, num_prompt, max_new, bool(details), bool(full_text), seed)


# ---------------------------------------------------------------- HTTP


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _openai_error(err: ApiError) -> JSONResponse:
    """vLLM's current error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return JSONResponse({"error": {"message": err.message, "type": err.type, "param": err.param,
                                   "code": err.status}}, status_code=err.status)


def _tgi_error(err: ApiError) -> JSONResponse:
    """TGI's error body: ``{"error": "...", "error_type": "validation"}``."""
    error_type = "validation" if err.status in (400, 422) else "generation"
    return JSONResponse({"error": err.message, "error_type": error_type},
                        status_code=err.status)


async def _read_json(request: StarletteRequest) -> dict[str, Any] | ApiError:
    body = await request.body()
    try:
        obj = json.loads(body)
    except ValueError as exc:
        return ApiError(400, f"the request body is not valid JSON: {exc}")
    if not isinstance(obj, dict):
        return ApiError(400, "the request body must be a JSON object")
    return obj


def batchlab_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("batchlab")
    except metadata.PackageNotFoundError:
        return "unknown"


class ReferenceServer:
    """The HTTP front of a ``ServedEngine``: ``app`` is an ASGI application."""

    def __init__(self, config: ReferenceConfig, *, served_model_name: str | None = None,
                 tokenizer_path: str | None = None,
                 on_ready: Callable[[], None] | None = None) -> None:
        self.config = config
        self.engine = ServedEngine(config)
        self.model_name = served_model_name or config.model
        self.counter = PromptCounter(tokenizer_path)
        self.protocols = _Protocols(self.engine, self.model_name, self.counter)
        self.metrics = PrometheusMetrics(self.engine, self.model_name)
        self.engine.observer = self.metrics
        self.compute_type = f"{config.tp}-{config.gpu_spec.name}"
        self._on_ready = on_ready
        self._created = int(time.time())
        self.app = Starlette(
            routes=[
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/generate", self.tgi_generate, methods=["POST"]),
                Route("/generate_stream", self.tgi_generate_stream, methods=["POST"]),
                Route("/", self.tgi_compat, methods=["POST"]),
                Route("/health", self.health, methods=["GET"]),
                Route("/ping", self.health, methods=["GET", "POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/version", self.version, methods=["GET"]),
                Route("/info", self.info, methods=["GET"]),
                Route("/metrics", self.prometheus, methods=["GET"]),
            ],
            lifespan=self._lifespan,
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(self.engine.run(), name="reference-engine-steps")
        if self._on_ready is not None:
            self._on_ready()
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- OpenAI routes

    async def completions(self, request: StarletteRequest) -> Response:
        return await self._openai(request, chat=False)

    async def chat_completions(self, request: StarletteRequest) -> Response:
        return await self._openai(request, chat=True)

    async def _openai(self, request: StarletteRequest, *, chat: bool) -> Response:
        arrival_s = self.engine.now_s()  # before reading the body, as close to the send as we get
        body = await _read_json(request)
        if isinstance(body, ApiError):
            return _openai_error(body)
        req = self.protocols.parse_openai(body, chat=chat)
        if isinstance(req, ApiError):
            return _openai_error(req)
        response_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        stream = self.engine.submit(req.num_prompt_tokens, req.max_tokens,
                                    priority=req.priority, request_id=response_id,
                                    arrival_s=arrival_s)
        if isinstance(stream, Rejection):
            return _openai_error(ApiError(400, f"the request can never run: {stream.message}"))
        if req.stream:
            return StreamingResponse(self._openai_events(stream, req, chat),
                                     media_type="text/event-stream")
        async for _ in stream.tokens():
            pass
        if stream.error is not None:
            return _openai_error(ApiError(500, stream.error, "InternalServerError"))
        n = stream.num_tokens
        text = output_text(n)
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
             "finish_reason": "length", "stop_reason": None} if chat else
            {"index": 0, "text": text, "logprobs": None, "finish_reason": "length",
             "stop_reason": None, "prompt_logprobs": None})
        return JSONResponse({
            "id": response_id, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": self.model_name, "choices": [choice],
            "usage": _usage(req.num_prompt_tokens, n),
        })

    async def _openai_events(self, stream: TokenStream, req: OpenAiRequest,
                             chat: bool) -> AsyncIterator[bytes]:
        head = {"id": stream.request_id,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": self.model_name}

        def event(choice: dict[str, Any], num_tokens: int) -> bytes:
            chunk: dict[str, Any] = {**head, "choices": [choice]}
            if req.continuous_usage:
                chunk["usage"] = _usage(req.num_prompt_tokens, num_tokens)
            return b"data: " + _dumps(chunk) + b"\n\n"

        if chat:  # vLLM's first chat chunk carries the role and no token
            yield event({"index": 0, "delta": {"role": "assistant", "content": ""},
                         "logprobs": None, "finish_reason": None}, 0)
        last = stream.request.max_output_tokens
        async for i in stream.tokens():
            finish = "length" if i + 1 == last else None
            if chat:
                choice = {"index": 0, "delta": {"content": output_token_text(i)},
                          "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": output_token_text(i), "logprobs": None,
                          "finish_reason": finish, "stop_reason": None}
            yield event(choice, i + 1)
        if stream.error is not None:  # vLLM: an error event, then [DONE]
            yield b"data: " + _dumps({"error": {"message": stream.error,
                                                "type": "InternalServerError", "param": None,
                                                "code": 500}}) + b"\n\n"
        elif req.include_usage:
            yield b"data: " + _dumps({**head, "choices": [],
                                      "usage": _usage(req.num_prompt_tokens,
                                                      stream.num_tokens)}) + b"\n\n"
        yield b"data: [DONE]\n\n"

    # -- TGI routes

    async def tgi_generate(self, request: StarletteRequest) -> Response:
        return await self._tgi(request, stream=False, as_list=False)

    async def tgi_generate_stream(self, request: StarletteRequest) -> Response:
        return await self._tgi(request, stream=True, as_list=False)

    async def tgi_compat(self, request: StarletteRequest) -> Response:
        """``POST /``: TGI's compat route (what ``text_generation.Client`` calls); a list."""
        started_s = self.engine.now_s()
        body = await _read_json(request)
        if isinstance(body, ApiError):
            return _tgi_error(body)
        stream = body.get("stream") is True
        return await self._tgi(request, stream=stream, as_list=not stream, body=body,
                               started_s=started_s)

    async def _tgi(self, request: StarletteRequest, *, stream: bool, as_list: bool,
                   body: dict[str, Any] | ApiError | None = None,
                   started_s: float | None = None) -> Response:
        if started_s is None:
            started_s = self.engine.now_s()
        if body is None:
            body = await _read_json(request)
        if isinstance(body, ApiError):
            return _tgi_error(body)
        inputs = body.get("inputs")
        headers = {"x-compute-type": self.compute_type,
                   "x-compute-characters": str(len(inputs) if isinstance(inputs, str) else 0)}
        req = self.protocols.parse_tgi(body, stream=stream)
        if isinstance(req, ApiError):
            if stream:  # TGI sends headers first: validation errors arrive as an event
                return StreamingResponse(
                    _one_event({"error": req.message, "error_type": req.type}),
                    media_type="text/event-stream", headers={**headers,
                                                             "X-Accel-Buffering": "no"})
            return _tgi_error(req)
        token_stream = self.engine.submit(req.num_prompt_tokens, req.max_new_tokens,
                                          arrival_s=started_s)
        if isinstance(token_stream, Rejection):
            err = ApiError(422, f"Input validation error: {token_stream.message}", "validation")
            if stream:
                return StreamingResponse(_one_event({"error": err.message,
                                                     "error_type": "validation"}),
                                         media_type="text/event-stream", headers=headers)
            return _tgi_error(err)
        if stream:
            return StreamingResponse(self._tgi_events(token_stream, req),
                                     media_type="text/event-stream",
                                     headers={**headers, "X-Accel-Buffering": "no"})
        async for _ in token_stream.tokens():
            pass
        if token_stream.error is not None:
            return JSONResponse({"error": token_stream.error, "error_type": "generation"},
                                status_code=424, headers=headers)
        n = token_stream.num_tokens
        text = (req.inputs if req.return_full_text else "") + output_text(n)
        result: dict[str, Any] = {"generated_text": text}
        if req.details:
            result["details"] = {
                "finish_reason": "length", "generated_tokens": n, "seed": req.seed,
                "prefill": [], "tokens": [_tgi_token(i) for i in range(n)],
            }
        headers.update(self._tgi_timing_headers(token_stream.request, started_s, n))
        return JSONResponse([result] if as_list else result, headers=headers)

    async def _tgi_events(self, stream: TokenStream, req: TgiRequest) -> AsyncIterator[bytes]:
        last = req.max_new_tokens
        async for i in stream.tokens():
            generated_text: str | None = None
            details: dict[str, Any] | None = None
            if i + 1 == last:
                generated_text = (req.inputs if req.return_full_text else "") + output_text(last)
                if req.details:
                    details = {"finish_reason": "length", "generated_tokens": last,
                               "seed": req.seed, "input_length": req.num_prompt_tokens}
            yield b"data:" + _dumps({"index": i + 1, "token": _tgi_token(i),
                                     "generated_text": generated_text,
                                     "details": details}) + b"\n\n"
        if stream.error is not None:
            yield b"data:" + _dumps({"error": stream.error,
                                     "error_type": "generation"}) + b"\n\n"

    def _tgi_timing_headers(self, request: Request, started_s: float,
                            num_tokens: int) -> dict[str, str]:
        """TGI's non-streaming timing headers, from the engine's instants (milliseconds)."""
        now_s = self.engine.now_s()
        first_s = request.first_scheduled_s if request.first_scheduled_s is not None else now_s
        end_s = request.finished_s if request.finished_s is not None else now_s
        inference_s = max(0.0, end_s - first_s)

        def ms(seconds: float) -> str:
            return str(max(0, round(seconds * 1000)))

        return {
            "x-compute-time": f"{max(0.0, now_s - started_s):.6f}",
            "x-total-time": ms(now_s - started_s),
            "x-validation-time": ms(request.arrival_s - started_s),
            "x-queue-time": ms(first_s - request.arrival_s),
            "x-inference-time": ms(inference_s),
            "x-time-per-token": ms(inference_s / num_tokens if num_tokens else 0.0),
            "x-prompt-tokens": str(request.num_prompt_tokens),
            "x-generated-tokens": str(num_tokens),
        }

    # -- everything else

    async def health(self, _request: StarletteRequest) -> Response:
        if self.engine.failure is not None:
            return JSONResponse({"error": "unhealthy", "error_type": "healthcheck"},
                                status_code=503)
        return Response(status_code=200)

    async def models(self, _request: StarletteRequest) -> Response:
        return JSONResponse({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self._created,
            "owned_by": ENGINE_NAME, "root": self.config.model, "parent": None,
            "max_model_len": self.protocols.max_model_len, "permission": [],
        }]})

    async def version(self, _request: StarletteRequest) -> Response:
        return JSONResponse({"version": batchlab_version(), "engine": ENGINE_NAME})

    async def info(self, _request: StarletteRequest) -> Response:
        """TGI's ``/info`` fields, plus the reference engine's configuration."""
        max_len = self.protocols.max_model_len
        return JSONResponse({
            "model_id": self.model_name, "model_sha": None, "model_pipeline_tag":
            "text-generation", "max_concurrent_requests": None,  # no admission cap
            "max_best_of": 1, "max_stop_sequences": 0, "max_input_tokens": max_len - 1,
            "max_total_tokens": max_len, "validation_workers": 1, "max_client_batch_size": 1,
            "router": ENGINE_NAME, "version": batchlab_version(), "sha": None,
            "docker_label": None, "prompt_token_rule": self.counter.rule,
            "reference": self.config.as_dict(),
        })

    async def prometheus(self, _request: StarletteRequest) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


def _usage(num_prompt_tokens: int, num_output_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_output_tokens,
            "total_tokens": num_prompt_tokens + num_output_tokens}


def _tgi_token(index: int) -> dict[str, Any]:
    return {"id": output_token_id(index), "text": output_token_text(index), "logprob": 0.0,
            "special": False}


async def _one_event(obj: Mapping[str, Any]) -> AsyncIterator[bytes]:
    yield b"data:" + _dumps(obj) + b"\n\n"


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


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0 picks a free one); raises OSError when it cannot bind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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


def _uvicorn_server(server: ReferenceServer, options: ServerOptions) -> uvicorn.Server:
    return uvicorn.Server(uvicorn.Config(
        server.app, log_level=options.log_level, access_log=options.access_log,
        lifespan="on", ws="none", timeout_graceful_shutdown=options.graceful_shutdown_s,
    ))


def serve(config: ReferenceConfig, options: ServerOptions,
          on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn's graceful shutdown). Blocks; main thread.

    ``on_ready(url)`` is called once the engine loop runs and the socket listens."""
    url = ""  # known once bound; the server calls on_ready after that

    def ready() -> None:
        if on_ready is not None:
            on_ready(url)

    server = ReferenceServer(config, served_model_name=options.served_model_name,
                             tokenizer_path=options.tokenizer_path, on_ready=ready)
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
                             tokenizer_path=options.tokenizer_path)
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


@dataclass
class ServerProcess:
    """A ``batchlab serve reference`` child process (no shared GIL with the caller)."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path  # its stdout and stderr

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM (a graceful shutdown), then SIGKILL if it is still there after timeout_s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def launch_server_process(engine_args: Sequence[str] = (), *, host: str = "127.0.0.1",
                          log_path: str | Path | None = None,
                          startup_timeout_s: float = 60.0) -> ServerProcess:
    """Start ``batchlab serve reference ENGINE_ARGS --port 0`` in a child process and wait until
    it prints its URL. For benchmarks and tests whose timing must not share a GIL with the
    server. Raises RuntimeError (with the log's tail) if it exits or does not start in time."""
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="batchlab-serve-", suffix=".log")
        os.close(fd)
        log_path = name
    path = Path(log_path)
    argv = [sys.executable, "-m", "harness.cli", "serve", "reference", *engine_args,
            "--host", host, "--port", "0"]
    with path.open("wb") as log_file:
        process = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + startup_timeout_s
    while True:
        text = path.read_text(errors="replace")
        found = re.search(r"listening on (http://\S+)", text)
        if found:
            return ServerProcess(found.group(1), process, path)
        if process.poll() is not None or time.monotonic() > deadline:
            ServerProcess("", process, path).stop()
            raise RuntimeError(f"batchlab serve reference did not start ({' '.join(argv)}):\n"
                               f"{text[-2000:]}")
        time.sleep(0.05)
