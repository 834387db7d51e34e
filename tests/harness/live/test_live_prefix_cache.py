"""A live run reads the engine's prefix-cache counters (vLLM's ``vllm:prefix_cache_queries`` and
``_hits``) into its summary's ``prefix_cache``, and the report shows the hit rate. Against the
reference engine served over HTTP, which exports them as vLLM does: what the run counted is
what the server counted."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from harness.cli import main
from harness.live.telemetry import parse_exposition
from harness.serve.process import launch_server_process

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[3]
MOONCAKE = REPO / "harness" / "data" / "mooncake_conversation_excerpt.jsonl"
AZURE = REPO / "harness" / "data" / "azure_conv_excerpt.csv"


def _counters(url: str) -> tuple[float, float]:
    """The server's prefix-cache (queries, hits) counters now."""
    samples = parse_exposition(httpx.get(url + "/metrics", trust_env=False).text)
    return (sum(samples["vllm:prefix_cache_queries_total"]),
            sum(samples["vllm:prefix_cache_hits_total"]))


def _replay(url: str, trace: Path, limit: int, out: Path) -> None:
    assert main(["replay", "--trace", str(trace), "--limit", str(limit), "--engine",
                 "reference", "--model", "llama-3.1-8b", "--url", url, "--out", str(out)]) == 0


def test_a_live_run_counts_the_prefix_cache_hits_its_engine_counted(tmp_path: Path) -> None:
    with launch_server_process(["--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                                "--prefix-caching", "--served-model-name", "llama-3.1-8b"],
                               log_path=tmp_path / "serve.log") as server:
        before = _counters(server.url)
        run = tmp_path / "live"
        _replay(server.url, MOONCAKE, 12, run)
        after = _counters(server.url)
        # a trace of lengths only: its prompts share no prefix the trace names
        blind = tmp_path / "azure"
        _replay(server.url, AZURE, 6, blind)
    cache = json.loads((run / "summary.json").read_text())["prefix_cache"]
    queries, hits = after[0] - before[0], after[1] - before[1]
    assert hits > 0  # the excerpt's conversations share prefixes
    assert cache["queries_tokens"] == queries and cache["hits_tokens"] == hits
    assert cache["hit_rate"] == pytest.approx(hits / queries)
    assert cache["preempted_hit_rate"] is None  # vLLM exports no such counter
    assert cache["num_requests_with_prefix_ids"] == 12  # the trace's, from the manifest
    azure = json.loads((blind / "summary.json").read_text())["prefix_cache"]
    assert azure["queries_tokens"] > 0 and azure["hits_tokens"] == 0
    assert azure["num_requests_with_prefix_ids"] == 0
    both = tmp_path / "both.md"
    assert main(["report", str(run), str(blind), "-o", str(both)]) == 0
    text = both.read_text()
    assert "No request of `azure` carried prefix identities" in text
    assert "Prefill the prefix cache skipped: `live` " in text and "`azure` 0 prompt" not in text
    assert main(["report", str(run)]) == 0
    report = (run / "report.md").read_text()
    assert "## Prefix cache" in report
    assert f"| `live` | {int(queries):,} | {int(hits):,} |" in report
    assert ("`live`: the live engine's own counters; it exports none for re-admissions after "
            "a preemption (–).") in report
