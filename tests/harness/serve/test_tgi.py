"""TGI conformance of the served reference engine (``harness.serve.tgi``), checked with the real
``text-generation`` client (``text_generation.Client`` and ``AsyncClient``) and with the replay
client's TGI parser."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from text_generation import AsyncClient, Client
from text_generation.errors import ValidationError, parse_error
from text_generation.types import FinishReason

from adapters.reference.config import ReferenceConfig
from harness.live.protocols import parse_stream
from harness.serve.app import RunningServer, ServerOptions, start_server_in_thread
from harness.serve.output import output_text, output_token_id, output_token_text

# text-generation 0.7 calls pydantic's deprecated .dict(); not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:The `dict` method is deprecated")

CONFIG = ReferenceConfig(model="qwen2.5-0.5b", max_model_len=512)


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with start_server_in_thread(CONFIG) as running:
        yield running


def test_client_generate(server: RunningServer) -> None:
    response = Client(server.url, timeout=30).generate("Hello, world!", max_new_tokens=7)
    assert response.generated_text == output_text(7)
    details = response.details
    assert details.finish_reason == FinishReason.Length
    assert details.generated_tokens == 7
    assert [t.text for t in details.tokens] == [output_token_text(i) for i in range(7)]
    assert [t.id for t in details.tokens] == [output_token_id(i) for i in range(7)]
    assert not any(t.special for t in details.tokens)


def test_client_generate_stream(server: RunningServer) -> None:
    responses = list(Client(server.url, timeout=30).generate_stream("Hello there",
                                                                    max_new_tokens=5))
    assert len(responses) == 5
    assert [r.token.text for r in responses] == [output_token_text(i) for i in range(5)]
    assert all(r.generated_text is None and r.details is None for r in responses[:-1])
    last = responses[-1]
    assert last.generated_text == output_text(5)
    assert last.details is not None
    assert last.details.generated_tokens == 5
    assert last.details.finish_reason == FinishReason.Length


def test_async_client(server: RunningServer) -> None:
    async def run() -> tuple[str, int, int]:
        client = AsyncClient(server.url, timeout=30)
        response = await client.generate("Hi", max_new_tokens=4, seed=7, do_sample=True)
        n = 0
        async for _ in client.generate_stream("Hi", max_new_tokens=6):
            n += 1
        return response.generated_text, response.details.generated_tokens, n

    text, generated, streamed = asyncio.run(run())
    assert text == output_text(4) and generated == 4 and streamed == 6


def test_client_sees_validation_errors(server: RunningServer) -> None:
    client = Client(server.url, timeout=30)
    long_input = "word " * 600
    with pytest.raises(ValidationError, match="must be <= 512"):
        client.generate(long_input, max_new_tokens=5)
    with pytest.raises(ValidationError, match="must be <= 512"):
        list(client.generate_stream(long_input, max_new_tokens=5))
    # (the client refuses temperature 0 itself; the server's answer maps to the same error)
    r = httpx.post(server.url + "/generate", json={"inputs": "hi",
                                                   "parameters": {"temperature": 0}},
                   trust_env=False)
    assert isinstance(parse_error(r.status_code, r.json()), ValidationError)


def test_generate_stream_wire_format(server: RunningServer) -> None:
    r = httpx.post(server.url + "/generate_stream",
                   json={"inputs": "one two three", "parameters": {"max_new_tokens": 3,
                                                                   "details": True}},
                   trust_env=False)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["x-accel-buffering"] == "no"
    assert r.headers["x-compute-type"] == "1-h100-sxm"
    assert r.headers["x-compute-characters"] == str(len("one two three"))
    blocks = [b for b in r.text.split("\n\n") if b]
    assert all(b.startswith("data:{") for b in blocks)  # TGI (axum): no space, no [DONE]
    events = [json.loads(b[len("data:"):]) for b in blocks]
    assert [list(e) for e in events] == [["index", "token", "generated_text", "details"]] * 3
    assert [e["index"] for e in events] == [1, 2, 3]
    assert events[0]["token"] == {"id": output_token_id(0), "text": output_token_text(0),
                                  "logprob": 0.0, "special": False}
    assert events[-1]["details"] == {"finish_reason": "length", "generated_tokens": 3,
                                     "seed": None, "input_length": 3}
    outcome = parse_stream("tgi", [r.content])
    assert outcome.completed and outcome.num_chunk_tokens == 3
    assert outcome.usage_num_output_tokens == 3 and outcome.usage_num_prompt_tokens == 3


def test_generate_stream_without_details_and_with_full_text(server: RunningServer) -> None:
    r = httpx.post(server.url + "/generate_stream",
                   json={"inputs": "abc", "parameters": {"max_new_tokens": 2,
                                                         "return_full_text": True}},
                   trust_env=False)
    last = json.loads(r.text.strip().split("\n\n")[-1][len("data:"):])
    assert last["details"] is None and last["generated_text"] == "abc" + output_text(2)


def test_generate_headers_and_body(server: RunningServer) -> None:
    r = httpx.post(server.url + "/generate",
                   json={"inputs": "a b c d", "parameters": {"max_new_tokens": 4}},
                   trust_env=False)
    assert r.status_code == 200
    assert r.json() == {"generated_text": output_text(4)}  # details only when asked
    assert r.headers["x-prompt-tokens"] == "4" and r.headers["x-generated-tokens"] == "4"
    for name in ("x-total-time", "x-validation-time", "x-queue-time", "x-inference-time",
                 "x-time-per-token"):
        assert int(r.headers[name]) >= 0
    assert float(r.headers["x-compute-time"]) >= 0


def _validation_error(server: RunningServer, path: str, body: dict[str, Any]) -> str:
    """The message of TGI's validation error for ``body``: a 422 on /generate, HTTP 200 and
    one error event on /generate_stream (TGI streams its errors)."""
    r = httpx.post(server.url + path, json=body, trust_env=False)
    if path == "/generate_stream":
        assert r.status_code == 200, r.text
        blocks = [b for b in r.text.split("\n\n") if b.strip()]
        assert len(blocks) == 1
        error = json.loads(blocks[0][len("data:"):])
        assert parse_stream("tgi", [r.content]).error_kind == "stream_error"
    else:
        assert r.status_code == 422, r.text
        error = r.json()
    assert error["error_type"] == "validation"
    return str(error["error"])


# TGI's messages (router/src/validation.rs), behind InferError's prefix (router/src/infer/mod.rs);
# the server's max_model_len is 512, so max_input_tokens is 511
@pytest.mark.parametrize("path, parameters, message", [
    ("/generate", {"max_new_tokens": 0}, "`max_new_tokens` must be strictly positive"),
    ("/generate", {"top_p": 1.0}, "`top_p` must be > 0.0 and < 1.0"),
    ("/generate", {"temperature": 0}, "`temperature` must be strictly positive"),
    ("/generate", {"best_of": 2}, "`best_of` != 1 is not allowed for this endpoint"),
    ("/generate_stream", {"best_of": 2}, "`best_of` != 1 is not supported when streaming tokens"),
    ("/generate_stream", {"decoder_input_details": True},
     "`decoder_input_details` == true is not supported when streaming tokens"),
    ("/generate", {"top_k": 0}, "`top_k` must be strictly positive"),
    ("/generate", {"typical_p": 1.5}, "`typical_p` must be > 0.0 and < 1.0"),
    ("/generate", {"typical_p": 0}, "`typical_p` must be > 0.0 and < 1.0"),
    ("/generate", {"repetition_penalty": 0}, "`repetition_penalty` must be strictly positive"),
    ("/generate", {"frequency_penalty": 2.5}, "`frequency_penalty` must be >= -2.0 and <= 2.0"),
    ("/generate", {"frequency_penalty": -3}, "`frequency_penalty` must be >= -2.0 and <= 2.0"),
    ("/generate", {"truncate": 600},
     "`truncate` must be strictly positive and less than 511. Given: 600"),
    ("/generate", {"truncate": 0},
     "`truncate` must be strictly positive and less than 511. Given: 0"),
    ("/generate", {"top_n_tokens": 1}, "`top_n_tokens` must be >= 0 and <= 0. Given: 1"),
    ("/generate", {"stop": ["a", "b"], "max_new_tokens": 1},
     "`stop` supports up to 0 stop sequences. Given: 2"),
    ("/generate_stream", {"stop": ["a"], "max_new_tokens": 1},
     "`stop` supports up to 0 stop sequences. Given: 1"),
])
def test_tgi_validation_errors(server: RunningServer, path: str, parameters: dict[str, Any],
                               message: str) -> None:
    """Each check TGI's router makes is made here too, with its message and prefix, as a 422
    on /generate and an error event on /generate_stream."""
    assert _validation_error(server, path, {"inputs": "x", "parameters": parameters}
                             ) == "Input validation error: " + message


@pytest.mark.parametrize("path", ["/generate", "/generate_stream"])
def test_tgi_prompt_length_errors_are_tgis(server: RunningServer, path: str) -> None:
    assert _validation_error(server, path, {"inputs": ""}) == (
        "Input validation error: `inputs` cannot be empty")
    # without max_new_tokens, a prompt of max_total_tokens fits the total but not the input
    assert _validation_error(server, path, {"inputs": "w " * 512}) == (
        "Input validation error: `inputs` must have less than 511 tokens. Given: 512")
    assert _validation_error(server, path, {"inputs": "w " * 520}) == (
        "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 512. Given: "
        "520 `inputs` tokens and 0 `max_new_tokens`")


@pytest.mark.parametrize("parameters", [
    {"stop": [], "top_n_tokens": 0, "best_of": 1, "top_k": 5, "typical_p": 0.5,
     "repetition_penalty": 1.2, "frequency_penalty": -2, "truncate": 511},
    {"stop": None, "top_n_tokens": None, "decoder_input_details": False},
])
def test_tgi_parameters_within_tgis_bounds_are_accepted(server: RunningServer,
                                                        parameters: dict[str, Any]) -> None:
    r = httpx.post(server.url + "/generate", json={"inputs": "a b c", "parameters": {
        "max_new_tokens": 2, **parameters}}, trust_env=False)
    assert r.status_code == 200, r.text
    assert r.json() == {"generated_text": output_text(2)}


def test_info_advertises_the_limits_it_holds_requests_to(server: RunningServer) -> None:
    info = httpx.get(server.url + "/info", trust_env=False).json()
    assert info["max_stop_sequences"] == 0 and info["max_best_of"] == 1
    assert info["max_top_n_tokens"] == 0 and info["max_input_tokens"] == 511


def test_tgi_bad_json(server: RunningServer) -> None:
    r = httpx.post(server.url + "/generate", content=b"{oops", trust_env=False)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]


def test_tgi_openai_chat_route_is_shared(server: RunningServer) -> None:
    # TGI also serves /v1/chat/completions; the reference serves it once, in vLLM's dialect.
    r = httpx.post(server.url + "/v1/chat/completions", json={
        "model": "qwen2.5-0.5b", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2}, trust_env=False)
    assert r.json()["usage"]["completion_tokens"] == 2


def _nested(depth: int) -> str:
    return "[" * depth + '"x"' + "]" * depth


@pytest.mark.parametrize("path", ["/generate", "/generate_stream", "/"])
def test_tgi_deeply_nested_json_is_refused_in_tgis_error_body(server: RunningServer,
                                                              path: str) -> None:
    """Too deep to parse (10000 levels) is malformed JSON: 400, as TGI's serde reports its
    recursion limit (a syntax error), in TGI's error body. Parsed but deep (600 levels), it is
    an `inputs` that is not text: TGI's validation error. Never a plain-text 500."""
    url = server.url + path
    r = httpx.post(url, content=f'{{"inputs": {_nested(10_000)}}}'.encode(), trust_env=False,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error_type"] == "validation" and "nested too deeply" in r.json()["error"]
    r = httpx.post(url, content=f'{{"inputs": {_nested(600)}}}'.encode(), trust_env=False,
                   headers={"content-type": "application/json"})
    if path == "/generate_stream":  # TGI streams its validation errors: HTTP 200, one event
        assert r.status_code == 200
        error = json.loads(r.text.strip()[len("data:"):])
    else:
        assert r.status_code == 422
        error = r.json()
    assert error["error_type"] == "validation" and "`inputs`" in error["error"]


@pytest.mark.parametrize("parameters", [{"max_new_tokens": "5"}, {"max_new_tokens": 2.0},
                                        {"max_new_tokens": True}, {"details": "true"},
                                        {"seed": "1"}, {"return_full_text": 1}])
def test_tgi_fields_stay_strict(server: RunningServer, parameters: dict[str, Any]) -> None:
    """TGI's request structs are serde's: no string, float or bool converts to another type
    there (unlike vLLM's pydantic models, which the OpenAI routes follow)."""
    r = httpx.post(server.url + "/generate", json={"inputs": "a b", "parameters": parameters},
                   trust_env=False)
    assert r.status_code == 422 and r.json()["error_type"] == "validation"


def test_health_is_answered_on_root_and_ping_as_tgi_does(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, trust_env=False) as c:
        for path in ("/", "/ping", "/health"):
            r = c.get(path)
            assert r.status_code == 200 and r.content == b"", path
        assert c.head("/").status_code == 200
        # POST / is still TGI's compat route
        assert c.post("/", json={"inputs": "a b", "parameters": {"max_new_tokens": 2}}
                      ).json() == [{"generated_text": output_text(2)}]


def test_decoder_input_details_without_a_tokenizer_is_refused(server: RunningServer) -> None:
    """Without --tokenizer a text prompt is counted, never tokenized: there are no token ids
    to give in `details.prefill`, so the request is refused rather than answered with []."""
    message = _validation_error(server, "/generate", {"inputs": "one two", "parameters": {
        "decoder_input_details": True, "details": True}})
    assert message.startswith("Input validation error: `decoder_input_details`")
    assert "--tokenizer" in message


def _word_level_tokenizer(tmp_path: Path) -> Path:
    """A tokenizer.json of a few words and a BOS token, prepended to every prompt."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "[BOS]": 1, "one": 2, "two": 3, "three": 4}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="[BOS] $A", special_tokens=[("[BOS]", 1)])
    tok.save(str(tmp_path / "tokenizer.json"))
    return tmp_path


def test_decoder_input_details_gives_one_prefill_entry_per_prompt_token(tmp_path: Path) -> None:
    """With --tokenizer, `details.prefill` holds the prompt's tokens as TGI gives them: id and
    text of each (the last `truncate` of them), no log probability (the reference has none).
    `decoder_input_details` alone brings `details`, as in TGI."""
    options = ServerOptions(port=0, tokenizer_path=str(_word_level_tokenizer(tmp_path)))
    with start_server_in_thread(CONFIG, options) as running:
        r = httpx.post(running.url + "/generate", json={"inputs": "one two three", "parameters": {
            "max_new_tokens": 2, "decoder_input_details": True}}, trust_env=False)
        truncated = httpx.post(running.url + "/generate", json={
            "inputs": "one two three", "parameters": {"max_new_tokens": 1, "truncate": 2,
                                                      "decoder_input_details": True}},
            trust_env=False)
        plain = httpx.post(running.url + "/generate", json={
            "inputs": "one two three", "parameters": {"max_new_tokens": 1, "details": True}},
            trust_env=False)
        response = Client(running.url, timeout=30).generate("two one", max_new_tokens=1,
                                                           decoder_input_details=True)
    assert r.status_code == 200, r.text
    details = r.json()["details"]
    assert details["prefill"] == [{"id": 1, "text": "[BOS]", "logprob": None},
                                  {"id": 2, "text": "one", "logprob": None},
                                  {"id": 3, "text": "two", "logprob": None},
                                  {"id": 4, "text": "three", "logprob": None}]
    assert details["generated_tokens"] == 2 and r.headers["x-prompt-tokens"] == "4"
    assert [t["id"] for t in truncated.json()["details"]["prefill"]] == [3, 4]
    assert plain.json()["details"]["prefill"] == []  # only when asked for, as TGI
    assert [(t.id, t.text, t.logprob) for t in response.details.prefill] == [
        (1, "[BOS]", None), (3, "two", None), (2, "one", None)]
