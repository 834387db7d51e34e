"""Telemetry under a review's findings: the baseline read before t0 (and TensorRT-LLM's queue
drained there), counter increases per series, one bad line not failing a scrape, counters
typed without ``_total``, and non-finite values as missing."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq

from adapters import openai, vllm
from harness.live.config import ReplayConfig
from harness.live.early_stop import watch_early_stop
from harness.live.replay import replay
from harness.live.telemetry import (
    CanonicalReader,
    PrometheusSource,
    TelemetryScraper,
    TrtllmJsonSource,
    engine_preemptions,
    parse_exposition,
    parse_lines,
)
from harness.live.wire import MemoryWire, Reply
from harness.target import LoadState
from harness.traces import Trace, TraceRequest

# ---------------------------------------------------------------- a replay over a memory wire


def _reply(req: TraceRequest, body: bytes) -> Reply:
    event = {"id": "c", "object": "text_completion", "model": "m",
             "choices": [{"index": 0, "text": "t", "finish_reason": "length"}],
             "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9}}
    return [(0.0, b"data: " + json.dumps(event).encode() + b"\n\n"), (0.0, b"data: [DONE]\n\n")]


def _replay(tmp_path: Path, wire: MemoryWire, scraper: TelemetryScraper,
            on_t0: Any = None, num_requests: int = 3) -> None:
    reqs = tuple(TraceRequest(f"r{i}", i * 0.01, 8, 1) for i in range(num_requests))
    trace = Trace(source="memory", format="synthetic", digest="0" * 64, requests=reqs)
    config = ReplayConfig(target_url="http://memory", protocol="openai", model="m")
    asyncio.run(replay(trace, config, tmp_path, wire=wire, telemetry=scraper, on_t0=on_t0))


def _steps_text(num_steps: int) -> str:
    return ("# TYPE vllm:iteration_tokens_total histogram\n"
            f'vllm:iteration_tokens_total_count{{engine="0"}} {num_steps}\n'
            f'vllm:iteration_tokens_total_sum{{engine="0"}} {num_steps * 100}\n')


def test_the_baseline_is_read_before_t0_and_the_first_request_is_counted(
        tmp_path: Path) -> None:
    """The engine counted 5 steps before the run and one per request in it. The baseline is
    read before t0, so a scrape that takes a while cannot see the first request and take its
    step for the engine's past (a served run once counted 949 of 950 steps)."""
    wire = MemoryWire(_reply)
    events: list[tuple[str, int]] = []

    async def fetch() -> str:
        events.append(("read", len(wire.sent)))
        await asyncio.sleep(0.02)  # a scrape's round trip: the sends go on meanwhile
        return _steps_text(5 + len(wire.sent))

    scraper = TelemetryScraper(PrometheusSource(vllm.TELEMETRY, fetch=fetch),
                               tmp_path / "telemetry.parquet", interval_s=0.01)
    _replay(tmp_path, wire, scraper, on_t0=lambda t0_ns: events.append(("t0", 0)))
    assert events[:2] == [("read", 0), ("t0", 0)]
    rows = pq.read_table(tmp_path / "telemetry.parquet").to_pylist()
    assert sum(r["num_steps"] or 0 for r in rows) == 3
    assert sum(r["num_batched_tokens"] or 0 for r in rows) == 300


def _iteration(paused: int) -> dict[str, Any]:
    return {"numActiveRequests": 4, "numQueuedRequests": 0,
            "kvCacheStats": {"maxNumBlocks": 100, "usedNumBlocks": 50},
            "inflightBatchingStats": {"numPausedRequests": paused, "numCtxTokens": 8,
                                      "numGenRequests": 1}}


def test_trtllm_iterations_queued_before_the_run_are_drained_not_counted(
        tmp_path: Path) -> None:
    """TensorRT-LLM's JSON /metrics drains its queue on each read: the 400 iterations (40
    pauses) of what ran before this run are read, and discarded, before t0."""
    reads: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        reads.append(1)
        stale = [_iteration(1 if i % 10 == 0 else 0) for i in range(400)]
        return httpx.Response(200, json=stale if len(reads) == 1 else [_iteration(0)])

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    source = TrtllmJsonSource("http://engine/metrics", client=client)
    scraper = TelemetryScraper(source, tmp_path / "telemetry.parquet", interval_s=0.01)
    _replay(tmp_path, MemoryWire(_reply), scraper)
    rows = pq.read_table(tmp_path / "telemetry.parquet").to_pylist()
    assert all(r["num_steps"] == 1 for r in rows)
    assert engine_preemptions(tmp_path) == 0


# ---------------------------------------------------------------- counters per series


def _preemptions(*values: float | None) -> str:
    lines = ["# TYPE vllm:num_preemptions counter"]
    lines += [f'vllm:num_preemptions_total{{engine="{e}",model_name="m"}} {v}'
              for e, v in enumerate(values) if v is not None]
    return "\n".join(lines) + "\n"


def _increases(texts: Sequence[str]) -> list[float | None]:
    reader = CanonicalReader(vllm.TELEMETRY)
    return [reader.reading(parse_exposition(t)).values["num_preemptions"] for t in texts]


def test_a_data_parallel_engine_that_restarts_counts_from_its_new_value() -> None:
    # engine 0: +2 +2; engine 1: +5, then restarted and counted 1
    assert _increases([_preemptions(100, 50), _preemptions(102, 55),
                       _preemptions(104, 1)]) == [0, 7, 3]


def test_a_series_that_disappears_adds_nothing() -> None:
    assert _increases([_preemptions(100, 50), _preemptions(102, 55),
                       _preemptions(104, None)]) == [0, 7, 2]


def test_a_series_that_appears_mid_run_counts_from_zero() -> None:
    assert _increases([_preemptions(100), _preemptions(101, 3)]) == [0, 4]


def test_histogram_increases_are_per_series() -> None:
    def text(*pairs: tuple[int, int]) -> str:
        return "# TYPE vllm:iteration_tokens_total histogram\n" + "".join(
            f'vllm:iteration_tokens_total_count{{engine="{e}"}} {c}\n'
            f'vllm:iteration_tokens_total_sum{{engine="{e}"}} {s}\n'
            for e, (c, s) in enumerate(pairs))

    reader = CanonicalReader(vllm.TELEMETRY)
    for scrape in (text((1000, 64000), (500, 32000)), text((1010, 64640), (510, 32640))):
        reader.reading(parse_exposition(scrape))
    last = reader.reading(parse_exposition(text((1020, 65280), (2, 100)))).values
    assert last["num_steps"] == 12 and last["num_batched_tokens"] == 740


# ---------------------------------------------------------------- parsing


RUNNING = ('# TYPE vllm:num_requests_running gauge\n'
           'vllm:num_requests_running{engine="0"} 3\n'
           '# TYPE vllm:num_requests_waiting gauge\n'
           'vllm:num_requests_waiting{engine="0"} 1\n')


def test_one_malformed_line_costs_that_line_not_the_scrape() -> None:
    for bad in ('other{bad-label="x"} 1\n', 'other{a="x",a="y"} 1\n', "other 1_000\n"):
        text = RUNNING + bad + _preemptions(4)

        async def fetch(text: str = text) -> str:
            return text

        source = PrometheusSource(vllm.TELEMETRY, fetch=fetch)
        reading = asyncio.run(source.read())
        assert reading.error is None, bad
        assert reading.values["num_running"] == 3 and reading.values["num_waiting"] == 1
        assert reading.values["num_preemptions"] == 0  # read, as the baseline
        assert source.num_skipped_lines == 1
    assert parse_lines(RUNNING).num_skipped_lines == 0


def test_a_counter_typed_without_total_is_found_by_its_name() -> None:
    """prometheus_client's parser names the sample of ``# TYPE my_preemptions counter``
    ``my_preemptions_total``; the map names the metric as the server does."""
    spec = openai.metric_spec({"num_preemptions": "my_preemptions"})
    reader = CanonicalReader(spec)
    first = reader.reading(parse_exposition("# TYPE my_preemptions counter\nmy_preemptions 7\n"))
    second = reader.reading(parse_exposition("# TYPE my_preemptions counter\nmy_preemptions 9\n"))
    assert first.values["num_preemptions"] == 0 and second.values["num_preemptions"] == 2
    # and a map that names it with _total finds an untyped line without it
    spec = openai.metric_spec({"num_preemptions": "my_preemptions_total"})
    reading = CanonicalReader(spec).reading(parse_exposition("my_preemptions 7\n"))
    assert "num_preemptions" not in reading.missing


# ---------------------------------------------------------------- non-finite values


def test_non_finite_gauges_are_missing() -> None:
    for value in ("NaN", "+Inf", "-Inf"):
        text = RUNNING.replace("} 3", f"}} {value}") + (
            f'# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{engine="0"}} '
            f"{value}\n")
        reading = CanonicalReader(vllm.TELEMETRY).reading(parse_exposition(text))
        assert reading.values["num_running"] is None and "num_running" in reading.missing
        assert reading.values["kv_usage"] is None and "kv_usage" in reading.missing
        assert reading.values["num_waiting"] == 1


class _Run:
    stop_reason: str | None = None
    num_sent = 1
    timelines: Sequence[Any] = ()
    last_send_lag_s: float | None = None

    def s(self, t_ns: int) -> float:
        return 0.0


class _Rows:
    def __init__(self) -> None:
        self.rows = [{"num_waiting": math.inf}]


def test_early_stop_reads_an_infinite_waiting_queue_as_not_known() -> None:
    seen: list[LoadState] = []

    def check(state: LoadState) -> str | None:
        seen.append(state)
        return "enough"

    async def go() -> _Run:
        run = _Run()
        load = asyncio.create_task(asyncio.sleep(60))
        await watch_early_stop(run, check, _Rows(), load)
        assert load.cancel() or load.cancelled()
        return run

    run = asyncio.run(go())
    assert run.stop_reason == "enough" and seen[0].num_waiting is None
