"""vLLM's OpenAI routes (``harness.serve.openai``), and the routes every server has, on a server
running on a thread. None of these tests asserts a duration."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.reference.config import ReferenceConfig
from adapters.reference.prediction import prediction_record
from harness.live.protocols import parse_stream
from harness.serve.app import ReferenceServer, RunningServer, ServerOptions, start_server_in_thread
from harness.serve.bodies import ApiError
from harness.serve.output import output_text

SMALL = ReferenceConfig(model="qwen2.5-0.5b", max_model_len=512)


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with start_server_in_thread(SMALL) as running:
        yield running


@pytest.fixture()
def client(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30, trust_env=False) as c:
        yield c


def _events(body: str) -> list[str]:
    """The data payloads of an SSE body."""
    return [block.split(":", 1)[1].strip() for block in body.split("\n\n") if block.strip()]


def test_completion_non_streaming(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"model": "qwen2.5-0.5b", "prompt": [5, 6, 7],
                                             "max_tokens": 5})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion"
    choice = body["choices"][0]
    assert choice["text"] == output_text(5) and choice["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}


def test_completion_default_max_tokens_is_vllms_16(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"prompt": "one two"})
    assert r.json()["usage"]["completion_tokens"] == 16


def test_completion_stream_with_continuous_usage(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={
        "prompt": list(range(40)), "max_tokens": 7, "min_tokens": 7, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True,
                                           "continuous_usage_stats": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.text.startswith("data: {")  # vLLM's framing: a space after "data:"
    events = _events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    tokens = [c for c in chunks if c["choices"]]
    assert [c["usage"]["completion_tokens"] for c in tokens] == list(range(1, 8))
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 6 + ["length"]
    assert "".join(c["choices"][0]["text"] for c in tokens) == output_text(7)
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 40, "completion_tokens": 7,
                                   "total_tokens": 47}
    # The replay client's parser reads it as 7 one-token chunks, counted from usage.
    outcome = parse_stream("openai", [r.content])
    assert outcome.completed and outcome.error_kind is None
    assert outcome.chunk_num_tokens == (1,) * 7 and outcome.usage_num_output_tokens == 7
    assert outcome.usage_num_prompt_tokens == 40


def test_completion_stream_without_usage(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"prompt": [1], "max_tokens": 3, "stream": True})
    chunks = [json.loads(e) for e in _events(r.text)[:-1]]
    assert len(chunks) == 3 and all("usage" not in c for c in chunks)
    outcome = parse_stream("openai", [r.content])
    assert outcome.completed and outcome.num_chunk_tokens == 3


def test_chat_stream(client: httpx.Client) -> None:
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Hello, world!"}], "max_tokens": 4,
        "stream": True, "stream_options": {"include_usage": True}})
    chunks = [json.loads(e) for e in _events(r.text)[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks
                   if c["choices"]) == output_text(4)
    assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 4,
                                   "total_tokens": 8}
    outcome = parse_stream("openai-chat", [r.content])
    assert outcome.completed and outcome.num_chunk_tokens == 4
    assert outcome.usage_num_output_tokens == 4 and outcome.finish_reason == "length"


def test_chat_non_streaming_honours_max_completion_tokens(client: httpx.Client) -> None:
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": [{"type": "text", "text": "Hi there"}]}],
        "max_completion_tokens": 3})
    body = r.json()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": output_text(3)}
    assert body["usage"]["prompt_tokens"] == 5  # Be . brief . Hi there -> 3 + 2 (no template)


def test_min_tokens_and_ignore_eos_give_exactly_max_tokens(client: httpx.Client) -> None:
    for body in ({"min_tokens": 9, "ignore_eos": True}, {"min_tokens": 0}, {}):
        r = client.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 9, **body})
        assert r.json()["usage"]["completion_tokens"] == 9
    r = client.post("/v1/completions", json={"prompt": [1], "max_tokens": 3, "min_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"


@pytest.mark.parametrize("body, status, fragment", [
    ({"prompt": list(range(600)), "max_tokens": 5}, 400, "maximum context length is 512"),
    ({"prompt": [1], "max_tokens": 512}, 400, "maximum context length is 512"),
    ({"prompt": [], "max_tokens": 5}, 400, "prompt"),
    ({"prompt": ["a", "b"]}, 400, "batched prompts"),
    ({"prompt": [1], "n": 2}, 400, "n=1"),
    ({"prompt": [1], "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": [1], "stream_options": {"include_usage": True}}, 400, "stream=True"),
    ({"prompt": [1], "priority": 1}, 400, "Priority scheduling is not enabled"),
    ({"prompt": [1], "model": "gpt-4"}, 404, "does not exist"),
])
def test_openai_errors(client: httpx.Client, body: dict[str, Any], status: int,
                       fragment: str) -> None:
    r = client.post("/v1/completions", json=body)
    assert r.status_code == status
    error = r.json()["error"]
    assert fragment in error["message"] and error["code"] == status
    assert set(error) == {"message", "type", "param", "code"}


def test_bad_json_is_400(client: httpx.Client) -> None:
    for path in ("/v1/completions", "/v1/chat/completions"):
        r = client.post(path, content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = client.post("/v1/completions", json=[1, 2])
    assert r.status_code == 400


def test_a_request_larger_than_the_kv_cache_is_400() -> None:
    config = ReferenceConfig(model="qwen2.5-0.5b", max_model_len=4096, num_gpu_blocks=4)
    with start_server_in_thread(config) as running:
        r = httpx.post(running.url + "/v1/completions", json={"prompt": list(range(100)),
                                                               "max_tokens": 10})
    assert r.status_code == 400 and "KV blocks" in r.json()["error"]["message"]


def test_health_models_version_info(client: httpx.Client) -> None:
    assert client.get("/health").status_code == 200
    models = client.get("/v1/models").json()
    assert models["data"][0]["id"] == "qwen2.5-0.5b"
    assert models["data"][0]["max_model_len"] == 512
    version = client.get("/version").json()
    assert version["engine"] == "batchlab-reference"
    info = client.get("/info").json()
    assert info["model_id"] == "qwen2.5-0.5b" and info["max_total_tokens"] == 512
    assert info["reference"]["model"] == "qwen2.5-0.5b"
    assert version["reference"] == info["reference"]
    assert info["reference"]["frontend_latency_s"] == 0.0  # the built-in defaults have none
    # every timing it serves is a prediction: both identity routes say of what, how accurate
    assert version["prediction"] == info["prediction"] == prediction_record(SMALL)
    assert version["prediction"]["kind"] == "catalog"


def test_served_model_name() -> None:
    options = ServerOptions(port=0, served_model_name="my-model")
    with start_server_in_thread(SMALL, options) as running:
        ok = httpx.post(running.url + "/v1/completions",
                        json={"model": "my-model", "prompt": [1], "max_tokens": 1})
        wrong = httpx.post(running.url + "/v1/completions",
                           json={"model": "qwen2.5-0.5b", "prompt": [1], "max_tokens": 1})
    assert ok.status_code == 200 and ok.json()["model"] == "my-model"
    assert wrong.status_code == 404


def test_a_long_prompt_is_counted_off_the_event_loop_with_the_same_answer(
        client: httpx.Client) -> None:
    """Bodies past OFF_LOOP_BYTES are parsed on a worker thread (a long one would stall
    every stream): the answers are those of the inline path."""
    from harness.serve.bodies import OFF_LOOP_BYTES

    long_text = "ab " * (OFF_LOOP_BYTES // 3 + 1000)  # over the threshold, over 512 tokens
    r = client.post("/v1/completions", json={"model": "qwen2.5-0.5b", "prompt": long_text,
                                             "max_tokens": 2})
    assert r.status_code == 400 and "maximum context length is 512" in r.text
    r = client.post("/generate", json={"inputs": long_text,
                                       "parameters": {"max_new_tokens": 2, "truncate": 100}})
    assert r.status_code == 200
    short = client.post("/v1/completions", json={"model": "qwen2.5-0.5b", "prompt": "ab " * 50,
                                                 "max_tokens": 2})
    assert short.status_code == 200 and short.json()["usage"]["prompt_tokens"] >= 50


def test_an_api_key_guards_the_v1_routes_and_the_replay_client_sends_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As vLLM's --api-key: /v1 routes answer 401 without `Authorization: Bearer <key>`; health
    and metrics stay open. A replay with --api-key-env is served, one without is refused, and
    the key is written nowhere in either run folder."""
    from harness.cli import main

    key = "s3cret-key-9f2c"
    options = ServerOptions(port=0, api_key=key)
    assert key not in repr(options)
    trace = ["--trace", "harness/data/azure_conv_excerpt.csv", "--limit", "4", "--rate", "20",
             "--max-model-len", "512", "--on-too-long", "clip"]
    with start_server_in_thread(SMALL, options) as server:
        with httpx.Client(base_url=server.url, timeout=30, trust_env=False) as c:
            assert c.get("/v1/models").status_code == 401
            assert c.get("/v1/models").json() == {"error": "Unauthorized"}
            assert c.get("/v1/models", headers={"Authorization": f"Bearer {key}"}
                         ).status_code == 200
            assert c.get("/health").status_code == 200 and c.get("/metrics").status_code == 200
        monkeypatch.setenv("BATCHLAB_TEST_KEY", key)
        base = ["replay", "--target", server.url, "--protocol", "openai", "--model",
                "qwen2.5-0.5b", *trace]
        assert main([*base, "--api-key-env", "BATCHLAB_TEST_KEY",
                     "--out", str(tmp_path / "keyed")]) == 0
        assert main([*base, "--out", str(tmp_path / "bare")]) == 1
    keyed = json.loads((tmp_path / "keyed" / "summary.json").read_text())
    bare = json.loads((tmp_path / "bare" / "summary.json").read_text())
    assert keyed["num_completed"] == 4 and bare["failures"] == {"http_error": 4}
    for folder in ("keyed", "bare"):
        for path in (tmp_path / folder).rglob("*"):
            if path.is_file():
                assert key.encode() not in path.read_bytes(), path


def test_chat_max_completion_tokens_null_falls_back_to_max_tokens(client: httpx.Client) -> None:
    """vLLM takes max_completion_tokens unless it is null, then max_tokens: a null sent by a
    client that fills every field must not mean "up to max_model_len"."""
    messages = [{"role": "user", "content": "hi"}]
    for limits, expected in (({"max_completion_tokens": None, "max_tokens": 2}, 2),
                             ({"max_completion_tokens": 3, "max_tokens": 2}, 3),
                             ({"max_completion_tokens": None}, 512 - 1)):
        r = client.post("/v1/chat/completions", json={"messages": messages, **limits})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == expected


def _nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


@pytest.mark.parametrize("path, field", [("/v1/completions", "prompt"),
                                         ("/v1/chat/completions", "messages")])
def test_deeply_nested_json_is_a_400_not_a_crash(client: httpx.Client, path: str,
                                                 field: str) -> None:
    """Too deep for the JSON parser (10000 levels), or parsed but deep (600): a 400 in vLLM's
    error body either way, not a plain-text 500 with a RecursionError."""
    for depth in (10_000, 600):
        r = client.post(path, content=f'{{"{field}": {_nested(depth)}}}'.encode(),
                        headers={"content-type": "application/json"})
        assert r.status_code == 400, (depth, r.text[:200])
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert "nested too deeply" in client.post(
        path, content=f'{{"{field}": {_nested(10_000)}}}'.encode()).json()["error"]["message"]
    assert client.get("/health").status_code == 200


@pytest.mark.parametrize("fields, num_tokens", [
    ({"max_tokens": "5"}, 5), ({"max_tokens": 2.0}, 2), ({"max_tokens": " 3 "}, 3),
    ({"max_tokens": True}, 1), ({"max_tokens": 4, "min_tokens": "4", "ignore_eos": "yes"}, 4),
    ({"max_tokens": 2, "priority": "0", "n": "1"}, 2),
])
def test_field_types_are_as_lax_as_vllms(client: httpx.Client, fields: dict[str, Any],
                                         num_tokens: int) -> None:
    """vLLM's pydantic models convert in lax mode: "5", 2.0 and true are integers there."""
    r = client.post("/v1/completions", json={"prompt": [1, 2], **fields})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == num_tokens


@pytest.mark.parametrize("stream", ["true", "True", "on", 1])
def test_stream_flags_are_as_lax_as_vllms(client: httpx.Client, stream: Any) -> None:
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": stream,
        "stream_options": {"include_usage": "false"}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _events(r.text)
    assert events[-1] == "[DONE]" and all("usage" not in json.loads(e) for e in events[:-1])


@pytest.mark.parametrize("fields, param", [
    ({"max_tokens": 2.5}, "max_tokens"), ({"max_tokens": "abc"}, "max_tokens"),
    ({"max_tokens": "2.5"}, "max_tokens"), ({"max_tokens": False}, "max_tokens"),
    ({"max_tokens": [5]}, "max_tokens"), ({"stream": "maybe"}, "stream"),
    ({"stream": 2}, "stream"), ({"ignore_eos": "2"}, "ignore_eos"),
    ({"priority": 1.5}, "priority"), ({"priority": None}, "priority"),
    ({"model": [["qwen2.5-0.5b"]]}, "model"),
    ({"max_tokens": "9" * 5000}, "max_tokens"),  # int() raised: a 500 with a traceback
])
def test_fields_vllm_refuses_are_refused(client: httpx.Client, fields: dict[str, Any],
                                         param: str) -> None:
    r = client.post("/v1/completions", json={"prompt": [1], **fields})
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_chat_text_parts_are_prefix_cached_like_string_contents() -> None:
    """A message whose content is a list of text parts gives the prompt keys of the text it
    holds, in the order it is counted, so prefix caching finds it, and a chat mixing parts and
    strings keeps its keys in line with its counted tokens."""
    config = ReferenceConfig(model="qwen2.5-0.5b", max_model_len=512, prefix_caching=True)
    routes = ReferenceServer(config).openai
    text = "one two three four five six seven eight nine ten eleven twelve thirteen"

    def parsed(*contents: Any) -> Any:
        body = {"messages": [{"role": "user", "content": c} for c in contents],
                "max_tokens": 1}
        req = routes.parse(body, chat=True)
        assert not isinstance(req, ApiError)
        assert len(req.prompt_keys) == req.num_prompt_tokens
        return req.prompt_keys

    as_string = parsed(text)
    assert as_string and parsed([{"type": "text", "text": text}]) == as_string
    assert parsed([{"type": "text", "text": "one two"},
                   {"type": "image_url", "image_url": {"url": "x"}},
                   {"type": "text", "text": text[len("one two "):]}]) == as_string
    mixed = parsed([{"type": "text", "text": "Be brief."}], text)
    assert mixed == parsed("Be brief.", text)
    assert mixed[-len(as_string):] == as_string


def test_a_large_body_is_parsed_off_the_event_loop(server: RunningServer,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt of token ids holds no text, but its JSON and its fields are as much work: a
    large body is parsed on a worker thread, whatever it holds."""
    from harness.serve import bodies

    threads: list[str] = []
    loads, parse = bodies.json_object, server.server.openai.parse

    def json_object(body: bytes) -> Any:
        threads.append(threading.current_thread().name)
        return loads(body)

    def recorded_parse(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return parse(*args, **kwargs)

    monkeypatch.setattr(bodies, "json_object", json_object)
    monkeypatch.setattr(server.server.openai, "parse", recorded_parse)
    with httpx.Client(base_url=server.url, timeout=30, trust_env=False) as c:
        big = c.post("/v1/completions", json={"prompt": list(range(20_000)), "max_tokens": 1})
        assert big.status_code == 400 and "maximum context length" in big.text
        off_loop = list(threads)
        threads.clear()
        small = c.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 1})
        assert small.status_code == 200
    assert len(off_loop) == 2 and "reference-server" not in off_loop
    assert threads == ["reference-server"] * 2


@pytest.mark.parametrize("raw, got", [
    (b"9" * 5000, "a number with more than 4,300 digits"),  # was Python's advice
    (b"9223372036854775808", "9223372036854775808"),  # was a context-length error
    (b'"99999999999999999999999"', "'99999999999999999999999'"),
])
def test_oversized_max_tokens_is_refused_in_the_fields_words(
        client: httpx.Client, raw: bytes, got: str) -> None:
    r = client.post("/v1/completions", content=b'{"prompt": [1], "max_tokens": ' + raw + b"}",
                    headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": f"max_tokens must be a positive integer (at most 2^63 - 1), got {got}",
        "type": "BadRequestError", "param": "max_tokens", "code": 400}
    assert "sys.set_int_max_str_digits" not in r.text


def test_an_oversized_number_where_no_field_reads_it_is_still_refused(
        client: httpx.Client) -> None:
    r = client.post("/v1/completions",
                    content=b'{"prompt": [1], "max_tokens": 2, "user": ' + b"9" * 5000 + b"}",
                    headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "user is a number with more than 4,300 digits, longer than any field takes")
    r = client.post("/v1/completions", json={"prompt": [1], "priority": 2**63})
    assert r.status_code == 400 and r.json()["error"]["message"] == (
        "priority must be an integer from -2^63 to 2^63 - 1, got 9223372036854775808")


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "hi there"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi there"}]}),
])
def test_empty_stream_options_still_sends_the_usage_chunk(client: httpx.Client, path: str,
                                                          body: dict[str, Any]) -> None:
    """vLLM tests `if stream_options:` on its pydantic object, true even for {}: include_usage
    then takes its default, true, and the usage chunk comes before [DONE]."""
    r = client.post(path, json={**body, "max_tokens": 2, "stream": True, "stream_options": {}})
    assert r.status_code == 200
    events = _events(r.text)
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["choices"] == [] and last["usage"] == {"prompt_tokens": 2,
                                                       "completion_tokens": 2,
                                                       "total_tokens": 4}
    assert all("usage" not in json.loads(e) for e in events[:-2])  # no continuous usage


def test_empty_stream_options_without_stream_is_accepted(client: httpx.Client) -> None:
    """vLLM refuses stream options without stream only when they are truthy: {} passes."""
    for path, body in (("/v1/completions", {"prompt": [1]}),
                       ("/v1/chat/completions", {"messages": [{"role": "user",
                                                              "content": "hi"}]})):
        r = client.post(path, json={**body, "max_tokens": 2, "stream_options": {}})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        r = client.post(path, json={**body, "max_tokens": 2,
                                    "stream_options": {"include_usage": False}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"


@pytest.mark.parametrize("path, fields, param, fragment", [
    ("/v1/completions", {"logprobs": 1}, "logprobs", "produces no log probabilities"),
    ("/v1/completions", {"logprobs": 0}, "logprobs", "produces no log probabilities"),
    ("/v1/completions", {"logprobs": "abc"}, "logprobs", "logprobs must be"),
    ("/v1/completions", {"echo": True}, "echo", "does not echo the prompt"),
    ("/v1/completions", {"echo": "yes"}, "echo", "does not echo the prompt"),
    ("/v1/completions", {"prompt_logprobs": 0}, "prompt_logprobs",
     "produces no log probabilities"),
    ("/v1/chat/completions", {"logprobs": True}, "logprobs", "produces no log probabilities"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 5}, "logprobs",
     "produces no log probabilities"),
    ("/v1/chat/completions", {"top_logprobs": 5}, "top_logprobs",
     "`logprobs` must be set to true"),
    ("/v1/chat/completions", {"prompt_logprobs": 1}, "prompt_logprobs",
     "produces no log probabilities"),
])
def test_log_probabilities_and_echo_are_refused(client: httpx.Client, path: str,
                                                fields: dict[str, Any], param: str,
                                                fragment: str) -> None:
    """The reference has no token probabilities and never echoes: a request for either is a
    400 in vLLM's error body (as n != 1 is), never a 200 with "logprobs": null."""
    body: dict[str, Any] = ({"messages": [{"role": "user", "content": "hi"}]}
                            if "chat" in path else {"prompt": "hi"})
    r = client.post(path, json={**body, "max_tokens": 2, **fields})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == param and fragment in error["message"] and error["code"] == 400
    assert set(error) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("path, fields", [
    ("/v1/completions", {"logprobs": None, "echo": False, "prompt_logprobs": None}),
    ("/v1/completions", {"echo": None}),
    ("/v1/chat/completions", {"logprobs": False, "top_logprobs": 0}),
    ("/v1/chat/completions", {"logprobs": None, "top_logprobs": None, "echo": False}),
])
def test_fields_that_ask_for_no_log_probabilities_are_accepted(
        client: httpx.Client, path: str, fields: dict[str, Any]) -> None:
    body: dict[str, Any] = ({"messages": [{"role": "user", "content": "hi"}]}
                            if "chat" in path else {"prompt": "hi"})
    r = client.post(path, json={**body, "max_tokens": 2, **fields})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["logprobs"] is None


def test_completion_max_tokens_null_is_the_rest_of_the_context(client: httpx.Client) -> None:
    """vLLM's default of 16 is pydantic's, for an absent max_tokens; an explicit null is no
    limit: max_model_len minus the prompt (get_max_tokens)."""
    r = client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": None})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 512 - 3
    r = client.post("/v1/completions", json={"prompt": [1, 2, 3]})
    assert r.json()["usage"]["completion_tokens"] == 16
