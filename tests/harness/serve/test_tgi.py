"""TGI conformance of the served reference engine (``harness.serve.tgi``), checked with the real
``text-generation`` client (``text_generation.Client`` and ``AsyncClient``) and with the replay
client's TGI parser."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from text_generation import AsyncClient, Client
from text_generation.errors import ValidationError, parse_error
from text_generation.types import FinishReason

from adapters.reference.config import ReferenceConfig
from harness.live.protocols import parse_stream
from harness.serve.app import RunningServer, start_server_in_thread
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


@pytest.mark.parametrize("path, body, fragment", [
    ("/generate", {"inputs": ""}, "`inputs` cannot be empty"),
    ("/generate", {"inputs": "x", "parameters": {"max_new_tokens": 0}}, "max_new_tokens"),
    ("/generate", {"inputs": "x", "parameters": {"top_p": 1.0}}, "top_p"),
    ("/generate", {"inputs": "x", "parameters": {"best_of": 2}}, "best_of"),
    ("/generate_stream", {"inputs": "x", "parameters": {"decoder_input_details": True}},
     "decoder_input_details"),
])
def test_tgi_validation_errors(server: RunningServer, path: str, body: dict[str, Any],
                               fragment: str) -> None:
    r = httpx.post(server.url + path, json=body, trust_env=False)
    if path == "/generate_stream":  # TGI streams its errors: HTTP 200 and one error event
        assert r.status_code == 200
        error = json.loads(r.text.strip()[len("data:"):])
        assert parse_stream("tgi", [r.content]).error_kind == "stream_error"
    else:
        assert r.status_code == 422
        error = r.json()
    assert error["error_type"] == "validation" and fragment in error["error"]


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
