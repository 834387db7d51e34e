"""Swap preemption with a host swap space too small: the preemptions recomputed instead are
counted (they used to be indistinguishable from swaps) in summary.json and the report."""

from __future__ import annotations

import json
from pathlib import Path

from adapters.reference import ReferenceConfig
from harness.cli import main
from harness.sim import simulate
from harness.traces import Trace, TraceOptions, load_trace

REPO = Path(__file__).resolve().parents[3]
MOONCAKE = REPO / "harness" / "data" / "mooncake_conversation_excerpt.jsonl"


def trace() -> Trace:
    return load_trace(MOONCAKE, TraceOptions(limit=120, time_scale=2, max_model_len=32768,
                                             on_too_long="clip"))


def count(swap_space_gib: float) -> tuple[int, int | None]:
    result = simulate(trace().requests, ReferenceConfig(
        preemption="swap", num_gpu_blocks=6000, swap_space_gib=swap_space_gib,
        max_model_len=32768))
    return sum(tl.num_preemptions for tl in result.timelines), result.num_swap_fallbacks


def test_a_full_host_turns_swaps_into_recomputes_and_they_are_counted(tmp_path: Path) -> None:
    preemptions, fallbacks = count(0.25)
    assert preemptions > 0 and fallbacks is not None and 0 < fallbacks <= preemptions
    roomy_preemptions, roomy_fallbacks = count(400.0)
    assert roomy_preemptions > 0 and roomy_fallbacks == 0
    # recompute preemption has no swap to fall back from
    plain = simulate(trace().requests, ReferenceConfig(num_gpu_blocks=6000, max_model_len=32768))
    assert plain.num_swap_fallbacks is None

    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(MOONCAKE), "--limit", "120", "--time-scale", "2",
                 "--max-model-len", "32768", "--on-too-long", "clip", "--preemption", "swap",
                 "--num-gpu-blocks", "6000", "--swap-space-gib", "0.25", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_swap_fallbacks"] == fallbacks
    report = (out / "report.md").read_text()
    assert "swaps recomputed (host full)" in report and f"| {fallbacks:,} |" in report
