"""The three streaming wire protocols the replay client speaks: request bodies and stream parsers.

Everything here is pure: ``build_body`` turns a trace request and its prompt into the JSON a
server expects, and ``StreamParser`` turns the SSE events of one response, each stamped with the
instant its bytes arrived, into a ``StreamOutcome``. The replay client does the I/O; the tests
feed recorded byte streams (``tests/data/sse_*.txt``) through ``parse_stream``.

Protocols (``../shared/reference/engines.md`` §3 has the wire details):

    openai        POST /v1/completions       vLLM / TRT-LLM / TGI dialect of OpenAI completions
    openai-chat   POST /v1/chat/completions  the same for chat
    tgi           POST /generate_stream      TGI's native stream: ``data:{json}``, no ``[DONE]``

What counts as a *chunk*: one SSE event that carries at least one generated token. A chat
role-only first event, a usage-only trailer, ``[DONE]`` and keep-alive comments are not chunks.
Events are not tokens: llama.cpp's server holds back a token that ends inside a UTF-8 character
(no event) and sends special tokens as events with empty text. So the tokens in a chunk come
from the best running count the server offers, when every token event so far carried it:

    timings   llama.cpp's ``timings.predicted_n`` (asked for with ``"timings_per_token": true``)
    usage     the running ``usage.completion_tokens`` (vLLM's ``continuous_usage_stats``)
    else      1 for an event with text, 0 for one without (one event per token, the common case)

A running count adds only its increase over the tokens already counted, so a last event that
repeats the total (llama.cpp's empty final event with ``finish_reason`` and ``usage``) adds 0
and is not a chunk. A total the server gives only at the end (``usage_num_output_tokens``) is
the request's output length; it never becomes a chunk, so chunks hold only tokens seen arrive.
``StreamOutcome.count_source`` names which count was used.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from adapters.catalog import priority_wire
from harness.live.sse_framing import DEFAULT_MAX_EVENT_BYTES, SseDecoder, SseEvent

ProtocolName = Literal["openai", "openai-chat", "tgi"]
PROTOCOLS: tuple[ProtocolName, ...] = ("openai", "openai-chat", "tgi")

PATHS: dict[str, str] = {
    "openai": "/v1/completions",
    "openai-chat": "/v1/chat/completions",
    "tgi": "/generate_stream",
}

# Where each protocol carries a request priority, or why it cannot.
PRIORITY_FIELD: dict[str, str | None] = {
    "openai": "priority",
    "openai-chat": "priority",
    "tgi": None,  # /generate_stream has no priority field
}

# ---------------------------------------------------------------- request priority
#
# A trace's priority is vLLM's: an int, lower is served first, default 0
# (harness.traces.TraceRequest). What a server makes of the body's "priority" field (its scale,
# and what it does with a priority other than 0 under another policy than priority) is its
# adapter's fact: ``PriorityWire`` (adapters.base), looked up by the engine's name
# (adapters.catalog.priority_wire). A plain --target replay names no engine: vLLM's int, as the
# trace has it.

PRIORITY_POLICY = "priority"  # the policy (uniform knob) under which engines order by priority


def wire_priority(priority: int, engine: str | None) -> int | float:
    """``priority`` as ``engine``'s server reads it (None: no engine named, vLLM's int)."""
    return priority_wire(engine).value(priority)


@dataclass(frozen=True, slots=True)
class PriorityPlan:
    """What a replay does with its trace's priorities on one server, decided before anything
    is sent (``plan_priority``)."""

    send: bool  # requests carry their priority (each in the server's own scale)
    note: str  # the manifest's "priority" entry: what happened to them, and why


def plan_priority(priorities: Iterable[int | None], protocol: ProtocolName,
                  engine: str | None = None, policy: str | None = None) -> PriorityPlan:
    """Whether and how ``priorities`` (a trace's) reach a server speaking ``protocol``.

    ``engine``: the engine behind it (``replay --engine``), None for a plain ``--target``
    replay, which sends vLLM's convention. ``policy``: the scheduling policy it runs with (the
    uniform knob's value), None when not known (a server batchlab attached to and that did not
    say). The engine's adapter has the facts (``PriorityWire``)."""
    given = [p for p in priorities if p is not None]
    if not given:
        return PriorityPlan(False, "none: no request has a priority")
    fld = PRIORITY_FIELD[protocol]
    if fld is None:
        return PriorityPlan(False, f"not applied: the {protocol} protocol has no priority field")
    wire = priority_wire(engine)
    if wire.off_policy == "no-priority":
        return PriorityPlan(False, f"not applied: {wire.server} has no request priority")
    converted = wire.scale != "vllm-int"
    if converted:
        scale = (f"converted: trace priority p sent as {wire.rule}, {wire.server} serves "
                 "higher first")
    elif engine is None:
        scale = ("in vLLM's convention (lower is served first), as no --engine names the "
                 "server")
    else:
        scale = "in vLLM's convention (lower is served first)"
    if policy is None:
        return PriorityPlan(True, f"sent; the server's policy is not known; {scale}")
    if policy == PRIORITY_POLICY:
        if converted:
            return PriorityPlan(True, scale)
        return PriorityPlan(True, f"applied: sent in the request's {fld!r} field, {scale}")
    # A known policy that does not order by priority.
    num_nonzero = sum(1 for p in given if p != 0)
    if wire.off_policy == "http-400" and num_nonzero:
        # The server answers 400 to every such request. Its FCFS queue ignores priorities
        # anyway, so the trace is sent without them: an FCFS cell beside a priority cell on one
        # trace (fcfs-vs-priority) measures what FCFS does, and its classes are still reported
        # apart.
        return PriorityPlan(False, (
            f"not sent: {num_nonzero} of {len(given)} requests have a priority other than 0, "
            f"which {engine} answers with HTTP 400 under --policy {policy}; its queue is FCFS, "
            "so they are sent without one (--policy priority orders by them)"))
    if wire.off_policy == "ignored":
        # The server accepts the field and ignores it: the run is a valid measurement of its
        # FCFS queue, so it is not refused, and the field is not sent (the engine's servers from
        # before the field existed reject unknown fields).
        return PriorityPlan(False, f"not applied: {wire.server} orders by priority only with "
                            "--policy priority")
    return PriorityPlan(False, f"not applied: the server's policy is {policy}, which does not "
                        "order by priority" + ("" if num_nonzero else
                                               " (every request has priority 0)"))


# How each protocol is asked for the trace's exact output length.
OUTPUT_LENGTH_CONTROL: dict[str, str] = {
    "openai": "exact: max_tokens + min_tokens + ignore_eos",
    "openai-chat": "exact: max_tokens + min_tokens + ignore_eos",
    "tgi": "upper bound only: parameters.max_new_tokens (TGI has no ignore_eos or min_tokens "
    "over HTTP); reached_target_length records the outcome",
}

# How an OpenAI-compatible server is told to produce exactly N tokens. Servers disagree:
#   vllm          max_tokens + min_tokens + ignore_eos   (vLLM, TRT-LLM, llama.cpp's server)
#   transformers  max_tokens + generation_config='{"min_new_tokens": N, "max_new_tokens": N}'
#                 (`transformers serve` answers 422 to ignore_eos and min_tokens)
#   max_tokens    max_tokens alone: an upper bound; reached_target_length records the outcome
LengthControl = Literal["vllm", "transformers", "max_tokens"]
LENGTH_CONTROLS: tuple[str, ...] = ("vllm", "transformers", "max_tokens")

OVERLOAD_STATUSES = frozenset({429, 503})


def error_kind_for_status(status: int) -> str:
    """The ``error_kind`` of a non-2xx response."""
    return "overloaded" if status in OVERLOAD_STATUSES else "http_error"


# ---------------------------------------------------------------- prompts and bodies


PromptMode = Literal["token_ids", "tokenizer_text", "approx_text"]


@dataclass(frozen=True, slots=True)
class Prompt:
    """A synthesised prompt: token ids (sent as ids) or text, and how it was made."""

    mode: PromptMode
    token_ids: tuple[int, ...] = ()
    text: str = ""

    def __post_init__(self) -> None:
        if self.mode == "token_ids" and self.text:
            raise ValueError("a token_ids prompt carries no text")


def build_body(
    protocol: ProtocolName,
    prompt: Prompt,
    *,
    num_output_tokens: int,
    model: str | None = None,
    priority: int | None = None,
    length_control: LengthControl = "vllm",
    timings_per_token: bool = False,
    engine: str | None = None,
) -> dict[str, Any]:
    """The JSON body that asks ``protocol`` for exactly ``num_output_tokens`` streamed tokens
    (``length_control`` says how an OpenAI server is asked; see LENGTH_CONTROLS).

    ``priority`` is the trace's (vLLM's convention), written in the scale of ``engine``, the
    engine behind the server (``wire_priority``; None: no engine named, vLLM's int as given).

    ``timings_per_token`` asks llama.cpp's server for ``timings.predicted_n``, its exact running
    token count, on every event (servers that validate fields may refuse it: off by default)."""
    if num_output_tokens < 1:
        raise ValueError(f"num_output_tokens must be >= 1, got {num_output_tokens}")
    if protocol == "tgi":
        if prompt.mode == "token_ids":
            raise ValueError("tgi /generate_stream takes text, not token ids")
        # No ignore_eos / min_tokens over HTTP: max_new_tokens is an upper bound. `details`
        # makes the last event carry generated_tokens, the server's own count.
        return {
            "inputs": prompt.text,
            "parameters": {"max_new_tokens": num_output_tokens, "details": True},
        }
    body: dict[str, Any] = {}
    if model is not None:
        body["model"] = model
    if protocol == "openai":
        body["prompt"] = list(prompt.token_ids) if prompt.mode == "token_ids" else prompt.text
    elif protocol == "openai-chat":
        if prompt.mode == "token_ids":
            raise ValueError("openai-chat takes text messages, not token ids")
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        raise ValueError(f"unknown protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}")
    # Chat servers disagree on max_tokens vs max_completion_tokens; every one accepts
    # max_tokens (vLLM and TRT-LLM as an alias), and TGI rejects a body carrying both.
    body["max_tokens"] = num_output_tokens
    if length_control == "vllm":
        body["min_tokens"] = num_output_tokens
        body["ignore_eos"] = True
    elif length_control == "transformers":
        body["generation_config"] = json.dumps(
            {"min_new_tokens": num_output_tokens, "max_new_tokens": num_output_tokens,
             "do_sample": False})
    elif length_control != "max_tokens":
        raise ValueError(f"length_control: {length_control!r} is not one of "
                         f"{', '.join(LENGTH_CONTROLS)}")
    body["temperature"] = 0.0
    body["stream"] = True
    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if priority is not None:
        body["priority"] = wire_priority(priority, engine)
    if timings_per_token:
        body["timings_per_token"] = True
    return body


def encode_body(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


# ---------------------------------------------------------------- stream parsing


@dataclass(frozen=True, slots=True)
class StreamOutcome:
    """What one streamed response amounted to. Instants are the caller's integer nanoseconds."""

    chunk_times_ns: tuple[int, ...]
    chunk_num_tokens: tuple[int, ...]
    text: str  # the generated text, for counting tokens with a tokenizer
    finish_reason: str | None
    # the server's own count of output tokens (its last usage, else llama.cpp's predicted_n)
    usage_num_output_tokens: int | None
    usage_num_prompt_tokens: int | None
    completed: bool  # the protocol's end of stream was seen
    error_kind: str | None = None
    error_message: str = ""
    # what the chunk sizes and usage_num_output_tokens came from (one of
    # harness.timeline.TOKEN_COUNT_SOURCES), or "" when the server gave no count (the caller
    # counts the text, or the chunks)
    count_source: str = ""

    @property
    def num_chunk_tokens(self) -> int:
        return sum(self.chunk_num_tokens)


class StreamParser:
    """Folds one response's SSE events into a ``StreamOutcome``.

    ``on_event`` returns True once nothing more should be read: the protocol's end of stream, an
    error event, or a chunk that is not JSON. ``outcome(eof=...)`` then tells what happened; a
    stream that ended before its protocol's end is ``stream_cut``.
    """

    def __init__(self, protocol: ProtocolName) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(
                f"unknown protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}"
            )
        self.protocol = protocol
        self.done = False
        self._times: list[int] = []
        self._tokens: list[int] = []
        self._text: list[str] = []
        self._finish_reason: str | None = None
        self._usage_out: int | None = None
        self._usage_in: int | None = None
        self._predicted_n: int | None = None  # llama.cpp's last timings.predicted_n
        self._num_counted = 0  # tokens attributed to chunks so far
        self._num_token_events = 0  # events with a choice (openai) or a token (tgi)
        # whether every token event so far carried this running count
        self._timings_running = True
        self._usage_running = True
        self._saw_done = False
        self._error_kind: str | None = None
        self._error_message = ""

    # -- events

    def on_event(self, event: SseEvent, t_ns: int) -> bool:
        if self.done:
            return True
        if event.event == "error":
            self._fail("stream_error", f"error event: {event.data[:300]}")
            self._classify_error_payload(event.data)
            return True
        data = event.data.strip()
        if not data:
            return False
        if data == "[DONE]":
            self._saw_done = True
            self.done = True
            return True
        try:
            obj = json.loads(data)
        except ValueError:
            self._fail("invalid_json", f"chunk is not JSON: {data[:200]!r}")
            return True
        if not isinstance(obj, dict):
            self._fail("invalid_json", f"chunk is not a JSON object: {data[:200]!r}")
            return True
        if "error" in obj or obj.get("object") == "error":
            self._fail(*_stream_error(obj))
            return True
        if self.protocol == "tgi":
            self._on_tgi(obj, t_ns)
        else:
            self._on_openai(obj, t_ns)
        return self.done

    def _on_openai(self, obj: dict[str, Any], t_ns: int) -> None:
        usage = obj.get("usage")
        usage_count: int | None = None
        if isinstance(usage, dict):
            if _is_count(usage.get("completion_tokens")):
                usage_count = usage["completion_tokens"]
                self._usage_out = usage_count
            if _is_count(usage.get("prompt_tokens")):
                self._usage_in = usage["prompt_tokens"]
        timings = obj.get("timings")
        predicted_n = timings.get("predicted_n") if isinstance(timings, dict) else None
        if not _is_count(predicted_n):
            predicted_n = None
        else:
            self._predicted_n = predicted_n
        wrong = _openai_shape_problem(obj, self.protocol)
        if wrong:
            self._fail("protocol_error", wrong)
            return
        choices = obj.get("choices")
        if not choices:
            return  # the usage-only trailer (choices [], or none beside usage or timings)
        choice = choices[0]
        if self.protocol == "openai-chat":
            delta = choice.get("delta") or {}
            text = _first_str(delta, _CHAT_TEXT_FIELDS)
        else:
            raw = choice.get("text")
            text = raw if isinstance(raw, str) else ""
        if choice.get("finish_reason"):
            self._finish_reason = str(choice["finish_reason"])
        if not text and predicted_n is None and usage_count is None:
            # a chat role-only event, an empty one, or a finish without text or a count: no
            # token, and no say on whether the counts ran on every event that had one
            return
        self._num_token_events += 1
        self._timings_running = self._timings_running and predicted_n is not None
        self._usage_running = self._usage_running and usage_count is not None
        if self._timings_running:
            assert predicted_n is not None
            n = max(0, predicted_n - self._num_counted)
        elif self._usage_running:
            assert usage_count is not None
            n = max(0, usage_count - self._num_counted)
        else:
            n = 1 if text else 0
        if text:
            self._text.append(text)
        if n > 0:
            self._num_counted += n
            self._times.append(t_ns)
            self._tokens.append(n)

    def count_source(self) -> str:
        """Which count the chunk sizes and the total came from (``TOKEN_COUNT_SOURCES`` in
        ``harness.timeline``), or "" when the server gave none."""
        if self._num_token_events and self.protocol != "tgi":
            if self._timings_running:
                return "timings"
            if self._usage_running:
                return "usage"
        if self._usage_out is not None:
            return "usage" if self.protocol == "tgi" else "usage_total"
        return "usage_total" if self._predicted_n is not None else ""

    def _on_tgi(self, obj: dict[str, Any], t_ns: int) -> None:
        wrong = _tgi_shape_problem(obj)
        if wrong:
            self._fail("protocol_error", wrong)
            return
        token = obj.get("token")
        if isinstance(token, dict):
            # One event per generated token; a special token (EOS) is still a generated token.
            self._num_token_events += 1
            self._num_counted += 1
            self._times.append(t_ns)
            self._tokens.append(1)
            if not token.get("special") and isinstance(token.get("text"), str):
                self._text.append(token["text"])
        details = obj.get("details")
        if isinstance(details, dict):
            if isinstance(details.get("generated_tokens"), int):
                self._usage_out = details["generated_tokens"]
            if isinstance(details.get("input_length"), int):
                self._usage_in = details["input_length"]
            if details.get("finish_reason"):
                self._finish_reason = str(details["finish_reason"])
        if obj.get("generated_text") is not None:
            self.done = True  # TGI's last event: no [DONE] follows

    def protocol_error(self, message: str) -> None:
        """The bytes broke the wire protocol (an oversized event): nothing more is read."""
        self._fail("protocol_error", message)

    def _fail(self, kind: str, message: str) -> None:
        self._error_kind = kind
        self._error_message = message
        self.done = True

    def _classify_error_payload(self, data: str) -> None:
        try:
            obj = json.loads(data)
        except ValueError:
            return
        if isinstance(obj, dict):
            self._fail(*_stream_error(obj))

    # -- result

    def outcome(self, *, eof: bool = True) -> StreamOutcome:
        kind, message = self._error_kind, self._error_message
        completed = kind is None and (
            self._saw_done
            or (self.protocol == "tgi" and self.done)
            # An OpenAI stream whose last chunk carried finish_reason is complete even if the
            # connection closed before [DONE]; without it, the stream was cut.
            or (self.protocol != "tgi" and self._finish_reason is not None)
        )
        if kind is None and not completed and eof:
            kind = "stream_cut"
            message = (
                f"stream ended after {len(self._times)} chunks without "
                f"{'a final event' if self.protocol == 'tgi' else '[DONE] or a finish_reason'}"
            )
        return StreamOutcome(
            chunk_times_ns=tuple(self._times),
            chunk_num_tokens=tuple(self._tokens),
            text="".join(self._text),
            finish_reason=self._finish_reason,
            usage_num_output_tokens=(self._usage_out if self._usage_out is not None
                                     else self._predicted_n),
            usage_num_prompt_tokens=self._usage_in,
            completed=completed,
            error_kind=kind,
            error_message=message,
            count_source=self.count_source(),
        )


# Where each protocol's events carry generated text: a string, or null (vLLM and llama.cpp
# send ``"content": null`` on a chat role-only delta, ``"reasoning_content": null`` beside
# content), never another type.
_CHAT_TEXT_FIELDS = ("content", "reasoning_content", "reasoning")


def _openai_shape_problem(obj: Mapping[str, Any], protocol: ProtocolName) -> str | None:
    """What makes an OpenAI stream event not one the protocol defines, in words naming the
    field; None for a well-formed one. Such an event is a ``protocol_error``: read as it
    stands it carries no token, and a stream of them followed by ``[DONE]`` would count as a
    request completed with no output. Accepted: ``choices: []`` (the usage-only trailer),
    no ``choices`` beside a ``usage`` or ``timings`` object (a trailer too), a chat delta
    without content (role-only, or ``{}``), null or empty text."""
    choices = obj.get("choices")
    if choices is None:
        if isinstance(obj.get("usage"), dict) or isinstance(obj.get("timings"), dict):
            return None
        return f"event has no choices list: {_excerpt(obj)}"
    if not isinstance(choices, list):
        return f"event's choices is not a list: {_excerpt(obj)}"
    if choices and not isinstance(choices[0], dict):
        return f"event's choices[0] is not an object: {_excerpt(obj)}"
    if not choices:
        return None
    choice = choices[0]
    if protocol == "openai-chat":
        delta = choice.get("delta")
        if delta is None:
            return None  # a choice with only a finish_reason
        if not isinstance(delta, dict):
            return f"event's choices[0].delta is not an object: {_excerpt(obj)}"
        for key in _CHAT_TEXT_FIELDS:
            if delta.get(key) is not None and not isinstance(delta[key], str):
                return f"event's choices[0].delta.{key} is not a string: {_excerpt(obj)}"
    elif choice.get("text") is not None and not isinstance(choice["text"], str):
        return f"event's choices[0].text is not a string: {_excerpt(obj)}"
    return None


def _tgi_shape_problem(obj: Mapping[str, Any]) -> str | None:
    """What makes a TGI ``/generate_stream`` event not one TGI defines (``token`` an object
    with a string ``text``, ``generated_text`` a string or null, ``details`` an object or
    null), in words naming the field; None for a well-formed one. An event with none of the
    three carries nothing the stream is made of."""
    if all(obj.get(key) is None for key in ("token", "generated_text", "details")):
        return f"event has no token, generated_text or details: {_excerpt(obj)}"
    token = obj.get("token")
    if token is not None and not isinstance(token, dict):
        return f"event's token is not an object: {_excerpt(obj)}"
    if isinstance(token, dict) and token.get("text") is not None \
            and not isinstance(token["text"], str):
        return f"event's token.text is not a string: {_excerpt(obj)}"
    if obj.get("generated_text") is not None and not isinstance(obj["generated_text"], str):
        return f"event's generated_text is not a string: {_excerpt(obj)}"
    if obj.get("details") is not None and not isinstance(obj["details"], dict):
        return f"event's details is not an object: {_excerpt(obj)}"
    return None


def _excerpt(obj: Mapping[str, Any]) -> str:
    """The start of an event, for the user to see what the server sent."""
    return repr(json.dumps(obj)[:200])


def _is_count(value: object) -> bool:
    return type(value) is int and value >= 0  # (bool is not a count)


def _first_str(obj: Mapping[str, Any], keys: Iterable[str]) -> str:
    for key in keys:
        value = obj.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def _stream_error(obj: Mapping[str, Any]) -> tuple[str, str]:
    """``(error_kind, message)`` for an error object sent inside a 200 stream.

    Shapes: vLLM ``{"error": {"message", "type", "code"}}``; older vLLM / TRT-LLM flat
    ``{"object": "error", "message", "code"}``; TGI ``{"error": "…", "error_type": "…"}``;
    TGI chat ``{"error": {"message", "http_status_code": 422}}``. An overload reported this
    way (TGI answers overload on /generate_stream with HTTP 200 and an event) is ``overloaded``.
    """
    err = obj.get("error")
    inner: Mapping[str, Any] = err if isinstance(err, dict) else obj
    message = inner.get("message") if isinstance(inner.get("message"), str) else None
    if message is None:
        message = err if isinstance(err, str) else json.dumps(obj)[:300]
    error_type = obj.get("error_type") or inner.get("type") or ""
    codes = {inner.get("code"), inner.get("http_status_code"), obj.get("code")}
    overloaded = str(error_type).lower() == "overloaded" or any(
        c in OVERLOAD_STATUSES or str(c) in {"429", "503"} for c in codes if c is not None
    )
    label = f"{error_type}: " if error_type else ""
    return ("overloaded" if overloaded else "stream_error"), f"{label}{message}"[:500]


def parse_stream(
    protocol: ProtocolName, pieces: Iterable[bytes], times_ns: Iterable[int] | None = None,
    *, max_event_bytes: int | None = DEFAULT_MAX_EVENT_BYTES,
) -> StreamOutcome:
    """Parse a recorded response body given as the pieces it arrived in (pure; for tests).

    Each piece gets the matching instant of ``times_ns`` (default 0, 1, 2, …).
    """
    decoder = SseDecoder(max_event_bytes)
    parser = StreamParser(protocol)
    clock: Iterator[int] = iter(times_ns) if times_ns is not None else _count()
    for piece in pieces:
        t = next(clock)
        for event in decoder.feed(piece):
            if parser.on_event(event, t):
                return parser.outcome(eof=False)
        if decoder.error is not None:
            parser.protocol_error(decoder.error)
            return parser.outcome(eof=False)
    return parser.outcome(eof=True)


def _count() -> Iterator[int]:
    i = 0
    while True:
        yield i
        i += 1
