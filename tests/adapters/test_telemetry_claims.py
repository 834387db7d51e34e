"""What `batchlab engines` says each engine's telemetry is: a signal is claimed only where the
engine exports it with the canonical meaning; otherwise it is listed as missing, with why."""

from __future__ import annotations

import pytest

from adapters import catalog, llamacpp, trtllm
from harness.live.telemetry import CanonicalReader, parse_exposition


def test_llamacpp_does_not_claim_kv_usage_its_pinned_build_does_not_export() -> None:
    """Issue: the table showed kv_usage <- llamacpp:kv_cache_usage_ratio, a family the pinned
    build (llama.cpp 0c1e570) no longer exports."""
    line = ("/metrics: num_running <- llamacpp:requests_processing; num_waiting <- "
            "llamacpp:requests_deferred; missing: kv_usage (not exported by the pinned build; "
            "llamacpp:kv_cache_usage_ratio is read if an older build exports it), "
            "num_preemptions, batch_tokens, prefix_cache_queries, prefix_cache_hits")
    assert catalog._telemetry_line(llamacpp.TELEMETRY) == line
    text = catalog.mapping_text()
    assert f"telemetry: {line}" in text
    assert "kv_usage <- llamacpp:kv_cache_usage_ratio" not in text


def test_llamacpp_old_kv_usage_name_is_still_read_when_present() -> None:
    reader = CanonicalReader(llamacpp.TELEMETRY)
    old = reader.reading(parse_exposition(
        "llamacpp:requests_processing 2\nllamacpp:requests_deferred 1\n"
        "llamacpp:kv_cache_usage_ratio 0.25\n"))
    assert old.values["kv_usage"] == 0.25 and "kv_usage" not in old.missing
    pinned = reader.reading(parse_exposition(
        "llamacpp:requests_processing 2\nllamacpp:requests_deferred 1\n"))
    assert pinned.values["kv_usage"] is None and "kv_usage" in pinned.missing


def test_trtllm_says_what_its_paused_and_context_token_gauges_are() -> None:
    """Issue: num_preemptions and batch_tokens were reported missing with no word of
    trtllm_num_paused_requests and trtllm_total_context_tokens. Both are gauges of the last
    iteration (tensorrt_llm/metrics/collector.py @050f80de), not the counts the JSON path sums,
    so they are named, and not read as those signals."""
    assert catalog._telemetry_line(trtllm.TELEMETRY) == (
        "/prometheus/metrics: num_running <- trtllm_num_requests_running; num_waiting <- "
        "trtllm_num_requests_waiting; kv_usage <- trtllm_kv_cache_utilization | "
        "kv_cache_utilization; missing: num_preemptions (trtllm_num_paused_requests is a "
        "gauge of the requests paused in the last iteration, not a count of pauses; the JSON "
        "/metrics sums numPausedRequests over every iteration), batch_tokens "
        "(trtllm_total_context_tokens is a gauge of the last iteration's context tokens, "
        "without decode tokens; the JSON /metrics sums numCtxTokens + numGenRequests over "
        "every iteration), prefix_cache_queries (trtllm_kv_cache_hit_rate is a ratio of "
        "blocks, not a count of prompt tokens looked up), prefix_cache_hits "
        "(trtllm_kv_cache_hit_rate is a ratio of blocks, not a count of prompt tokens found)")


@pytest.mark.parametrize("paused", ["0", "3"])
def test_trtllm_paused_gauge_is_never_reported_as_preemptions(paused: str) -> None:
    reader = CanonicalReader(trtllm.TELEMETRY)
    scrape = ("trtllm_num_requests_running 4\ntrtllm_num_requests_waiting 0\n"
              f"trtllm_num_paused_requests {paused}\ntrtllm_total_context_tokens 512\n")
    for _ in range(2):
        reading = reader.reading(parse_exposition(scrape))
        assert reading.values["num_preemptions"] is None
        assert reading.values["num_batched_tokens"] is None
        assert {"num_preemptions", "batch_tokens"} <= set(reading.missing)
