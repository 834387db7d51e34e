"""The served reference engine: its step loop against ``simulate``, and vLLM's OpenAI routes.

The step-loop tests drive ``ServedEngine`` by hand (no clock, no HTTP) and require the exact
token instants ``simulate`` computes. The HTTP tests run a server on a thread; none of them
asserts a duration.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapters.reference.config import ReferenceConfig
from adapters.reference.engine import simulate
from adapters.reference.server import (
    OUTPUT_WORDS,
    PromptCounter,
    Rejection,
    RunningServer,
    ServedEngine,
    ServerOptions,
    TokenStream,
    output_text,
    start_server_in_thread,
)
from harness.protocols import parse_stream
from harness.traces import TraceOptions, TraceRequest, load_trace

TRACE = "harness/data/azure_conv_excerpt.csv"

# ---------------------------------------------------------------- the step loop vs simulate


def _run_served(config: ReferenceConfig, requests: list[TraceRequest]) -> list[TokenStream]:
    engine = ServedEngine(config, clock=lambda: 0.0)
    streams = []
    for r in requests:  # every arrival known up front: pending holds the future ones
        s = engine.submit(r.num_prompt_tokens, r.num_output_tokens, priority=r.priority or 0,
                          request_id=r.request_id, arrival_s=r.arrival_s)
        assert isinstance(s, TokenStream)
        streams.append(s)
    while (out := engine.step()) is not None:
        engine.deliver(out)
        if engine.num_steps % 20 == 0:  # (a full check walks every KV block)
            engine.core.check_invariants()
    engine.core.check_invariants()
    return streams


@pytest.mark.parametrize("settings", [
    {"model": "llama-3.1-70b", "gpu": "a100-80gb", "tp": 4},
    # few KV blocks and a small token budget: chunked prefill and many preemptions
    {"model": "llama-3.1-8b", "num_gpu_blocks": 200, "max_num_seqs": 8,
     "max_num_batched_tokens": 512},
    {"model": "llama-3.1-8b", "policy": "priority", "num_gpu_blocks": 150},
    {"model": "llama-3.1-8b", "preemption": "none", "num_gpu_blocks": 300},
], ids=["fcfs", "preempting", "priority", "reserve"])
def test_served_step_loop_gives_the_instants_simulate_gives(settings: dict[str, Any]) -> None:
    config = ReferenceConfig(**settings)
    trace = load_trace(TRACE, TraceOptions(limit=60, rate=4, max_model_len=2048,
                                           on_too_long="drop", priority_fraction=0.3))
    sim = simulate(trace.requests, config)  # with its decode-span shortcut
    streams = _run_served(config, list(trace.requests))
    for s, tl in zip(streams, sim.timelines, strict=True):
        assert s.done and s.error is None
        assert tuple(s.request.token_times_s) == tl.chunk_times_s
        assert s.request.finished_s == tl.finished_s
        assert s.request.num_preemptions == tl.num_preemptions
        assert s.num_tokens == tl.num_output_tokens


def test_idle_engine_starts_its_next_step_at_the_arrival() -> None:
    engine = ServedEngine(ReferenceConfig(model="llama-3.1-8b"), clock=lambda: 0.0)
    assert engine.step() is None
    s = engine.submit(100, 2, arrival_s=5.0)
    assert isinstance(s, TokenStream)
    out = engine.step()
    assert out is not None and out.start_s == 5.0 and out.token_request_ids == (s.request_id,)
    engine.deliver(out)
    assert s.num_tokens == 1 and not s.done
    out = engine.step()
    assert out is not None and out.start_s == s.request.token_times_s[0]
    engine.deliver(out)
    assert s.done and s.num_tokens == 2
    assert engine.step() is None


def test_a_request_that_can_never_run_is_a_rejection_value() -> None:
    engine = ServedEngine(ReferenceConfig(model="llama-3.1-8b", max_model_len=1024,
                                          num_gpu_blocks=8), clock=lambda: 0.0)
    too_long = engine.submit(1000, 100)
    assert isinstance(too_long, Rejection) and "max_model_len (1024)" in too_long.message
    too_big = engine.submit(8 * 16, 1)  # 128 tokens of KV: 8 blocks, fits exactly
    assert isinstance(too_big, TokenStream)
    never = engine.submit(8 * 16 + 1, 1)
    assert isinstance(never, Rejection) and "KV blocks" in never.message
    assert engine.num_pending == 1


def test_prompt_counter_counts_words_and_punctuation() -> None:
    counter = PromptCounter()
    assert counter.count("Hello, world!") == 4
    assert counter.count("".join(OUTPUT_WORDS * 3)) == 3 * len(OUTPUT_WORDS)
    assert counter.count("   ") == 0


# ---------------------------------------------------------------- HTTP: OpenAI routes

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
    assert client.get("/version").json()["engine"] == "batchlab-reference"
    info = client.get("/info").json()
    assert info["model_id"] == "qwen2.5-0.5b" and info["max_total_tokens"] == 512
    assert info["reference"]["model"] == "qwen2.5-0.5b"


def test_served_model_name() -> None:
    options = ServerOptions(port=0, served_model_name="my-model")
    with start_server_in_thread(SMALL, options) as running:
        ok = httpx.post(running.url + "/v1/completions",
                        json={"model": "my-model", "prompt": [1], "max_tokens": 1})
        wrong = httpx.post(running.url + "/v1/completions",
                           json={"model": "qwen2.5-0.5b", "prompt": [1], "max_tokens": 1})
    assert ok.status_code == 200 and ok.json()["model"] == "my-model"
    assert wrong.status_code == 404


# ---------------------------------------------------------------- priority and metrics


async def _first_token(client: httpx.AsyncClient, body: dict[str, Any],
                       started: asyncio.Event) -> None:
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                started.set()


def test_priority_orders_the_waiting_queue() -> None:
    # One running slot. While a long request runs, a priority-5 and then a priority-0 request
    # queue up; the priority-0 one is admitted first. (The long request needs 400 steps,
    # over 2 s; the other two are queued long before it ends.)
    config = ReferenceConfig(model="llama-3.1-8b", policy="priority", max_num_seqs=1,
                             max_num_batched_tokens=2048, max_model_len=4096)

    async def scenario(url: str) -> list[int]:
        done: list[int] = []
        async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as client:
            started = asyncio.Event()
            long = asyncio.create_task(_first_token(
                client, {"prompt": [1] * 10, "max_tokens": 400, "priority": 0}, started))
            await started.wait()

            async def one(priority: int) -> None:
                r = await client.post("/v1/completions", json={
                    "prompt": [1] * 10, "max_tokens": 5, "priority": priority})
                assert r.status_code == 200
                done.append(priority)

            low = asyncio.create_task(one(5))
            await asyncio.sleep(0.05)
            high = asyncio.create_task(one(0))
            await asyncio.gather(long, low, high)
        return done

    with start_server_in_thread(config) as running:
        assert asyncio.run(scenario(running.url)) == [0, 5]


def _scrape(url: str, model: str = "llama-3.1-8b") -> dict[str, float]:
    text = httpx.get(url + "/metrics", trust_env=False).text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name
            if sample.labels.get("finished_reason"):
                key += "{" + sample.labels["finished_reason"] + "}"
            if "le" not in sample.labels:
                values[key] = sample.value
            if family.name.startswith("vllm:"):
                assert sample.labels.get("engine") == "0"
                assert sample.labels.get("model_name") == model
    return values


def test_metrics_during_load() -> None:
    # Two running slots, four long requests: two run and two wait for thousands of steps.
    config = ReferenceConfig(model="llama-3.1-8b", max_num_seqs=2, max_num_batched_tokens=2048,
                             max_model_len=4096)

    async def scenario(url: str) -> dict[str, float]:
        async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as client:
            tasks = [asyncio.create_task(_first_token(
                client, {"prompt": [1] * 50, "max_tokens": 3000}, asyncio.Event()))
                for _ in range(4)]
            try:
                for _ in range(2000):  # until all four are in (a wait, not a bound)
                    values = await asyncio.to_thread(_scrape, url)
                    if (values["vllm:num_requests_running"],
                            values["vllm:num_requests_waiting"]) == (2, 2):
                        return values
                    await asyncio.sleep(0.01)
                raise AssertionError(f"the requests never all arrived: {values}")
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    with start_server_in_thread(config) as running:
        during = asyncio.run(scenario(running.url))
    assert during["vllm:num_requests_running"] == 2 == during["tgi_batch_current_size"]
    assert during["vllm:num_requests_waiting"] == 2 == during["tgi_queue_size"]
    assert 0 < during["vllm:kv_cache_usage_perc"] < 1
    assert 0 < during["tgi_batch_current_max_tokens"] < during["tgi_batch_max_total_tokens"]
    assert during["vllm:iteration_tokens_total_count"] > 0


def test_metrics_after_load() -> None:
    config = ReferenceConfig(model="qwen2.5-0.5b", max_num_seqs=2, max_model_len=512)

    async def scenario(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as client:
            rs = await asyncio.gather(*(client.post("/v1/completions", json={
                "prompt": [1] * 50, "max_tokens": 20}) for _ in range(4)))
        assert all(r.status_code == 200 for r in rs)

    with start_server_in_thread(config) as running:
        asyncio.run(scenario(running.url))
        after = _scrape(running.url, model="qwen2.5-0.5b")
    assert after["vllm:num_requests_running"] == 0 == after["vllm:num_requests_waiting"]
    assert after["vllm:kv_cache_usage_perc"] == 0
    assert after["vllm:prompt_tokens_total"] == 4 * 50
    assert after["vllm:generation_tokens_total"] == 4 * 20
    assert after["vllm:request_success_total{length}"] == 4
    assert after["vllm:num_preemptions_total"] == 0
    # Each request computes prompt + output - 1 tokens (the last sample is not fed back),
    # whatever steps they shared.
    assert after["vllm:iteration_tokens_total_sum"] == 4 * (50 + 20 - 1)
    assert after["vllm:time_to_first_token_seconds_count"] == 4
    assert after["vllm:e2e_request_latency_seconds_count"] == 4


def test_preemptions_are_counted() -> None:
    # 6 KV blocks of 16 tokens; each request needs 5 alone: running two at once must preempt.
    config = ReferenceConfig(model="qwen2.5-0.5b", num_gpu_blocks=6, max_model_len=512)

    async def scenario(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as client:
            rs = await asyncio.gather(*(client.post("/v1/completions", json={
                "prompt": [1] * 30, "max_tokens": 50}) for _ in range(3)))
        assert all(r.json()["usage"]["completion_tokens"] == 50 for r in rs)

    with start_server_in_thread(config) as running:
        asyncio.run(scenario(running.url))
        after = _scrape(running.url, model="qwen2.5-0.5b")
    assert after["vllm:num_preemptions_total"] > 0
    assert after["vllm:generation_tokens_total"] == 150


def test_a_crashed_step_loop_fails_requests_and_reports_unhealthy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with start_server_in_thread(SMALL) as running:
        def broken_step(start_s: float) -> None:
            raise RuntimeError("boom")

        monkeypatch.setattr(running.server.engine.core, "step", broken_step)
        with httpx.Client(base_url=running.url, timeout=30, trust_env=False) as client:
            r = client.post("/v1/completions", json={"prompt": [1], "max_tokens": 3,
                                                     "stream": True})
            events = _events(r.text)
            assert "boom" in json.loads(events[0])["error"]["message"] and events[-1] == "[DONE]"
            assert parse_stream("openai", [r.content]).error_kind == "stream_error"
            assert client.get("/health").status_code == 503
            after = client.post("/v1/completions", json={"prompt": [1], "max_tokens": 3})
            assert after.status_code == 500 and "boom" in after.json()["error"]["message"]
