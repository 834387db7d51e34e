"""A client that disconnects from ``batchlab serve reference`` aborts its request, as vLLM and
TGI do: its KV blocks are freed, ``/metrics`` counts it as aborted, and nothing is logged."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapters.reference.config import ReferenceConfig
from harness.serve.app import RunningServer, start_server_in_thread

# A long output (10,000 tokens at a few ms a step): it cannot finish during the test by itself.
CONFIG = ReferenceConfig(model="qwen2.5-0.5b", max_model_len=16384)
OPENAI = ("/v1/completions", {"prompt": [1] * 50, "max_tokens": 10_000, "stream": True})
CHAT = ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello there"}],
                                 "max_tokens": 10_000, "stream": True})
TGI = ("/generate_stream", {"inputs": "hello there", "parameters": {"max_new_tokens": 10_000}})
NOT_STREAMED = ("/v1/completions", {"prompt": [1] * 50, "max_tokens": 10_000})


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def server() -> Iterator[tuple[RunningServer, Collect]]:
    """A server on a thread, with everything uvicorn, Starlette and asyncio log collected."""
    collect = Collect()
    with start_server_in_thread(CONFIG) as running:
        loggers = [logging.getLogger(n) for n in ("", "uvicorn", "uvicorn.error", "asyncio")]
        for logger in loggers:
            logger.addHandler(collect)
        try:
            yield running, collect
        finally:
            for logger in loggers:
                logger.removeHandler(collect)


def scrape(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", trust_env=False).text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            reason = sample.labels.get("finished_reason")
            values[sample.name + (f"{{{reason}}}" if reason else "")] = sample.value
    return values


def wait_for(url: str, done: object, what: str) -> dict[str, float]:
    """Poll /metrics until ``done(values)``: a bounded wait, not a timing assertion."""
    for _ in range(1000):
        values = scrape(url)
        if done(values):  # type: ignore[operator]
            return values
        time.sleep(0.01)
    raise AssertionError(f"never saw {what}: {values}")


def open_request(url: str, path: str, body: dict[str, object]) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port))
    data = json.dumps(body).encode()
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def read_one_event(sock: socket.socket) -> bytes:
    """Read until the first ``data:`` event is complete; what was read."""
    received = b""
    while b"\n\n" not in received.partition(b"data:")[2]:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the stream early: {received!r}"
        received += chunk
    return received


def assert_nothing_logged(collect: Collect, capfd: pytest.CaptureFixture[str]) -> None:
    problems = [r.getMessage() for r in collect.records if r.levelno >= logging.WARNING]
    assert problems == []
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "Exception in ASGI" not in out + err


@pytest.mark.parametrize(("path", "body"), [OPENAI, CHAT, TGI], ids=["completions", "chat", "tgi"])
def test_a_stream_whose_client_disconnects_is_aborted(
    server: tuple[RunningServer, Collect], capfd: pytest.CaptureFixture[str],
    path: str, body: dict[str, object],
) -> None:
    running, collect = server
    sock = open_request(running.url, path, body)
    assert b" 200 OK" in read_one_event(sock)
    during = scrape(running.url)
    assert during["vllm:num_requests_running"] == 1 and during["vllm:kv_cache_usage_perc"] > 0
    assert during["vllm:request_success_total{abort}"] == 0
    sock.close()

    after = wait_for(running.url, lambda v: v["vllm:request_success_total{abort}"] == 1,
                     "the abort counted")
    after = wait_for(running.url, lambda v: v["vllm:num_requests_running"] == 0, "it leave")
    assert after["vllm:kv_cache_usage_perc"] == 0  # its blocks are free
    assert after["vllm:request_success_total{length}"] == 0
    assert running.server.engine.core.blocks.num_used_blocks == 0
    assert_nothing_logged(collect, capfd)


def test_a_request_whose_client_disconnects_before_the_answer_is_aborted(
    server: tuple[RunningServer, Collect], capfd: pytest.CaptureFixture[str],
) -> None:
    running, collect = server
    sock = open_request(running.url, *NOT_STREAMED)
    wait_for(running.url, lambda v: v["vllm:num_requests_running"] == 1, "it run")
    sock.close()
    after = wait_for(running.url, lambda v: v["vllm:request_success_total{abort}"] == 1,
                     "the abort counted")
    after = wait_for(running.url, lambda v: v["vllm:kv_cache_usage_perc"] == 0, "KV freed")
    assert after["vllm:num_requests_running"] == 0
    assert_nothing_logged(collect, capfd)


def test_many_streams_disconnecting_at_once_are_all_aborted(
    server: tuple[RunningServer, Collect], capfd: pytest.CaptureFixture[str],
) -> None:
    # 50 streams keep the step loop behind the wall clock, the case where Starlette's own
    # cancellation of a streaming response never lands: the abort must not depend on it.
    running, collect = server
    socks = [open_request(running.url, *OPENAI) for _ in range(50)]
    for sock in socks:
        read_one_event(sock)
    for sock in socks:
        sock.close()
    wait_for(running.url, lambda v: v["vllm:request_success_total{abort}"] == 50,
             "all 50 aborts")
    after = wait_for(running.url, lambda v: v["vllm:kv_cache_usage_perc"] == 0, "KV freed")
    assert after["vllm:num_requests_running"] == after["vllm:num_requests_waiting"] == 0
    assert_nothing_logged(collect, capfd)
