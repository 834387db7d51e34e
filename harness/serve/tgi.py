"""TGI's native protocol: ``/generate``, ``/generate_stream``, the compat route ``/`` and ``/info``.

Validation errors are TGI's ``{"error", "error_type": "validation"}``: HTTP 422 on
``/generate``, HTTP 200 and one error event on ``/generate_stream`` (TGI sends its headers
first). Stream events are ``data:{...}`` with no space after the colon and no ``[DONE]``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request as StarletteRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

from adapters.reference.request import Request
from harness.manifest import batchlab_version
from harness.serve.bodies import (
    ApiError,
    bool_field,
    int_field,
    long_number_error,
    parse_off_loop,
    read_json,
)
from harness.serve.cancel import CLIENT_CLOSED_REQUEST, AbortOnClose, wait_or_abort
from harness.serve.loop import ENGINE_NAME, Rejection, ServedEngine, TokenStream
from harness.serve.output import dumps, output_text, output_token_id, output_token_text
from harness.serve.prompts import PromptCounter


@dataclass(frozen=True, slots=True)
class TgiRequest:
    """A validated ``/generate`` or ``/generate_stream`` request."""

    inputs: str
    num_prompt_tokens: int
    max_new_tokens: int
    details: bool
    return_full_text: bool
    seed: int | None
    prompt_keys: tuple[int, ...] = ()  # token identities, kept only when prefix caching is on


def tgi_error(err: ApiError) -> JSONResponse:
    """TGI's error body: ``{"error": "...", "error_type": "validation"}``."""
    error_type = "validation" if err.status in (400, 422) else "generation"
    return JSONResponse({"error": err.message, "error_type": error_type},
                        status_code=err.status)


class TgiRoutes:
    """The TGI route handlers of one served engine."""

    def __init__(self, engine: ServedEngine, model_name: str, counter: PromptCounter,
                 prediction: Mapping[str, Any]) -> None:
        self.engine = engine
        self.prediction = prediction  # what its timings are a prediction of (the app's /version)
        self.model_name = model_name
        self.counter = counter
        self.max_model_len = engine.config.resolved_max_model_len
        self.compute_type = f"{engine.config.tp}-{engine.config.gpu_spec.name}"

    # -- routes

    async def generate(self, request: StarletteRequest) -> Response:
        return await self._respond(request, stream=False, as_list=False)

    async def generate_stream(self, request: StarletteRequest) -> Response:
        return await self._respond(request, stream=True, as_list=False)

    async def compat(self, request: StarletteRequest) -> Response:
        """``POST /``: TGI's compat route (what ``text_generation.Client`` calls); a list."""
        started_s = self.engine.now_s()
        body = await read_json(request)
        if isinstance(body, ApiError):
            return tgi_error(body)
        stream = body.get("stream") is True
        return await self._respond(request, stream=stream, as_list=not stream, body=body,
                                   started_s=started_s)

    async def info(self, _request: StarletteRequest) -> Response:
        """TGI's ``/info`` fields, plus the reference engine's configuration."""
        max_len = self.max_model_len
        return JSONResponse({
            "model_id": self.model_name, "model_sha": None, "model_pipeline_tag":
            "text-generation", "max_concurrent_requests": None,  # no admission cap
            "max_best_of": 1, "max_stop_sequences": 0, "max_input_tokens": max_len - 1,
            "max_total_tokens": max_len, "validation_workers": 1, "max_client_batch_size": 1,
            "router": ENGINE_NAME, "version": batchlab_version(), "sha": None,
            "docker_label": None, "prompt_token_rule": self.counter.rule,
            "reference": self.engine.published_config(),
            "prediction": self.prediction,
        })

    async def _respond(self, request: StarletteRequest, *, stream: bool, as_list: bool,
                       body: dict[str, Any] | ApiError | None = None,
                       started_s: float | None = None) -> Response:
        if started_s is None:
            started_s = self.engine.now_s()
        if body is None:
            body = await read_json(request)
        if isinstance(body, ApiError):
            return tgi_error(body)
        inputs = body.get("inputs")
        headers = {"x-compute-type": self.compute_type,
                   "x-compute-characters": str(len(inputs) if isinstance(inputs, str) else 0)}
        req = await parse_off_loop(request, lambda: self.parse(body, stream=stream))
        if isinstance(req, ApiError):
            if stream:  # TGI sends headers first: validation errors arrive as an event
                return StreamingResponse(
                    _one_event({"error": req.message, "error_type": req.type}),
                    media_type="text/event-stream", headers={**headers,
                                                             "X-Accel-Buffering": "no"})
            return tgi_error(req)
        token_stream = self.engine.submit(req.num_prompt_tokens, req.max_new_tokens,
                                          received_s=started_s, prompt_keys=req.prompt_keys)
        if isinstance(token_stream, Rejection):
            err = ApiError(422, f"Input validation error: {token_stream.message}", "validation")
            if stream:
                return StreamingResponse(_one_event({"error": err.message,
                                                     "error_type": "validation"}),
                                         media_type="text/event-stream", headers=headers)
            return tgi_error(err)
        if stream:
            return AbortOnClose(self._events(token_stream, req), self.engine, token_stream,
                                headers={**headers, "X-Accel-Buffering": "no"})
        if not await wait_or_abort(request, self.engine, token_stream):
            return Response(status_code=CLIENT_CLOSED_REQUEST)  # nobody is there to read it
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
        headers.update(self._timing_headers(token_stream.request, started_s, n))
        return JSONResponse([result] if as_list else result, headers=headers)

    async def _events(self, stream: TokenStream, req: TgiRequest) -> AsyncIterator[bytes]:
        last = req.max_new_tokens
        async for i in stream.tokens():
            generated_text: str | None = None
            details: dict[str, Any] | None = None
            if i + 1 == last:
                generated_text = (req.inputs if req.return_full_text else "") + output_text(last)
                if req.details:
                    details = {"finish_reason": "length", "generated_tokens": last,
                               "seed": req.seed, "input_length": req.num_prompt_tokens}
            yield b"data:" + dumps({"index": i + 1, "token": _tgi_token(i),
                                    "generated_text": generated_text,
                                    "details": details}) + b"\n\n"
        if stream.error is not None:
            yield b"data:" + dumps({"error": stream.error,
                                    "error_type": "generation"}) + b"\n\n"

    def _timing_headers(self, request: Request, started_s: float,
                        num_tokens: int) -> dict[str, str]:
        """TGI's non-streaming timing headers, from the engine's instants (milliseconds).
        The validation time runs to the arrival at the engine: the modelled front end."""
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

    # -- parsing

    def parse(self, body: Mapping[str, Any], *, stream: bool) -> TgiRequest | ApiError:
        def invalid(message: str) -> ApiError:
            return ApiError(422, message, "validation")

        inputs = body.get("inputs")
        if not isinstance(inputs, str) or not inputs:
            return invalid("`inputs` cannot be empty")
        params = body.get("parameters") or {}
        if not isinstance(params, dict):
            return invalid("`parameters` must be an object")
        max_new = int_field(params, "max_new_tokens", 1, 422, "`max_new_tokens`")
        truncate = int_field(params, "truncate", 1, 422, "`truncate`")
        seed = int_field(params, "seed", 0, 422, "`seed`", maximum=2**64 - 1)  # serde's u64
        details = bool_field(params, "details", False, 422)
        full_text = bool_field(params, "return_full_text", False, 422)
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
        unread = long_number_error(body)  # a number too long, in a field not read above
        if unread is not None:
            return ApiError(422, unread.message, "validation")
        keys: tuple[int, ...] = ()
        if self.engine.config.prefix_caching:  # the prompt's last num_prompt tokens (truncate)
            keys = self.counter.keys(inputs)[-num_prompt:]
        return TgiRequest(inputs, num_prompt, max_new, bool(details), bool(full_text), seed,
                          keys)


def _tgi_token(index: int) -> dict[str, Any]:
    return {"id": output_token_id(index), "text": output_token_text(index), "logprob": 0.0,
            "special": False}


async def _one_event(obj: Mapping[str, Any]) -> AsyncIterator[bytes]:
    yield b"data:" + dumps(obj) + b"\n\n"
