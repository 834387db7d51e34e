"""TGI's native protocol: ``/generate``, ``/generate_stream``, the compat route ``/`` and ``/info``.

Validation errors are TGI's ``{"error", "error_type": "validation"}``: HTTP 422 on
``/generate``, HTTP 200 and one error event on ``/generate_stream`` (TGI sends its headers
first). The checks TGI's router makes are made in its order, with its messages behind its
prefix ``Input validation error: ``. Stream events are ``data:{...}`` with no space after the
colon and no ``[DONE]``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request as StarletteRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

from adapters.reference.request import Request
from harness.live.prompts import TextTokenizer, load_tokenizer
from harness.manifest import batchlab_version
from harness.serve.bodies import (
    ApiError,
    bool_field,
    int_field,
    long_number_error,
    parse_off_loop,
    read_json,
    shown,
)
from harness.serve.cancel import CLIENT_CLOSED_REQUEST, AbortOnClose, wait_or_abort
from harness.serve.loop import ENGINE_NAME, Rejection, ServedEngine, TokenStream
from harness.serve.output import dumps, output_text, output_token_id, output_token_text
from harness.serve.prompts import PromptCounter

# What /info advertises and the checks hold requests to (TGI's launcher options of these
# names): one sequence per request, no stop sequences (the scripted output never stops early),
# no top_tokens (the reference has no token probabilities).
MAX_BEST_OF = 1
MAX_STOP_SEQUENCES = 0
MAX_TOP_N_TOKENS = 0
# TGI's InferError::ValidationError, before each message of its ValidationError
# (huggingface/text-generation-inference router/src/infer/mod.rs @058162685f05)
VALIDATION_ERROR_PREFIX = "Input validation error: "


@dataclass(frozen=True, slots=True)
class PrefillToken:
    """One prompt token of ``details.prefill`` (``decoder_input_details``): its id and text
    from the ``--tokenizer``; the reference has no log probability for it."""

    id: int
    text: str


@dataclass(frozen=True, slots=True)
class TgiRequest:
    """A validated ``/generate`` or ``/generate_stream`` request."""

    inputs: str
    num_prompt_tokens: int
    max_new_tokens: int
    details: bool  # `details`, or `decoder_input_details` (which implies it, as in TGI)
    return_full_text: bool
    seed: int | None
    prompt_keys: tuple[int, ...] = ()  # token identities, kept only when prefix caching is on
    prefill: tuple[PrefillToken, ...] | None = None  # the prompt's tokens, when asked for


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
        self.max_input_tokens = self.max_model_len - 1  # TGI's default: max_total_tokens - 1
        # decodes the prompt's token ids for `decoder_input_details` (the counter's tokenizer:
        # load_tokenizer keeps one per path); None without --tokenizer: no ids to give
        self._tokenizer: TextTokenizer | None = (
            load_tokenizer(counter.tokenizer_path) if counter.tokenizer_path is not None
            else None)

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
            "max_best_of": MAX_BEST_OF, "max_stop_sequences": MAX_STOP_SEQUENCES,
            "max_top_n_tokens": MAX_TOP_N_TOKENS,  # (not in TGI's /info: its launcher's option)
            "max_input_tokens": self.max_input_tokens,
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
            err = ApiError(422, VALIDATION_ERROR_PREFIX + token_stream.message, "validation")
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
                "prefill": [{"id": t.id, "text": t.text, "logprob": None}
                            for t in req.prefill or ()],
                "tokens": [_tgi_token(i) for i in range(n)],
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
        """A request checked as TGI's router checks it: first the field types (serde's), then
        the rules of ``Validation::validate``, in its order, with its messages
        (huggingface/text-generation-inference router/src/validation.rs @01067f8ba8bc)."""
        def invalid(message: str) -> ApiError:
            return ApiError(422, VALIDATION_ERROR_PREFIX + message, "validation")

        inputs = body.get("inputs")
        if not isinstance(inputs, str):
            return ApiError(422, f"`inputs` must be a string, got {shown(inputs)}", "validation")
        params = body.get("parameters") or {}
        if not isinstance(params, dict):
            return ApiError(422, "`parameters` must be an object", "validation")
        fields = _TgiFields.read(params)
        if isinstance(fields, ApiError):
            return fields
        # the routes' own checks, before Validation::validate: /generate_stream refuses
        # best_of != 1 and decoder_input_details, /generate a best_of over max_best_of
        # (huggingface/text-generation-inference router/src/server.rs @003eaec0fbe0)
        if fields.best_of is not None and stream and fields.best_of != 1:
            return invalid("`best_of` != 1 is not supported when streaming tokens")
        if fields.best_of is not None and not stream and fields.best_of > MAX_BEST_OF:
            return invalid("`best_of` != 1 is not allowed for this endpoint")
        if stream and fields.decoder_input_details:
            return invalid("`decoder_input_details` == true is not supported when streaming "
                           "tokens")
        refusal = fields.refusal()
        if refusal is not None:
            return invalid(refusal)
        if not inputs:
            return invalid("`inputs` cannot be empty")
        truncate = fields.truncate
        if truncate is not None and not 0 < truncate <= self.max_input_tokens:
            return invalid(f"`truncate` must be strictly positive and less than "
                           f"{self.max_input_tokens}. Given: {truncate}")
        if fields.decoder_input_details and self._tokenizer is None:
            return invalid("`decoder_input_details` == true needs the prompt's token ids: this "
                           "server counts words and punctuation marks (start it with "
                           "--tokenizer)")
        num_prompt = self.counter.count(inputs)
        if truncate is not None:
            num_prompt = min(num_prompt, truncate)
        if num_prompt < 1:
            return invalid("`inputs` has no tokens")
        max_new = fields.max_new_tokens
        if max_new is None:  # TGI: the rest of max_total_tokens (0 when there is none)
            max_new = max(0, self.max_model_len - num_prompt)
        if num_prompt + max_new > self.max_model_len:
            return invalid(f"`inputs` tokens + `max_new_tokens` must be <= "
                           f"{self.max_model_len}. Given: {num_prompt} `inputs` tokens and "
                           f"{max_new} `max_new_tokens`")
        if num_prompt > self.max_input_tokens:
            return invalid(f"`inputs` must have less than {self.max_input_tokens} tokens. "
                           f"Given: {num_prompt}")
        reason = self.engine.rejection(num_prompt, max_new)
        if reason:
            return invalid(f"the request can never run: {reason}")
        unread = long_number_error(body)  # a number too long, in a field not read above
        if unread is not None:
            return ApiError(422, unread.message, "validation")
        # the prompt's last num_prompt tokens (truncate), as TGI keeps them
        ids = (self.counter.keys(inputs)[-num_prompt:]
               if self.engine.config.prefix_caching or fields.decoder_input_details else ())
        prefill: tuple[PrefillToken, ...] | None = None
        if fields.decoder_input_details:
            assert self._tokenizer is not None
            prefill = tuple(PrefillToken(i, self._tokenizer.decode([i])) for i in ids)
        keys = ids if self.engine.config.prefix_caching else ()
        return TgiRequest(inputs, num_prompt, max_new,
                          fields.details or fields.decoder_input_details, fields.return_full_text,
                          fields.seed, keys, prefill)


@dataclass(frozen=True, slots=True)
class _TgiFields:
    """The ``parameters`` a TGI request sets, typed as TGI's serde structs take them: JSON
    integers for integer fields, numbers for float fields, no conversion."""

    max_new_tokens: int | None
    truncate: int | None
    seed: int | None
    best_of: int | None
    top_k: int | None
    top_n_tokens: int | None
    temperature: float | None
    repetition_penalty: float | None
    frequency_penalty: float | None
    top_p: float | None
    typical_p: float | None
    num_stop: int
    details: bool
    return_full_text: bool
    decoder_input_details: bool

    @classmethod
    def read(cls, params: Mapping[str, Any]) -> _TgiFields | ApiError:
        ints = {name: int_field(params, name, minimum, 422, f"`{name}`", maximum=maximum)
                for name, minimum, maximum in (
                    ("max_new_tokens", 0, 2**32 - 1), ("truncate", 0, 2**64 - 1),
                    ("seed", 0, 2**64 - 1), ("best_of", 0, 2**64 - 1),
                    ("top_k", -(2**31), 2**31 - 1), ("top_n_tokens", 0, 2**32 - 1))}
        floats = {name: _number_field(params, name) for name in (
            "temperature", "repetition_penalty", "frequency_penalty", "top_p", "typical_p")}
        flags = {name: bool_field(params, name, False, 422)
                 for name in ("details", "return_full_text", "decoder_input_details")}
        stop = params.get("stop")
        if stop is not None and not (isinstance(stop, list)
                                     and all(isinstance(s, str) for s in stop)):
            return ApiError(422, f"`stop` must be a list of strings, got {shown(stop)}",
                            "validation")
        values: dict[str, Any] = {**ints, **floats, **flags}
        for value in values.values():
            if isinstance(value, ApiError):
                return ApiError(422, value.message, "validation")
        return cls(**values, num_stop=len(stop or ()))

    def refusal(self) -> str | None:
        """The first rule of TGI's ``Validation::validate`` these fields break (its message,
        without the prefix), up to the prompt's own checks; None when they break none. NaN
        breaks every bound, as in Rust's comparisons."""
        if self.temperature is not None and not self.temperature > 0:
            return "`temperature` must be strictly positive"
        if self.repetition_penalty is not None and not self.repetition_penalty > 0:
            return "`repetition_penalty` must be strictly positive"
        if self.frequency_penalty is not None and not -2 <= self.frequency_penalty <= 2:
            return "`frequency_penalty` must be >= -2.0 and <= 2.0"
        if self.top_p is not None and not 0 < self.top_p < 1:
            return "`top_p` must be > 0.0 and < 1.0"
        if self.typical_p is not None and not 0 < self.typical_p < 1:
            return "`typical_p` must be > 0.0 and < 1.0"
        if self.top_k is not None and self.top_k <= 0:
            return "`top_k` must be strictly positive"
        if self.max_new_tokens == 0:
            return "`max_new_tokens` must be strictly positive"
        if self.num_stop > MAX_STOP_SEQUENCES:
            return (f"`stop` supports up to {MAX_STOP_SEQUENCES} stop sequences. Given: "
                    f"{self.num_stop}")
        if self.top_n_tokens is not None and self.top_n_tokens > MAX_TOP_N_TOKENS:
            return (f"`top_n_tokens` must be >= 0 and <= {MAX_TOP_N_TOKENS}. Given: "
                    f"{self.top_n_tokens}")
        return None


def _number_field(params: Mapping[str, Any], name: str) -> float | ApiError | None:
    """``params[name]`` as a float field of serde's: any JSON number, not a boolean; None
    where it is absent or null."""
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return ApiError(422, f"`{name}` must be a number, got {shown(value)}", param=name)
    try:
        return float(value)
    except OverflowError:  # an integer past any float: infinite, as an f32 holds it
        return float("inf") if value > 0 else float("-inf")


def _tgi_token(index: int) -> dict[str, Any]:
    return {"id": output_token_id(index), "text": output_token_text(index), "logprob": 0.0,
            "special": False}


async def _one_event(obj: Mapping[str, Any]) -> AsyncIterator[bytes]:
    yield b"data:" + dumps(obj) + b"\n\n"
