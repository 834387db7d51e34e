"""The profile's front-end delay in the served engine (``frontend_latency_s``).

A request reaches the scheduler ``frontend_latency_s`` after the server received it, as
``simulate`` delays each arrival, and TTFT is measured from the receipt. The first test steps
the engine by hand on a clock it sets; the others run a server on a thread with a profile file
and assert on the engine's own instants and counters. The one wall-clock figure is a lower
bound: nothing here bounds how long anything takes.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapters.reference.config import ReferenceConfig
from adapters.reference.cost_model import CostModelParams
from harness.serve.app import start_server_in_thread
from harness.serve.loop import EngineObserver, ServedEngine, TokenStream
from harness.sim import simulate
from harness.traces import TraceRequest

PROMPT = 64  # tokens
OUTPUT = 2


class Recorder(EngineObserver):
    """Keeps the streams the engine reports, passing each report on to the server's metrics."""

    def __init__(self, inner: EngineObserver | None) -> None:
        self.inner = inner or EngineObserver()
        self.first_tokens: list[tuple[TokenStream, float]] = []
        self.aborted: list[TokenStream] = []

    def on_step(self, num_tokens: int, num_preemptions: int) -> None:
        self.inner.on_step(num_tokens, num_preemptions)

    def on_first_token(self, stream: TokenStream, at_s: float) -> None:
        self.first_tokens.append((stream, at_s))
        self.inner.on_first_token(stream, at_s)

    def on_tokens(self, num_tokens: int) -> None:
        self.inner.on_tokens(num_tokens)

    def on_finished(self, stream: TokenStream) -> None:
        self.inner.on_finished(stream)

    def on_aborted(self, stream: TokenStream) -> None:
        self.aborted.append(stream)
        self.inner.on_aborted(stream)

    def on_lateness(self, lateness_s: float) -> None:
        self.inner.on_lateness(lateness_s)


def profile_config(tmp_path: Path, frontend_latency_s: float) -> ReferenceConfig:
    path = tmp_path / f"frontend-{frontend_latency_s}.json"
    path.write_text(json.dumps({"frontend_latency_s": frontend_latency_s}))
    return ReferenceConfig(model="qwen2.5-0.5b", max_model_len=512, profile=str(path))


def scrape(url: str) -> dict[str, float]:
    """The unlabelled-by-bucket samples of /metrics, a finish reason kept in the key."""
    values: dict[str, float] = {}
    text = httpx.get(url + "/metrics", trust_env=False).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "le" not in sample.labels:
                reason = sample.labels.get("finished_reason")
                values[sample.name + (f"{{{reason}}}" if reason else "")] = sample.value
    return values


# ---------------------------------------------------------------- stepped by hand


def test_a_request_reaches_the_scheduler_a_front_end_delay_after_it_was_received() -> None:
    now = [0.0]
    engine = ServedEngine(ReferenceConfig(
        model="qwen2.5-0.5b", max_model_len=512,
        cost_params=CostModelParams(frontend_latency_s=0.25)), clock=lambda: now[0])
    stream = engine.submit(PROMPT, OUTPUT, received_s=1.0)
    assert isinstance(stream, TokenStream)
    assert stream.received_s == 1.0 and stream.request.arrival_s == 1.25

    now[0] = 1.2  # received, still in the front end: not queued at the engine, not stepped
    assert engine.step(start_by_s=engine.now_s()) is None
    assert (engine.num_pending, engine.num_waiting, engine.num_admitted) == (1, 0, 0)

    now[0] = 1.3  # past its arrival: the step starts at the arrival, not at the late wake-up
    assert engine.num_waiting == 1
    out = engine.step(start_by_s=engine.now_s())
    assert out is not None and out.start_s == 1.25 and out.token_request_ids == (stream.request_id,)
    assert engine.num_admitted == 1 and engine.num_pending == 0


# ---------------------------------------------------------------- through HTTP


def test_served_ttft_includes_the_profiles_front_end_as_simulate_does(tmp_path: Path) -> None:
    body = {"prompt": [1] * PROMPT, "max_tokens": OUTPUT}
    ttft_by_delay: dict[float, float] = {}
    for delay_s in (0.0, 0.3):
        config = profile_config(tmp_path, delay_s)
        (simulated,) = simulate([TraceRequest("r", 0.0, PROMPT, OUTPUT)], config).timelines
        with start_server_in_thread(config) as running:
            engine = running.server.engine
            recorder = Recorder(engine.observer)
            engine.observer = recorder
            with httpx.Client(base_url=running.url, timeout=30, trust_env=False) as client:
                assert client.get("/version").json()["reference"]["frontend_latency_s"] == delay_s
                sent = time.perf_counter()
                r = client.post("/v1/completions", json=body)
                elapsed_s = time.perf_counter() - sent
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == OUTPUT
            metrics = scrape(running.url)

        ((stream, first_token_s),) = recorder.first_tokens
        request = stream.request
        # The engine's own instants: the request reached the idle engine exactly the delay after
        # the server received it, and its first step started there.
        assert request.arrival_s - stream.received_s == pytest.approx(delay_s, abs=1e-9)
        assert request.first_scheduled_s == request.arrival_s
        # Its TTFT from the receipt is what simulate predicts for the same profile, front end
        # included; so is the one the server publishes in /metrics.
        ttft_s = first_token_s - stream.received_s
        assert ttft_s == pytest.approx(simulated.ttft_s(), rel=1e-9, abs=1e-9)
        assert metrics["vllm:time_to_first_token_seconds_sum"] == pytest.approx(ttft_s)
        assert metrics["vllm:request_queue_time_seconds_sum"] == pytest.approx(0.0, abs=1e-9)
        assert elapsed_s >= delay_s  # the client waited at least the front end (a lower bound)
        ttft_by_delay[delay_s] = ttft_s

    assert ttft_by_delay[0.3] - ttft_by_delay[0.0] == pytest.approx(0.3, abs=1e-9)


@pytest.mark.parametrize("streaming", [True, False], ids=["stream", "no-stream"])
def test_a_request_cancelled_in_the_front_end_never_reaches_the_engine(
        tmp_path: Path, streaming: bool) -> None:
    # A 1 s front end: the client sees its request pending at the engine, then goes away
    # while it is still in the front end. A probe sent afterwards reaches the engine after
    # the cancelled request's arrival would have, so the step loop has passed that instant.
    config = profile_config(tmp_path, 1.0)
    body = {"prompt": [1] * PROMPT, "max_tokens": OUTPUT}

    async def until(condition: Callable[[], bool], what: str) -> None:
        for _ in range(6000):  # a wait for the server (up to a minute), not a bound
            if condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"the server never {what}")

    async def scenario(url: str, engine: ServedEngine, recorder: Recorder) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30, trust_env=False) as client:
            async def pending() -> None:  # the server has the request (in the front end or not)
                await until(lambda: engine.num_pending + engine.num_admitted > 0, "got it")

            if streaming:
                async with client.stream("POST", "/v1/completions",
                                         json={**body, "stream": True}) as r:
                    assert r.status_code == 200
                    await pending()
                # leaving the block closes the connection mid-stream
            else:
                task = asyncio.create_task(client.post("/v1/completions", json=body))
                await pending()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            await until(lambda: bool(recorder.aborted) or engine.num_admitted > 0,
                        "aborted or admitted it")
            assert (engine.num_pending, engine.num_admitted, engine.num_steps) == (0, 0, 0)

            probe = await client.post("/v1/completions", json=body)
            assert probe.status_code == 200

    with start_server_in_thread(config) as running:
        engine = running.server.engine
        recorder = Recorder(engine.observer)
        engine.observer = recorder
        asyncio.run(scenario(running.url, engine, recorder))
        metrics = scrape(running.url)
        ((cancelled,), ((probe, _),)) = recorder.aborted, recorder.first_tokens

    assert cancelled.num_tokens == 0 and cancelled.request.first_scheduled_s is None
    assert probe.request.first_scheduled_s is not None
    assert probe.request.first_scheduled_s > cancelled.request.arrival_s
    # Only the probe was ever admitted, prefilled and stepped.
    assert engine.num_admitted == 1 and engine.num_steps == OUTPUT
    assert metrics["vllm:prompt_tokens_total"] == PROMPT
    assert metrics["vllm:request_success_total{abort}"] == 1
    assert metrics["vllm:request_success_total{length}"] == 1
