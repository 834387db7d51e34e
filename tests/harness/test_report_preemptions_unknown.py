"""A live run whose engine exported no preemption counter (or one summarised before live runs
counted the engine's) has a preemption count that is not known: every part of a report says
so, as the preemptions table does, and none reads its 0 as a count."""

from __future__ import annotations

from pathlib import Path

from harness.report.curves import EngineUse, kv_bound
from harness.report.findings import _preemption_count
from harness.report.runs import CellResult, preemptions
from harness.report.sections import _preemptions_text


def _cell(kind: str, summary: dict[str, object]) -> CellResult:
    return CellResult(name="c", run_dir=Path("c"), state="done", summary=summary,
                      manifest={"kind": kind, "knobs": {"max_num_seqs": 64}})


def test_an_unknown_count_is_not_known_everywhere() -> None:
    legacy = _cell("live", {"num_preemptions": 0})  # the client's zero, not the engine's
    counted = _cell("live", {"num_preemptions": 0, "preemptions_from": "engine"})
    simulated = _cell("simulated", {"num_preemptions": 12})
    assert preemptions(legacy) is None
    assert _preemptions_text(legacy) == "not known"
    assert _preemption_count(legacy) == "preemptions not known"
    assert _preemptions_text(counted) == "0" and _preemptions_text(simulated) == "12"
    assert _preemption_count(simulated) == "12 preemptions"


def test_what_bounded_the_batch_reads_only_counted_preemptions() -> None:
    use = EngineUse(running_mean=20.0, running_peak=30.0, waiting_peak=0.0, kv_mean=0.3,
                    kv_peak=0.5)
    # an unknown count is no evidence of KV pressure: the load bounded this batch
    assert kv_bound(_cell("live", {"num_preemptions": 3}), use) == "load"
    assert kv_bound(_cell("simulated", {"num_preemptions": 3}), use) == "kv"
