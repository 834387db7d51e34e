"""vLLM's OpenAI dialect: ``/v1/completions``, ``/v1/chat/completions`` and ``/v1/models``.

A request is parsed into an ``OpenAiRequest`` (or an ``ApiError``: HTTP 400 with vLLM's error
body, 404 for another model's name), submitted to the engine, and answered as one JSON body or
as SSE chunks (``data: {...}``, then vLLM's usage chunk when asked for, then ``data: [DONE]``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request as StarletteRequest
from starlette.responses import JSONResponse, Response

from harness.serve.bodies import (
    ApiError,
    as_int,
    bool_field,
    int_field,
    is_whole_number,
    long_number_error,
    parse_off_loop,
    read_json,
    shown,
)
from harness.serve.cancel import CLIENT_CLOSED_REQUEST, AbortOnClose, wait_or_abort
from harness.serve.loop import ENGINE_NAME, Rejection, ServedEngine, TokenStream
from harness.serve.output import dumps, output_text, output_token_text
from harness.serve.prompts import PromptCounter

DEFAULT_COMPLETION_MAX_TOKENS = 16  # vLLM's default for /v1/completions


@dataclass(frozen=True, slots=True)
class OpenAiRequest:
    """A validated ``/v1/completions`` or ``/v1/chat/completions`` request."""

    num_prompt_tokens: int
    max_tokens: int
    priority: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    prompt_keys: tuple[int, ...] = ()  # token identities, kept only when prefix caching is on


def openai_error(err: ApiError) -> JSONResponse:
    """vLLM's current error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return JSONResponse({"error": {"message": err.message, "type": err.type, "param": err.param,
                                   "code": err.status}}, status_code=err.status)


class OpenAiRoutes:
    """The OpenAI route handlers of one served engine."""

    def __init__(self, engine: ServedEngine, model_name: str, counter: PromptCounter) -> None:
        self.engine = engine
        self.model_name = model_name
        self.counter = counter
        self.max_model_len = engine.config.resolved_max_model_len
        self._created = int(time.time())

    # -- routes

    async def completions(self, request: StarletteRequest) -> Response:
        return await self._respond(request, chat=False)

    async def chat_completions(self, request: StarletteRequest) -> Response:
        return await self._respond(request, chat=True)

    async def models(self, _request: StarletteRequest) -> Response:
        return JSONResponse({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self._created,
            "owned_by": ENGINE_NAME, "root": self.engine.config.model, "parent": None,
            "max_model_len": self.max_model_len, "permission": [],
        }]})

    async def _respond(self, request: StarletteRequest, *, chat: bool) -> Response:
        received_s = self.engine.now_s()  # before reading the body: as close to the send as we get
        body = await read_json(request)
        if isinstance(body, ApiError):
            return openai_error(body)
        req = await parse_off_loop(request, lambda: self.parse(body, chat=chat))
        if isinstance(req, ApiError):
            return openai_error(req)
        response_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        stream = self.engine.submit(req.num_prompt_tokens, req.max_tokens,
                                    priority=req.priority, request_id=response_id,
                                    received_s=received_s, prompt_keys=req.prompt_keys)
        if isinstance(stream, Rejection):
            return openai_error(ApiError(400, f"the request can never run: {stream.message}"))
        if req.stream:
            return AbortOnClose(self._events(stream, req, chat), self.engine, stream)
        if not await wait_or_abort(request, self.engine, stream):
            return Response(status_code=CLIENT_CLOSED_REQUEST)  # nobody is there to read it
        if stream.error is not None:
            return openai_error(ApiError(500, stream.error, "InternalServerError"))
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

    async def _events(self, stream: TokenStream, req: OpenAiRequest,
                      chat: bool) -> AsyncIterator[bytes]:
        head = {"id": stream.request_id,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": self.model_name}

        def event(choice: dict[str, Any], num_tokens: int) -> bytes:
            chunk: dict[str, Any] = {**head, "choices": [choice]}
            if req.continuous_usage:
                chunk["usage"] = _usage(req.num_prompt_tokens, num_tokens)
            return b"data: " + dumps(chunk) + b"\n\n"

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
            yield b"data: " + dumps({"error": {"message": stream.error,
                                               "type": "InternalServerError", "param": None,
                                               "code": 500}}) + b"\n\n"
        elif req.include_usage:
            yield b"data: " + dumps({**head, "choices": [],
                                     "usage": _usage(req.num_prompt_tokens,
                                                     stream.num_tokens)}) + b"\n\n"
        yield b"data: [DONE]\n\n"

    # -- parsing

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
        """Chat messages: their texts (``message_texts``) counted; no chat template is
        modelled."""
        if not isinstance(messages, list) or not messages:
            return ApiError(400, "messages must be a non-empty list", param="messages")
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                return ApiError(400, f"messages[{i}] must be an object", param="messages")
            content = message.get("content")
            if content is not None and not isinstance(content, str | list):
                return ApiError(400, f"messages[{i}].content must be a string or a list of "
                                "parts", param="messages")
        n = sum(self.counter.count(text) for text in message_texts(messages))
        if n < 1:
            return ApiError(400, "messages carry no text", param="messages")
        return n

    def parse(self, body: Mapping[str, Any], *, chat: bool) -> OpenAiRequest | ApiError:
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            return ApiError(400, f"model must be a string, got {shown(model)}", param="model")
        if model is not None and model != self.model_name:
            return ApiError(404, f"The model `{model}` does not exist.", "NotFoundError",
                            "model")
        num_prompt = (self.count_messages(body.get("messages")) if chat
                      else self.count_prompt(body.get("prompt")))
        if isinstance(num_prompt, ApiError):
            return num_prompt
        n = body.get("n")
        if n is not None and as_int(n, lax=True) != 1:
            return ApiError(400, "n: the reference engine returns one choice (n=1)", param="n")
        unsupported = unsupported_output(body, chat=chat)
        if unsupported is not None:
            return unsupported
        # Chat: max_completion_tokens unless it is null, else max_tokens (vLLM's
        # build_tok_params), so {"max_completion_tokens": null, "max_tokens": 2} is 2 tokens.
        name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None \
            else "max_tokens"
        # Field types as vLLM's pydantic models take them, in lax mode ("5" and 5.0 are 5).
        max_tokens = int_field(body, name, 1, lax=True)
        min_tokens = int_field(body, "min_tokens", 0, lax=True)
        ignore_eos = bool_field(body, "ignore_eos", False, lax=True)
        stream = bool_field(body, "stream", False, lax=True)
        for value in (max_tokens, min_tokens, ignore_eos, stream):
            if isinstance(value, ApiError):
                return value
        assert not isinstance(max_tokens, ApiError) and not isinstance(min_tokens, ApiError)
        if max_tokens is None:
            # vLLM: 16 for completions when max_tokens is absent (the pydantic default of
            # CompletionRequest.max_tokens: int | None = 16); an explicit null, and chat's
            # default, is no limit: up to max_model_len (get_max_tokens; vllm-project/vllm
            # vllm/entrypoints/openai/protocol.py @0052bed36509, vllm/entrypoints/utils.py
            # @00fc88090e8c).
            max_tokens = (DEFAULT_COMPLETION_MAX_TOKENS if not chat and "max_tokens" not in body
                          else max(1, self.max_model_len - num_prompt))
        if min_tokens is not None and min_tokens > max_tokens:
            return ApiError(400, f"min_tokens ({min_tokens}) must be less than or equal to "
                            f"max_tokens ({max_tokens})", param="min_tokens")
        options = body.get("stream_options")
        if options is not None:
            # vLLM's validate_stream_options tests `data.get("stream_options")`: an empty {}
            # is falsy there, so it passes without stream (vllm-project/vllm
            # vllm/entrypoints/openai/protocol.py @0052bed36509)
            if options and stream is not True:
                return ApiError(400, "Stream options can only be defined when `stream=True`.",
                                param="stream_options")
            if not isinstance(options, dict):
                return ApiError(400, "stream_options must be an object", param="stream_options")
        include_usage = continuous = False
        if options is not None:
            # vLLM's should_include_usage tests `if stream_options:` on the pydantic object,
            # true even for {} (vllm-project/vllm vllm/entrypoints/utils.py @00fc88090e8c).
            # include_usage: true when absent, as vLLM's StreamOptions; an explicit null is off
            usage = bool_field(options, "include_usage", "include_usage" not in options,
                               lax=True)
            running = bool_field(options, "continuous_usage_stats", False, lax=True)
            for value in (usage, running):
                if isinstance(value, ApiError):
                    return ApiError(400, f"stream_options.{value.message}",
                                    param="stream_options")
            assert not isinstance(usage, ApiError) and not isinstance(running, ApiError)
            include_usage, continuous = usage, usage and running
        priority = as_int(body.get("priority", 0), lax=True)  # (null too is refused, as vLLM)
        if priority is None:
            bounds = (" from -2^63 to 2^63 - 1" if is_whole_number(body["priority"], lax=True)
                      else "")
            return ApiError(400, f"priority must be an integer{bounds}, got "
                            f"{shown(body['priority'])}", param="priority")
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
        unread = long_number_error(body)  # a number too long, in a field not read above
        if unread is not None:
            return unread
        keys = (self.prompt_keys(body, chat=chat) if self.engine.config.prefix_caching
                else ())
        return OpenAiRequest(num_prompt, max_tokens, priority, bool(stream), include_usage,
                             continuous, keys)

    def prompt_keys(self, body: Mapping[str, Any], *, chat: bool) -> tuple[int, ...]:
        """A validated prompt's token identities: ids as sent, else the counted pieces (of each
        chat text, in the order ``count_messages`` counts them)."""
        if chat:
            return tuple(k for text in message_texts(body["messages"])
                         for k in self.counter.keys(text))
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.counter.keys(prompt)
        return tuple(int(t) for t in prompt) if isinstance(prompt, list) else ()


def unsupported_output(body: Mapping[str, Any], *, chat: bool) -> ApiError | None:
    """The refusal of a request for what the reference cannot produce: log probabilities
    (completions ``logprobs``, any integer, 0 included: vLLM then returns the sampled token's;
    chat ``logprobs: true``, with ``top_logprobs``; ``prompt_logprobs``) or the echoed prompt
    (completions ``echo: true``). None when the body asks for none of them (null, absent,
    ``echo: false``, chat ``logprobs: false``)."""
    no_logprobs = "the reference server produces no log probabilities"
    if body.get("prompt_logprobs") is not None:
        return ApiError(400, f"prompt_logprobs: {no_logprobs}", param="prompt_logprobs")
    if chat:
        logprobs = bool_field(body, "logprobs", False, lax=True)
        if isinstance(logprobs, ApiError):
            return logprobs
        top = int_field(body, "top_logprobs", 0, lax=True)
        if isinstance(top, ApiError):
            return top
        if logprobs:
            return ApiError(400, f"logprobs: {no_logprobs}", param="logprobs")
        if top:  # vLLM's check_logprobs (vllm-project/vllm
            # vllm/entrypoints/openai/protocol.py @0052bed36509)
            return ApiError(400, "when using `top_logprobs`, `logprobs` must be set to true.",
                            param="top_logprobs")
        return None
    if body.get("logprobs") is not None:
        logprobs_n = int_field(body, "logprobs", 0, lax=True)
        return logprobs_n if isinstance(logprobs_n, ApiError) else ApiError(
            400, f"logprobs: {no_logprobs}", param="logprobs")
    echo = bool_field(body, "echo", False, lax=True)
    if isinstance(echo, ApiError):
        return echo
    if echo:
        return ApiError(400, "echo: the reference server does not echo the prompt",
                        param="echo")
    return None


def message_texts(messages: list[Any]) -> Iterator[str]:
    """The texts of validated chat messages, in order: a string content, or each text part
    (``{"type": "text", "text": ...}``) of a list of parts. Each is counted, and keyed for
    prefix caching, on its own, so the keys line up with the counted tokens."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    yield part["text"]


def _usage(num_prompt_tokens: int, num_output_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_output_tokens,
            "total_tokens": num_prompt_tokens + num_output_tokens}
