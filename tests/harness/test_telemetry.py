"""Telemetry: canonical names, aliases, counter increases, missing is None, the scraper loop."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from adapters import tgi, trtllm, vllm
from adapters.base import CANONICAL_SIGNALS, MetricSource, TelemetrySpec
from harness.live.telemetry import (
    COLUMNS,
    CanonicalReader,
    FakeSource,
    NoTelemetry,
    PrometheusSource,
    Reading,
    TelemetryScraper,
    parse_exposition,
    source_for,
    trtllm_iterations_reading,
)


def vllm_text(*, running: float = 0, waiting: float = 0, kv: float = 0.0,
              preemptions: float = 0, steps: float = 0, tokens: float = 0,
              kv_name: str = "vllm:kv_cache_usage_perc", engines: int = 1,
              queries: float = 0, hits: float = 0) -> str:
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        *(f'vllm:num_requests_running{{engine="{e}",model_name="tiny"}} {running}'
          for e in range(engines)),
        "# TYPE vllm:num_requests_waiting gauge",
        *(f'vllm:num_requests_waiting{{engine="{e}",model_name="tiny"}} {waiting}'
          for e in range(engines)),
        f"# TYPE {kv_name} gauge",
        *(f'{kv_name}{{engine="{e}",model_name="tiny"}} {kv}' for e in range(engines)),
        "# TYPE vllm:num_preemptions counter",
        f'vllm:num_preemptions_total{{engine="0",model_name="tiny"}} {preemptions}',
        'vllm:num_preemptions_created{engine="0",model_name="tiny"} 1.7e9',
        "# TYPE vllm:iteration_tokens_total histogram",
        f'vllm:iteration_tokens_total_bucket{{engine="0",le="+Inf",model_name="tiny"}} {steps}',
        f'vllm:iteration_tokens_total_count{{engine="0",model_name="tiny"}} {steps}',
        f'vllm:iteration_tokens_total_sum{{engine="0",model_name="tiny"}} {tokens}',
        "# TYPE vllm:prefix_cache_queries counter",
        f'vllm:prefix_cache_queries_total{{engine="0",model_name="tiny"}} {queries}',
        "# TYPE vllm:prefix_cache_hits counter",
        f'vllm:prefix_cache_hits_total{{engine="0",model_name="tiny"}} {hits}',
        "",
    ]
    return "\n".join(lines)


def test_parse_keeps_sample_names_and_drops_created() -> None:
    samples = parse_exposition(vllm_text(running=2, preemptions=3))
    assert samples["vllm:num_requests_running"] == [2.0]
    assert samples["vllm:num_preemptions_total"] == [3.0]
    assert "vllm:num_preemptions_created" not in samples
    assert samples["vllm:iteration_tokens_total_count"] == [0.0]


def test_vllm_reading_and_counter_increases() -> None:
    reader = CanonicalReader(vllm.TELEMETRY)
    first = reader.reading(parse_exposition(
        vllm_text(running=2, waiting=5, kv=0.25, preemptions=7, steps=10, tokens=80)))
    assert first.missing == ()
    assert first.values["num_running"] == 2 and first.values["num_waiting"] == 5
    assert first.values["kv_usage"] == 0.25
    # the first scrape is the baseline: what happened before the run is not counted
    assert first.values["num_preemptions"] == 0
    assert first.values["num_steps"] == 0 and math.isnan(first.values["batch_tokens_mean"] or 0)
    second = reader.reading(parse_exposition(
        vllm_text(running=2, preemptions=9, steps=14, tokens=100)))
    assert second.values["num_preemptions"] == 2
    assert second.values["num_steps"] == 4
    assert second.values["num_batched_tokens"] == 20
    assert second.values["batch_tokens_mean"] == 5
    # a restarted server's counter starts over: the increase is its new value
    third = reader.reading(parse_exposition(vllm_text(preemptions=1, steps=2, tokens=6)))
    assert third.values["num_preemptions"] == 1 and third.values["num_steps"] == 2


def test_vllm_prefix_cache_counters_are_read_as_increases() -> None:
    reader = CanonicalReader(vllm.TELEMETRY)
    first = reader.reading(parse_exposition(vllm_text(queries=1000, hits=200)))
    assert first.values["prefix_cache_queries"] == 0 and first.values["prefix_cache_hits"] == 0
    second = reader.reading(parse_exposition(vllm_text(queries=1600, hits=500)))
    assert second.values["prefix_cache_queries"] == 600
    assert second.values["prefix_cache_hits"] == 300


def test_older_vllm_prefix_cache_counters_are_read_and_the_newer_win() -> None:
    """vLLM before 0.9 named them vllm:gpu_prefix_cache_queries / _hits; 0.9 exported both."""
    def older(queries: float, hits: float) -> str:
        return vllm_text(queries=queries, hits=hits).replace("vllm:prefix_cache_",
                                                             "vllm:gpu_prefix_cache_")

    reader = CanonicalReader(vllm.TELEMETRY)
    reader.reading(parse_exposition(older(10, 10)))
    second = reader.reading(parse_exposition(older(410, 110)))
    assert "prefix_cache_queries" not in second.missing
    assert second.values["prefix_cache_queries"] == 400
    assert second.values["prefix_cache_hits"] == 100
    both = CanonicalReader(vllm.TELEMETRY)
    both.reading(parse_exposition(vllm_text(queries=100, hits=10) + older(7, 7)))
    reading = both.reading(parse_exposition(vllm_text(queries=150, hits=30) + older(900, 900)))
    assert reading.values["prefix_cache_queries"] == 50  # the new names alone
    assert reading.values["prefix_cache_hits"] == 20


def test_renamed_metric_is_read_through_its_alias() -> None:
    reader = CanonicalReader(vllm.TELEMETRY)
    old = reader.reading(parse_exposition(vllm_text(kv=0.5, kv_name="vllm:gpu_cache_usage_perc")))
    assert old.values["kv_usage"] == 0.5 and "kv_usage" not in old.missing


def test_label_sets_sum_counts_and_average_ratios() -> None:
    reading = CanonicalReader(vllm.TELEMETRY).reading(
        parse_exposition(vllm_text(running=3, kv=0.4, engines=2)))
    assert reading.values["num_running"] == 6
    assert reading.values["kv_usage"] == pytest.approx(0.4)


def test_a_missing_metric_is_none_never_zero() -> None:
    text = vllm_text(running=1).replace("vllm:kv_cache_usage_perc", "vllm:something_else")
    reading = CanonicalReader(vllm.TELEMETRY).reading(parse_exposition(text))
    assert reading.values["kv_usage"] is None
    assert reading.missing == ("kv_usage",)


def test_tgi_kv_usage_is_a_ratio_and_unexported_signals_are_missing() -> None:
    text = "\n".join([
        "# TYPE tgi_batch_current_size gauge", "tgi_batch_current_size 3",
        "# TYPE tgi_queue_size gauge", "tgi_queue_size 4",
        "# TYPE tgi_batch_current_max_tokens gauge", "tgi_batch_current_max_tokens 250",
        "# TYPE tgi_batch_max_total_tokens gauge", "tgi_batch_max_total_tokens 1000", "",
    ])
    reading = CanonicalReader(tgi.TELEMETRY).reading(parse_exposition(text))
    assert reading.values["num_running"] == 3 and reading.values["num_waiting"] == 4
    assert reading.values["kv_usage"] == 0.25
    assert reading.values["num_preemptions"] is None and reading.values["num_steps"] is None
    assert reading.missing == ("num_preemptions", "batch_tokens", "prefix_cache_queries",
                               "prefix_cache_hits")


def test_ratio_with_zero_capacity_is_missing() -> None:
    spec = TelemetrySpec(signals=(("kv_usage", MetricSource(("a",), "ratio", ("b",))),))
    reading = CanonicalReader(spec).reading(parse_exposition("a 1\nb 0\n"))
    assert reading.values["kv_usage"] is None and "kv_usage" in reading.missing


def test_trtllm_json_iterations() -> None:
    entries = [
        {"numActiveRequests": 3, "numQueuedRequests": 1,
         "kvCacheStats": {"maxNumBlocks": 100, "usedNumBlocks": 10},
         "inflightBatchingStats": {"numPausedRequests": 0, "numCtxTokens": 30,
                                   "numGenRequests": 2}},
        {"numActiveRequests": 4, "numQueuedRequests": 0,
         "kvCacheStats": {"maxNumBlocks": 100, "usedNumBlocks": 20},
         "inflightBatchingStats": {"numPausedRequests": 1, "numCtxTokens": 0,
                                   "numGenRequests": 4}},
    ]
    reading = trtllm_iterations_reading(entries)
    assert reading.values["num_running"] == 4 and reading.values["num_waiting"] == 0
    assert reading.values["kv_usage"] == 0.2
    assert reading.values["num_preemptions"] == 1
    assert reading.values["num_steps"] == 2 and reading.values["num_batched_tokens"] == 36
    idle = trtllm_iterations_reading([])
    assert idle.values["num_running"] is None and "num_running" in idle.missing
    # no iterations: nothing of any signal, every one said missing (the batch's too)
    assert all(v is None for v in idle.values.values())
    assert set(idle.missing) == set(CANONICAL_SIGNALS)


def test_source_for_picks_the_format() -> None:
    assert isinstance(source_for(TelemetrySpec(format="none"), "http://x"), NoTelemetry)
    src = source_for(trtllm.TELEMETRY, "http://x:1/")
    assert isinstance(src, PrometheusSource) and src.url == "http://x:1/prometheus/metrics"


def test_prometheus_source_against_a_fake_endpoint() -> None:
    texts = iter([vllm_text(preemptions=5), vllm_text(preemptions=8, running=2)])

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/metrics"
        try:
            return httpx.Response(200, text=next(texts))
        except StopIteration:
            return httpx.Response(404)

    async def go() -> list[Reading]:
        client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        src = PrometheusSource(vllm.TELEMETRY, "http://engine/metrics", client=client)
        out = [await src.read() for _ in range(3)]
        await src.aclose()
        return out

    _first, second, gone = asyncio.run(go())
    assert second.values["num_preemptions"] == 3 and second.values["num_running"] == 2
    assert gone.error is not None and "404" in gone.error
    assert all(v is None for v in gone.values.values())


def test_unreachable_endpoint_is_a_scrape_error() -> None:
    async def go() -> Reading:
        src = PrometheusSource(vllm.TELEMETRY, "http://127.0.0.1:9/metrics")
        try:
            return await src.read()
        finally:
            await src.aclose()

    reading = asyncio.run(go())
    assert reading.error is not None and "ConnectError" in reading.error


class ManualClock:
    def __init__(self) -> None:
        self.now_ns = 1_000_000_000

    def __call__(self) -> int:
        return self.now_ns


def test_scraper_runs_until_stop_and_writes_parquet(tmp_path: Path) -> None:
    source = FakeSource([vllm_text(running=1, preemptions=1), vllm_text(running=2, preemptions=4),
                         vllm_text(running=2, preemptions=4)], vllm.TELEMETRY)
    out = tmp_path / "telemetry.parquet"
    scraper = TelemetryScraper(source, out, interval_s=0.01)

    async def go() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(scraper.run(stop))
        while source.num_reads < 4:
            await asyncio.sleep(0.005)
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(go())
    table = pq.read_table(out)
    assert table.column_names == [*COLUMNS, "missing", "scrape_error"]
    rows = table.to_pylist()
    assert len(rows) >= 4
    assert [r["num_running"] for r in rows[:2]] == [1.0, 2.0]
    assert sum(r["num_preemptions"] for r in rows) == 3  # increases add up to the counter's
    times = [r["t_s"] for r in rows]
    assert times == sorted(times) and times[0] >= 0
    assert all(r["missing"] == "" and r["scrape_error"] is None for r in rows)
    assert scraper.missing_signals() == []


def test_scraper_writes_its_file_when_cancelled(tmp_path: Path) -> None:
    out = tmp_path / "telemetry.parquet"
    scraper = TelemetryScraper(NoTelemetry(), out, interval_s=0.01)

    async def go() -> None:
        task = asyncio.create_task(scraper.run(asyncio.Event()))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    rows = pq.read_table(out).to_pylist()
    assert rows and all(r["num_running"] is None for r in rows)
    assert rows[0]["missing"] == ",".join(CANONICAL_SIGNALS)
    assert scraper.missing_signals() == [
        "num_running", "num_waiting", "kv_usage", "num_preemptions", "batch_tokens",
        "prefix_cache_queries", "prefix_cache_hits"]


def test_scrape_times_come_from_the_clock() -> None:
    clock = ManualClock()
    scraper = TelemetryScraper(NoTelemetry(), None, clock_ns=clock, origin_ns=clock.now_ns)

    async def go() -> None:
        await scraper.scrape_once()
        clock.now_ns += 250_000_000
        await scraper.scrape_once()

    asyncio.run(go())
    assert [r["t_s"] for r in scraper.rows] == [0.0, 0.25]


def test_a_counter_that_appears_mid_run_counts_from_zero() -> None:
    """A counter the engine makes at its first increment (a lazily created, labelled series)
    is absent from the first scrapes: when it appears, it has risen from 0 during the run."""
    reader = CanonicalReader(vllm.TELEMETRY)
    without = vllm_text(running=1).replace("vllm:num_preemptions_total",
                                           "vllm:something_else_total")
    first = reader.reading(parse_exposition(without))
    assert first.values["num_preemptions"] is None
    assert reader.reading(parse_exposition(vllm_text(preemptions=7))).values[
        "num_preemptions"] == 7
    assert reader.reading(parse_exposition(vllm_text(preemptions=9))).values[
        "num_preemptions"] == 2


def test_a_scrape_before_the_engine_exports_its_metrics_is_no_baseline() -> None:
    """An endpoint that answers before the engine has registered its metrics: the first scrape
    with them is the baseline, so what the engine counted before the run is not counted."""
    reader = CanonicalReader(vllm.TELEMETRY)
    empty = reader.reading(parse_exposition("# nothing yet\n"))
    assert empty.values["num_preemptions"] is None
    first = reader.reading(parse_exposition(vllm_text(preemptions=40)))
    assert first.values["num_preemptions"] == 0
    assert reader.reading(parse_exposition(vllm_text(preemptions=42))).values[
        "num_preemptions"] == 2


def test_the_scraper_waits_for_counters_still_rising_after_the_run(tmp_path: Path) -> None:
    """vLLM publishes a step's stats after streaming its tokens: the last steps of a run can
    reach /metrics after its end. The scraper scrapes again while the counters still rise, so
    the run's totals are whole (a real vLLM run in CI once counted 1,503 of 1,536 tokens)."""
    texts = [vllm_text(steps=10, tokens=100), vllm_text(steps=12, tokens=120),
             vllm_text(steps=15, tokens=150), vllm_text(steps=17, tokens=170),
             vllm_text(steps=17, tokens=170)]
    source = FakeSource(texts, vllm.TELEMETRY)
    scraper = TelemetryScraper(source, tmp_path / "telemetry.parquet", interval_s=0.01)

    async def go() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(scraper.run(stop))
        while source.num_reads < 2:  # the run ends with its counters still rising
            await asyncio.sleep(0.001)
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(go())
    rows = pq.read_table(tmp_path / "telemetry.parquet").to_pylist()
    assert sum(r["num_steps"] or 0 for r in rows) == 7  # 17 - 10: every step counted
    assert sum(r["num_batched_tokens"] or 0 for r in rows) == 70
    assert rows[-1]["num_steps"] == 0  # and no scrape more once they stopped rising
    assert source.num_reads == len(rows) <= 7
