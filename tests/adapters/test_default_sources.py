"""Every engine default batchlab states carries where it was read (repository, path, commit,
date), and docs/engines.md says where a live launch and a profile leave the same knob
different."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from adapters import catalog
from adapters.base import UNKNOWN

REPO = Path(__file__).resolve().parents[2]
# "owner/repo path ... @<8 hex>, read 2026-11-30"
SOURCE = re.compile(r"^[\w.-]+/[\w.-]+ \S+.* @[0-9a-f]{8}, read 2026-11-30$")


@pytest.mark.parametrize("engine", ["vllm", "tgi", "trtllm"])
def test_each_known_default_has_a_source(engine: str) -> None:
    """Issue: the vLLM, TGI and TRT-LLM defaults in docs/engines.md had no source."""
    for rule in catalog.INFO[engine].rules:
        if rule.default is UNKNOWN or rule.pinned or rule.knob in ("max_model_len",
                                                                    "extra_args"):
            continue
        assert SOURCE.match(rule.default_source), (rule.knob, rule.default_source)


@pytest.mark.parametrize(
    ("engine", "row"),
    [
        ("vllm", "| `policy unset` | `(no flag)` | engine default | the engine's own default: "
                 "fcfs (vllm-project/vllm vllm/config/scheduler.py SchedulerConfig.policy "
                 "@01230b40, read 2026-11-30) |"),
        ("tgi", "| `chunked_prefill unset` | `(no flag)` | engine default | the engine's own "
                "default: true (huggingface/text-generation-inference "
                "server/text_generation_server/models/globals.py PREFILL_CHUNKING @db931fcf, "
                "read 2026-11-30) |"),
        ("trtllm", "| `max_num_seqs unset` | `(no flag)` | engine default | the engine's own "
                   "default: 2048 (NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py "
                   "BaseLlmArgs.max_batch_size @00043967, read 2026-11-30) |"),
    ],
)
def test_docs_show_each_default_with_its_source(engine: str, row: str) -> None:
    doc = (REPO / "docs" / "engines.md").read_text()
    assert row in doc.split(f"## {engine}:")[1].split("\n## ")[0]


def test_live_and_profile_values_of_unset_knobs_are_in_one_table() -> None:
    rows = {(d.engine, d.knob): d for d in catalog.unset_differences()}
    seqs = rows[("vllm", "max_num_seqs")]
    assert seqs.live == "--max-num-seqs 256 (pinned)"
    assert seqs.profiles == "256 (vllm-a100-80gb); 1024 (vllm-h100-sxm, vllm-h200)"
    assert rows[("vllm", "max_num_batched_tokens")].profiles == (
        "2048 (vllm-a100-80gb); 8192 (vllm-h100-sxm, vllm-h200)")
    cap = rows[("tgi", "max_num_seqs (admission cap: --max-concurrent-requests)")]
    assert (cap.live, cap.profiles) == ("--max-concurrent-requests 4096 (always passed)",
                                        "128 (tgi-h100-sxm)")
    assert cap.engine_default == (
        "128 (huggingface/text-generation-inference launcher/src/main.rs "
        "--max-concurrent-requests @db931fcf, read 2026-11-30)")
    doc = (REPO / "docs" / "engines.md").read_text()
    assert doc.count("## Unset knobs: a live launch and a profile differ") == 1
    assert ("| tgi | `max_num_seqs (admission cap: --max-concurrent-requests)` | "
            "`--max-concurrent-requests 4096 (always passed)` | 128 (tgi-h100-sxm) |") in doc
