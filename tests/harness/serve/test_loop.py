"""The served engine's step loop (``harness.serve.loop``).

The first tests drive ``ServedEngine`` by hand (no clock, no HTTP) and require the exact token
instants ``simulate`` computes. The last two run a server on a thread: priority ordering of the
waiting queue, and what a crashed step loop does to requests and health. None asserts a duration.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from adapters.knobs import Knobs
from adapters.reference.config import ReferenceConfig
from adapters.reference.cost_model import CostModelParams
from harness.live.protocols import parse_stream
from harness.serve.app import start_server_in_thread
from harness.serve.loop import Rejection, ServedEngine, TokenStream
from harness.sim import simulate
from harness.traces import TraceOptions, TraceRequest, load_trace

TRACE = "harness/data/azure_conv_excerpt.csv"
SMALL = ReferenceConfig(model="qwen2.5-0.5b", max_model_len=512)


def _run_served(config: ReferenceConfig, requests: list[TraceRequest]
                ) -> tuple[ServedEngine, list[TokenStream]]:
    engine = ServedEngine(config, clock=lambda: 0.0)
    streams = []
    for r in requests:  # every arrival known up front: pending holds the future ones
        s = engine.submit(r.num_prompt_tokens, r.num_output_tokens, priority=r.priority or 0,
                          request_id=r.request_id, received_s=r.arrival_s)
        assert isinstance(s, TokenStream)
        streams.append(s)
    while (out := engine.step()) is not None:
        engine.deliver(out)
        if engine.num_steps % 20 == 0:  # (a full check walks every KV block)
            engine.core.check_invariants()
    engine.core.check_invariants()
    return engine, streams


@pytest.mark.parametrize("settings", [
    {"model": "llama-3.1-70b", "gpu": "a100-80gb", "tp": 4},
    # few KV blocks and a small token budget: chunked prefill and many preemptions
    {"model": "llama-3.1-8b", "num_gpu_blocks": 200, "max_num_seqs": 8,
     "max_num_batched_tokens": 512},
    {"model": "llama-3.1-8b", "policy": "priority", "num_gpu_blocks": 150},
    {"model": "llama-3.1-8b", "preemption": "none", "num_gpu_blocks": 300},
    # a front end: every request reaches the scheduler 50 ms after it was received
    {"model": "llama-3.1-8b", "num_gpu_blocks": 300,
     "cost_params": CostModelParams(frontend_latency_s=0.05)},
], ids=["fcfs", "preempting", "priority", "reserve", "frontend"])
def test_served_step_loop_gives_the_instants_simulate_gives(settings: dict[str, Any]) -> None:
    config = ReferenceConfig(**settings)
    trace = load_trace(TRACE, TraceOptions(limit=60, rate=4, max_model_len=2048,
                                           on_too_long="drop", priority_fraction=0.3))
    sim = simulate(trace.requests, config)  # with its decode-span shortcut
    engine, streams = _run_served(config, list(trace.requests))
    for s, tl in zip(streams, sim.timelines, strict=True):
        assert s.done and s.error is None
        assert tuple(engine.core.scheduler.token_times_s(s.request)) == tl.chunk_times_s
        assert s.request.finished_s == tl.finished_s
        assert s.request.num_preemptions == tl.num_preemptions
        assert s.num_tokens == tl.num_output_tokens


def test_idle_engine_starts_its_next_step_at_the_arrival() -> None:
    engine = ServedEngine(ReferenceConfig(model="llama-3.1-8b"), clock=lambda: 0.0)
    assert engine.step() is None
    s = engine.submit(100, 2, received_s=5.0)
    assert isinstance(s, TokenStream)
    out = engine.step()
    assert out is not None and out.start_s == 5.0 and out.token_request_ids == (s.request_id,)
    engine.deliver(out)
    assert s.num_tokens == 1 and not s.done
    out = engine.step()
    assert out is not None and out.start_s == engine.core.scheduler.token_times_s(s.request)[0]
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


# ---------------------------------------------------------------- through HTTP


async def _first_token(client: httpx.AsyncClient, body: dict[str, Any],
                       started: asyncio.Event) -> None:
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                started.set()


def _events(body: str) -> list[str]:
    """The data payloads of an SSE body."""
    return [block.split(":", 1)[1].strip() for block in body.split("\n\n") if block.strip()]


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



def _trtllm_16k() -> ReferenceConfig:
    return ReferenceConfig.from_knobs(Knobs.from_mapping({"max_model_len": 16384}),
                                      model="llama-3.1-8b", gpu=None, profile="trtllm-h100-sxm")


def _no_chunking_recompute() -> ReferenceConfig:
    return ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm", chunked_prefill=False,
                           max_num_batched_tokens=8192, max_model_len=16384,
                           oversized_prompts="reject")


@pytest.mark.parametrize(("make", "prompt", "output"), [
    (_trtllm_16k, 9000, 3),  # the prompt alone is over the step budget
    (_no_chunking_recompute, 8000, 400),  # a late preemption would re-prefill both
])
def test_the_served_engine_refuses_at_once_what_simulate_rejects(
        make: Any, prompt: int, output: int) -> None:
    """Chunked prefill off: a request that can never run is refused when it arrives (HTTP
    400 from the handlers), in the words simulate rejects it with, not failed later."""
    config = make()
    answer = ServedEngine(config, clock=lambda: 0.0).submit(prompt, output)
    assert isinstance(answer, Rejection)
    result = simulate([TraceRequest("r", 0.0, prompt, output)], config)
    assert result.timelines[0].error_kind == "rejected"
    assert answer.message in result.timelines[0].error_message
