"""Prefix caching end to end: the simulated Mooncake excerpt reports its hit rate, and the
served reference counts hits in /metrics as vLLM names them."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapters.knobs import Knobs
from adapters.reference.blocks import NO_HIT, BlockManager, InvariantError
from adapters.reference.config import ReferenceConfig
from adapters.reference.request import Request
from harness.report.format import fmt_int, fmt_pct
from harness.serve.app import start_server_in_thread
from harness.sim.driver import simulate
from harness.target import RunOptions, TargetSpec
from harness.targets import make_target
from harness.traces import TraceOptions, load_trace

MOONCAKE = Path(__file__).resolve().parents[3] / "harness" / "data" / \
    "mooncake_conversation_excerpt.jsonl"


AZURE = MOONCAKE.with_name("azure_conv_excerpt.csv")


def _run(tmp_path: Path, prefix_caching: bool, path: Path = MOONCAKE, *,
         report: bool = False, limit: int | None = None) -> dict[str, object]:
    trace = load_trace(str(path), TraceOptions(time_scale=4.0, max_model_len=32768,
                                               on_too_long="clip", limit=limit))
    knobs = Knobs.from_mapping({"prefix_caching": prefix_caching, "max_model_len": 32768})
    spec = TargetSpec("reference", "simulate", knobs=knobs)
    out = tmp_path / f"{path.stem}-{'on' if prefix_caching else 'off'}"
    make_target(spec).run(trace, out, RunOptions(write_report=report))
    summary: dict[str, object] = json.loads((out / "summary.json").read_text())
    return summary


def _assert_hit_rates_are_the_counts_ratios(cache: dict[str, object]) -> None:
    """summary.json's hit rates are its own counts' ratios (None with no lookup)."""
    for prefix in ("", "preempted_"):
        queries, hits = cache[f"{prefix}queries_tokens"], cache[f"{prefix}hits_tokens"]
        assert isinstance(queries, int) and isinstance(hits, int) and 0 <= hits <= queries
        rate = cache.get(f"{prefix}hit_rate")
        assert rate == (hits / queries if queries else None), (prefix, rate, hits, queries)


def _report_row(summary: dict[str, object], cell: str) -> str:
    """The prefix-cache table row the report must show for ``cell``, from its summary.json,
    with the report's own number formats."""
    cache = summary["prefix_cache"]
    assert isinstance(cache, dict)
    again = cache.get("preempted_hit_rate")
    return (f"| `{cell}` | {fmt_int(cache['queries_tokens'])} | {fmt_int(cache['hits_tokens'])}"
            f" | {fmt_pct(cache['hit_rate'])} | {fmt_pct(again) if again is not None else '–'} |")


def test_mooncake_excerpt_has_a_nonzero_hit_rate_and_faster_ttft(tmp_path: Path) -> None:
    on, off = _run(tmp_path, True), _run(tmp_path, False)
    cache = on["prefix_cache"]
    assert isinstance(cache, dict)
    assert cache["hits_tokens"] > 0 and 0 < cache["hit_rate"] < 1
    _assert_hit_rates_are_the_counts_ratios(cache)
    # every row of the excerpt names its prefix blocks (the 29 clipped from the left with
    # ids of their own)
    assert cache["num_requests_with_prefix_ids"] == on["num_requests"] > 0
    assert "prefix_cache" not in off
    ttft_on, ttft_off = on["ttft_s"], off["ttft_s"]
    assert isinstance(ttft_on, dict) and isinstance(ttft_off, dict)
    assert ttft_on["mean"] < ttft_off["mean"]


def _trace_prefix_reuse_tokens(path: Path, block_size: int, limit: int | None = None) -> int:
    """The prompt tokens of a Mooncake file that an unbounded prefix cache would hold when
    each request arrives, counted from the file alone: the leading ``hash_ids`` (512-token
    blocks) seen on an earlier request, in whole ``block_size`` blocks, and never the whole
    prompt (its last token is computed). ``limit``: of the first requests only."""
    rows = sorted((json.loads(line) for line in path.read_text().splitlines() if line),
                  key=lambda r: r["timestamp"])[:limit]
    seen: set[int] = set()
    total = 0
    for r in rows:
        n, hit, leading = r["input_length"], 0, True
        for i, block in enumerate(r["hash_ids"]):
            leading = leading and block in seen
            if leading:
                hit += min(512, n - 512 * i) // block_size * block_size
            seen.add(block)
        total += min(hit, (n - 1) // block_size * block_size)
    return total


def test_with_a_cache_that_never_evicts_the_hits_are_the_traces_own_prefix_reuse() -> None:
    """The engine's block hashing, chaining and lookup, held against an independent count
    from the trace's hash_ids: with room for every block, each reused prefix must hit."""
    trace = load_trace(str(MOONCAKE), TraceOptions(max_model_len=131072))
    config = ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm", prefix_caching=True,
                             max_model_len=131072, num_gpu_blocks=1_000_000)
    result = simulate(trace.requests, config)
    assert result.prefix_cache is not None
    expected = _trace_prefix_reuse_tokens(MOONCAKE, config.block_size)
    assert expected > 0
    assert result.prefix_cache["hits_tokens"] == expected
    assert result.prefix_cache["preempted_queries_tokens"] == 0  # nothing was evicted
    # on one H100's KV cache, evictions lose part of that reuse
    bounded = simulate(trace.requests, ReferenceConfig(
        model="llama-3.1-8b", gpu="h100-sxm", prefix_caching=True, max_model_len=131072))
    assert bounded.prefix_cache is not None
    assert 0 < bounded.prefix_cache["hits_tokens"] < expected
    _assert_hit_rates_are_the_counts_ratios(bounded.prefix_cache)


def test_the_prefix_cache_keeps_its_invariants_through_hits_evictions_and_preemptions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The excerpt's first 50 requests with the scheduler's and the block manager's
    invariants checked after every step (the whole excerpt takes half a minute so): on a KV
    cache that holds every block, then on one short enough to evict cached blocks and preempt
    requests, whose re-admissions hit."""
    limit = 50
    trace = load_trace(str(MOONCAKE), TraceOptions(max_model_len=131072, limit=limit))
    assert len(trace.requests) == limit
    evicted: list[int] = []
    take = BlockManager._take_cached

    def counting_take(self: BlockManager, num_blocks: int) -> list[int]:
        queue = iter(self._free_queue)
        evicted.extend(b for b in (next(queue) for _ in range(num_blocks))
                       if self._block_hash[b] is not None)
        return take(self, num_blocks)

    monkeypatch.setattr(BlockManager, "_take_cached", counting_take)
    expected = _trace_prefix_reuse_tokens(MOONCAKE, 16, limit)
    assert expected > 0
    results = {}
    for num_gpu_blocks in (60_000, 6_000):
        evicted.clear()
        config = ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm", prefix_caching=True,
                                 max_model_len=131072, num_gpu_blocks=num_gpu_blocks)
        assert config.block_size == 16
        result = simulate(trace.requests, config, check_invariants=True)
        cache = result.prefix_cache
        assert cache is not None
        _assert_hit_rates_are_the_counts_ratios(cache)
        assert cache["hits_tokens"] == expected  # first admissions: the trace's own reuse
        assert all(tl.error_kind is None for tl in result.timelines)
        results[num_gpu_blocks] = (len(evicted), sum(tl.num_preemptions
                                                     for tl in result.timelines),
                                   cache["preempted_hits_tokens"])
    assert results[60_000] == (0, 0, 0)
    num_evicted, num_preemptions, preempted_hits = results[6_000]
    assert num_evicted > 0 and num_preemptions > 0 and preempted_hits > 0


def test_the_report_says_why_a_trace_without_prefix_identities_never_hits(
        tmp_path: Path) -> None:
    # Azure's trace has lengths only: every lookup misses, and the report must say that this
    # is the trace, not the cache
    azure = _run(tmp_path, True, AZURE, report=True, limit=200)
    cache = azure["prefix_cache"]
    assert isinstance(cache, dict)
    assert cache["num_requests_with_prefix_ids"] == 0 and cache["hits_tokens"] == 0
    assert cache["queries_tokens"] > 0
    _assert_hit_rates_are_the_counts_ratios(cache)
    text = (tmp_path / "azure_conv_excerpt-on" / "report.md").read_text()
    assert "## Prefix cache" in text
    assert "carried prefix identities: the trace records lengths, not prompts" in text
    # the table shows summary.json's counts and hit rate: a rate of 0%, not "–"
    row = _report_row(azure, "azure_conv_excerpt-on")
    assert row == "| `azure_conv_excerpt-on` | 180,695 | 0 | 0% | – |"
    assert row in text.splitlines()
    mooncake = _run(tmp_path, True, MOONCAKE, report=True, limit=200)
    cache = mooncake["prefix_cache"]
    assert isinstance(cache, dict) and 0 < cache["hit_rate"] < 1
    _assert_hit_rates_are_the_counts_ratios(cache)
    text = (tmp_path / "mooncake_conversation_excerpt-on" / "report.md").read_text()
    assert "## Prefix cache" in text and "prefix identities" not in text
    assert _report_row(mooncake, "mooncake_conversation_excerpt-on") in text.splitlines()


def _scrape(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", trust_env=False).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_served_reference_counts_prefix_cache_hits() -> None:
    config = ReferenceConfig(prefix_caching=True, num_gpu_blocks=64)
    prompt = list(range(100, 164))  # 64 token ids: four full 16-token blocks
    with start_server_in_thread(config) as server:
        for _ in range(2):
            r = httpx.post(server.url + "/v1/completions", trust_env=False, timeout=30,
                           json={"prompt": prompt, "max_tokens": 2})
            assert r.status_code == 200
        values = _scrape(server.url)
    # The first request caches its blocks; the second finds 3 of its 4 full blocks (the last
    # prompt token is always computed, so the last block is not taken from the cache).
    assert values["vllm:prefix_cache_queries_total"] == 128
    assert values["vllm:prefix_cache_hits_total"] == 48


def test_served_reference_exports_prefix_cache_counters_at_zero_with_caching_off() -> None:
    """vLLM creates the two counters whatever its configuration; they were missing here."""
    config = ReferenceConfig(prefix_caching=False, num_gpu_blocks=64)
    with start_server_in_thread(config) as server:
        for _ in range(2):
            r = httpx.post(server.url + "/v1/completions", trust_env=False, timeout=30,
                           json={"prompt": list(range(100, 164)), "max_tokens": 2})
            assert r.status_code == 200
        values = _scrape(server.url)
    assert values["vllm:prefix_cache_queries_total"] == 0
    assert values["vllm:prefix_cache_hits_total"] == 0


@pytest.mark.parametrize("settings", [
    {"num_gpu_blocks": 400, "max_num_seqs": 32},  # KV short: recompute preemptions
    {"num_gpu_blocks": 400, "preemption": "swap"},
    {"num_gpu_blocks": 600, "admission": "reserve", "preemption": "none"},
    {},
], ids=["recompute", "swap", "reserve", "plenty"])
def test_a_trace_without_prefix_ids_simulates_the_same_on_the_plain_block_stack(
        settings: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    # Azure's rows name no prefix blocks: the driver keeps free blocks on the plain stack
    # (expect_no_prefix_ids). Every step, latency and lookup count must be what the
    # least-recently-freed queue gives.
    trace = load_trace(str(AZURE), TraceOptions(limit=150, time_scale=0.2))
    config = ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm", prefix_caching=True,
                             max_model_len=8192, **settings)  # type: ignore[arg-type]
    fast = simulate(trace.requests, config, check_invariants=True)
    calls: list[bool] = []
    monkeypatch.setattr(BlockManager, "expect_no_prefix_ids",
                        lambda self: calls.append(True))
    queued = simulate(trace.requests, config, check_invariants=True)
    assert calls == [True]  # the driver asked for the stack, and this run kept the queue
    assert fast.steps.equals(queued.steps)
    assert [tl.chunk_times_s for tl in fast.timelines] == \
        [tl.chunk_times_s for tl in queued.timelines]
    assert [(tl.finished_s, tl.num_preemptions, tl.error_kind) for tl in fast.timelines] == \
        [(tl.finished_s, tl.num_preemptions, tl.error_kind) for tl in queued.timelines]
    assert fast.prefix_cache == queued.prefix_cache
    assert fast.prefix_cache is not None and fast.prefix_cache["hits_tokens"] == 0
    assert fast.prefix_cache["queries_tokens"] > 0
    if settings.get("num_gpu_blocks") == 400:
        assert sum(tl.num_preemptions for tl in fast.timelines) > 0


def test_the_block_stack_refuses_a_request_with_block_hashes() -> None:
    blocks = BlockManager(8, 4, prefix_caching=True)
    blocks.expect_no_prefix_ids()
    hashed = Request("r", 12, 4, arrival_s=0.0, block_hashes=(1, 2))
    with pytest.raises(InvariantError, match="expect_no_prefix_ids"):
        blocks.find_cached_prefix(hashed)
    plain = Request("p", 12, 4, arrival_s=0.0)
    hit = blocks.find_cached_prefix(plain)
    assert blocks.allocate(plain, 12, hit) is not None
    assert (blocks.prefix_cache_queries_tokens, blocks.prefix_cache_hits_tokens) == (12, 0)
    held = BlockManager(8, 4, prefix_caching=True)
    assert held.allocate(Request("q", 12, 4, arrival_s=0.0), 12, NO_HIT) is not None
    with pytest.raises(InvariantError, match="none is held"):
        held.expect_no_prefix_ids()


def test_the_tgi_routes_reuse_a_cached_prefix_as_the_openai_routes_do() -> None:
    """TGI caches prefixes by default; the served reference's /generate finds a repeated
    prompt's blocks, and its keys are the OpenAI routes' for the same text."""
    config = ReferenceConfig(prefix_caching=True, num_gpu_blocks=64)
    words = " ".join(f"w{i}" for i in range(64))
    with start_server_in_thread(config) as server:
        for _ in range(2):
            r = httpx.post(server.url + "/generate", trust_env=False, timeout=30,
                           json={"inputs": words, "parameters": {"max_new_tokens": 2}})
            assert r.status_code == 200
        tgi = _scrape(server.url)
        r = httpx.post(server.url + "/v1/completions", trust_env=False, timeout=30,
                       json={"prompt": words, "max_tokens": 2})
        assert r.status_code == 200
        both = _scrape(server.url)
    # 64 words, 64 tokens: the second request finds 3 of its 4 full blocks (the last prompt
    # token is always computed), as on the OpenAI routes
    assert (tgi["vllm:prefix_cache_queries_total"], tgi["vllm:prefix_cache_hits_total"]) == (
        128, 48)
    # the same text on the OpenAI route finds what /generate cached
    assert (both["vllm:prefix_cache_queries_total"], both["vllm:prefix_cache_hits_total"]) == (
        192, 96)
