"""The served engine's Prometheus metrics (``harness.serve.metrics``): vLLM's and TGI's names,
scraped from a server running on a thread while it works and after."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from adapters.reference.config import ReferenceConfig
from harness.serve.app import start_server_in_thread


async def _first_token(client: httpx.AsyncClient, body: dict[str, Any],
                       started: asyncio.Event) -> None:
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                started.set()


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
