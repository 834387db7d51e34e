"""The report's load curves, capacity at SLO, batch-size table and tuning findings: a golden
file on a fabricated batch-size sweep at two request rates, with one capacity search beside it.

    BATCHLAB_UPDATE_GOLDEN=1 .venv/bin/pytest tests/harness/test_report_curves.py
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from harness import report
from harness.metrics import Slo, summarize
from harness.report.curves import capacity_rows, interpolated_capacity, load_series
from harness.report.findings import tuning_findings
from harness.results import (
    STEPS_FILE,
    SUMMARY_FILE,
    write_json_atomic,
    write_parquet_atomic,
    write_timelines,
)
from harness.timeline import RequestTimeline

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "report_golden"
FIXTURE = GOLDEN / "fixture-curves"
UPDATE = os.environ.get("BATCHLAB_UPDATE_GOLDEN") == "1"
SLO = Slo(ttft_s=1.0, tpot_s=0.05)
METRICS_DOC = "../../docs/metrics.md"
CAPS = (8, 32, 128)
RATES = (2.0, 8.0)
KV_BLOCKS = 400
ROOFLINE = {"context_len": 1180, "ridge_flop_per_byte": 295.3, "max_batch_in_kv": 60,
            "turn_batch_size": None, "intensity_at_max_batch": 61.2}
KNOBS = {"max_num_batched_tokens": 2048, "policy": "fcfs", "preemption": "recompute",
         "chunked_prefill": True, "weights_dtype": "bf16", "kv_cache_dtype": "bf16"}
TRACE = {"source": "harness/data/azure_conv_excerpt.csv", "format": "azure",
         "digest": "7c1e9a0d1e7b5a4c8d6e2f1a0b9c8d7e", "notes": [], "counts": {},
         "stats": {"num_requests": 40, "prompt_tokens_mean": 1100.0,
                   "output_tokens_mean": 160.0}}


def _batch(cap: int, rate: float) -> float:
    """The running batch a cap reaches: the load fills it, the KV cache holds at most 60."""
    return min(cap, 60.0, rate * 10)


def _latencies(cap: int, rate: float) -> tuple[float, float]:
    """(TTFT, TPOT): a small cap queues at the high rate, a large batch slows every step."""
    batch = _batch(cap, rate)
    tpot = 0.008 + 0.0007 * batch
    queueing = max(0.0, rate * 10 - max(cap, 60)) * 0.03 + max(0.0, rate * 10 - cap) * 0.03
    return 0.12 + queueing, tpot


def _timelines(cap: int, rate: float) -> list[RequestTimeline]:
    ttft, tpot = _latencies(cap, rate)
    out = []
    for i in range(40):
        arrival = i / rate
        n = 24 + (i * 13) % 25
        first = arrival + ttft * (0.6 + (i % 5) / 5)
        step = tpot * (0.9 + (i % 3) / 10)
        chunks = tuple(first + k * step for k in range(n))
        out.append(RequestTimeline(
            request_id=f"r{i}", arrival_s=arrival, num_prompt_tokens=200 + (i * 53) % 1800,
            num_target_output_tokens=n, chunk_times_s=chunks, chunk_num_tokens=(1,) * n,
            finished_s=chunks[-1],
            num_preemptions=1 if _batch(cap, rate) >= 60 and i % 12 == 0 else 0,
            finish_reason="length", token_count_source="engine"))
    return out


def _steps(cap: int, rate: float, end_s: float) -> pa.Table:
    t = np.round(np.arange(0, end_s, 0.05), 3)
    batch = _batch(cap, rate)
    ramp = np.minimum(1.0, t / 2.0)
    running = np.maximum(1, np.round(batch * ramp)).astype(np.int64)
    waiting = np.round(np.maximum(0.0, rate * 10 - batch) * ramp).astype(np.int64)
    used = np.minimum(KV_BLOCKS, running * 6.6).astype(np.int64)
    zeros = np.zeros(t.size, dtype=np.int64)
    return pa.table({
        "t_s": t, "duration_s": np.full(t.size, 0.05), "num_running": running,
        "num_waiting": waiting, "num_prefill_tokens": zeros, "num_decode_tokens": running,
        "num_padded_tokens": zeros, "num_kv_blocks_used": used,
        "num_kv_blocks_total": np.full(t.size, KV_BLOCKS, dtype=np.int64),
        "num_preempted": zeros,
    })


def _cell_name(cap: int, rate: float) -> str:
    return f"fcfs__max_num_seqs-{cap}__rate-{rate:g}"


def make_fixtures() -> None:
    if FIXTURE.exists():
        shutil.rmtree(FIXTURE)
    FIXTURE.mkdir(parents=True)
    names = [_cell_name(cap, rate) for cap in CAPS for rate in RATES]
    write_json_atomic({
        "name": "fixture-curves", "question": "How large should max_num_seqs be?",
        "source": "scenarios/fixture-curves.yaml",
        "trace": {"path": TRACE["source"], "options": {"limit": 40}},
        "model": "llama-3.1-8b", "gpu": "h100-sxm", "slo": SLO.as_dict(),
        "baseline": _cell_name(8, 2.0), "cells": names,
        "command": ["batchlab", "run", "scenarios/fixture-curves.yaml"],
    }, FIXTURE / report.SCENARIO_FILE)
    for cap in CAPS:
        for rate in RATES:
            d = FIXTURE / _cell_name(cap, rate)
            d.mkdir()
            timelines = _timelines(cap, rate)
            write_timelines(d, timelines, live=False)
            end = max(tl.finished_s or 0.0 for tl in timelines)
            write_parquet_atomic(_steps(cap, rate, end), d / STEPS_FILE)
            write_json_atomic(summarize(timelines, slo=SLO), d / SUMMARY_FILE)
            knobs = {**KNOBS, "max_num_seqs": cap}
            write_json_atomic({
                "kind": "simulated", "knobs": knobs, "trace": TRACE, "slo": SLO.as_dict(),
                "model": "llama-3.1-8b", "gpu": "h100-sxm", "batchlab_version": "0.1.0",
                "command": ["batchlab", "run", "scenarios/fixture-curves.yaml", "--only",
                            d.name],
                "engine": {"name": "reference", "mode": "simulated", "version": "0.1.0",
                           "config": {**knobs, "num_gpu_blocks": KV_BLOCKS}},
                "roofline": ROOFLINE, "approximations": [],
            }, d / report.MANIFEST_FILE)
            write_json_atomic({
                "name": d.name, "engine": {"name": "fcfs", "engine": "reference",
                                           "mode": "simulated"},
                "knobs": knobs, "grid": {"max_num_seqs": cap},
                "load": {"kind": "rate", "value": rate}}, d / report.CELL_FILE)
            write_json_atomic({"state": "done"}, d / report.STATUS_FILE)
    # A capacity search of one setting, run into the scenario's folder (its probe folders
    # are not needed by the report).
    search = FIXTURE / "capacity" / "fcfs__max_num_seqs-32"
    search.mkdir(parents=True)
    probes = [(1.0, 1.0, True), (2.0, 1.0, True), (4.0, 1.0, True), (8.0, 0.95, False),
              (5.657, 1.0, True), (6.727, 0.99, True), (7.336, 0.97, False),
              (7.025, 0.98, False)]
    write_json_atomic({
        "setting": "fcfs__max_num_seqs-32",
        "engine": {"name": "fcfs", "engine": "reference", "mode": "simulated"},
        "knobs": {**KNOBS, "max_num_seqs": 32}, "grid": {"max_num_seqs": 32},
        "kind": "rate", "unit": "req/s", "slo": SLO.as_dict(), "target_attainment": 0.99,
        "precision": 0.05, "precision_text": "within 5%", "digest": "0" * 16,
        "status": "found", "capacity": 6.727,
        "bracket": {"passing": 6.727, "failing": 7.025},
        "probes": [{"load": load, "label": f"rate-{load:g}", "attainment": att,
                    "passed": ok, "stopped": None if load != 8.0 else "over-saturated: ..."}
                   for load, att, ok in probes],
    }, search / "search.json")


@pytest.fixture(scope="module")
def fixture_curves() -> Path:
    if UPDATE:
        make_fixtures()
    assert FIXTURE.exists(), "fixtures missing: run with BATCHLAB_UPDATE_GOLDEN=1"
    return FIXTURE


def _render(scenario_dir: Path, out: Path, *, draw: bool = True) -> str:
    meta, cells = report.load_scenario_dir(scenario_dir)
    ctx = report.scenario_context(meta, cells, scenario_dir, metrics_doc=METRICS_DOC)
    ctx = dataclasses.replace(ctx, rerender=["batchlab", "report", "reports/fixture-curves"])
    return report.render_markdown(cells, ctx, out, draw=draw)


def test_curves_and_capacity_report_matches_golden(fixture_curves: Path, tmp_path: Path
                                                   ) -> None:
    text = _render(fixture_curves, tmp_path)
    golden = GOLDEN / "expected_curves_report.md"
    if UPDATE:
        golden.write_text(text)
    assert text == golden.read_text(), (
        f"report differs from {golden}; if intended, regenerate with BATCHLAB_UPDATE_GOLDEN=1")
    assert (tmp_path / "throughput_latency.png").stat().st_size > 1000
    assert "](throughput_latency.png)" in text


def test_curves_report_content(fixture_curves: Path, tmp_path: Path) -> None:
    text = _render(fixture_curves, tmp_path, draw=False)
    assert _render(fixture_curves, tmp_path / "again", draw=False) == text
    curves = text.split("## Throughput–latency curves")[1].split("## Capacity at SLO")[0]
    for cap in CAPS:
        assert f"### `fcfs, max_num_seqs={cap}`" in curves
    capacity = text.split("## Capacity at SLO")[1].split("## Batch size")[0]
    # the searched setting comes from search.json, the others are interpolated
    assert "| `fcfs, max_num_seqs=32` | 6.727 req/s |" in capacity
    assert "search (found): 6.727 passed, 7.025 failed (within 5%); 8 probes, 1 stopped early" \
        in capacity
    assert "| `fcfs, max_num_seqs=8` |" in capacity and "| baseline | interpolated |" in capacity
    batch = text.split("## Batch size")[1].split("## Preemptions")[0]
    assert "**← turn**" in batch
    assert "decode stays memory-bound up to the KV cache's limit of about 60 requests" in batch
    assert "The *roofline* column says where each cap's mean running batch is" in batch
    findings = text.split("## Key findings")[1].split("## Cells")[0]
    assert "Throughput-first (fcfs, 8 req/s): from max_num_seqs 128 " \
           "(`fcfs__max_num_seqs-128__rate-8`) KV memory, not the cap, is the limit" in findings
    assert ("Latency-sensitive (fcfs, 8 req/s): the largest max_num_seqs whose predicted TPOT "
            "p90 meets the 50 ms TPOT SLO is 32") in findings


def test_interpolated_capacity_between_load_points() -> None:
    from harness.report.curves import CurvePoint, Series

    def pt(load: float, att: float) -> CurvePoint:
        return CurvePoint(f"c{load:g}", load, None, None, None, None, att)

    s = Series("x", "rate", (pt(1, 1.0), pt(2, 0.995), pt(4, 0.9)))
    row = interpolated_capacity(s, 0.99)
    assert row.bound == "=" and row.capacity == pytest.approx(2 + 0.005 / 0.095 * 2)
    assert row.cells == ("c2", "c4")
    assert interpolated_capacity(Series("x", "rate", (pt(1, 1.0), pt(2, 1.0))), 0.99).bound == "≥"
    assert interpolated_capacity(Series("x", "rate", (pt(1, 0.5), pt(2, 0.4))), 0.99).bound == "<"
    assert capacity_rows([s], [], 0.99)[0].source == "interpolated"
    assert load_series([]) == []


def test_mixed_finding_names_the_pair_with_the_best_goodput() -> None:
    cells = []
    for seqs, tokens, goodput in ((32, 2048, 3.1), (32, 8192, 3.6), (128, 2048, 2.2)):
        summary = {"goodput": {"requests_per_s": goodput, "slo_attainment": goodput / 4},
                   "tpot_s": {"p90": 0.01}, "throughput": {"output_tokens_per_s": 100}}
        cells.append(report.CellResult(
            name=f"s{seqs}-t{tokens}", run_dir=Path("."), state="done", summary=summary,
            cell={"knobs": {"max_num_seqs": seqs, "max_num_batched_tokens": tokens}}))
    lines = tuning_findings(cells, {"tpot_s": 0.05})
    mixed = [line for line in lines if line.startswith("Mixed traffic")]
    assert mixed == ["Mixed traffic: the max_num_seqs / max_num_batched_tokens pair with the "
                     "best goodput is 32 / 8,192 (`s32-t8192`: 3.6 good req/s, 90.0% within "
                     "SLO); next best 32 / 2,048 (`s32-t2048`: 3.1 good req/s, 77.5% within "
                     "SLO)."]
    # (a series of two caps is too short for the batch-size advice)
    assert not any(line.startswith(("Latency-sensitive", "Throughput-first")) for line in lines)


def test_engine_use_weighs_each_step_by_its_duration_over_busy_time(tmp_path: Path) -> None:
    """"Mean over busy time" in the batch-size table: a step counts for as long as it lasted,
    idle steps not at all, and every step counts (not the plot's down-sampled points)."""
    from harness.report.curves import engine_use

    n = 5000  # more steps than the plot keeps points
    running = np.where(np.arange(n) % 2 == 0, 100, 10).astype(np.int64)
    duration = np.where(running == 100, 0.03, 0.01)  # a big batch's step takes longer
    running[:10] = 0  # idle at first
    t = np.concatenate([[0.0], np.cumsum(duration)[:-1]])
    used = running * 2
    write_parquet_atomic(pa.table({
        "t_s": t, "duration_s": duration, "num_running": running,
        "num_waiting": np.zeros(n, dtype=np.int64),
        "num_kv_blocks_used": used, "num_kv_blocks_total": np.full(n, 400, dtype=np.int64),
    }), tmp_path / STEPS_FILE)
    use = engine_use(tmp_path)
    assert use is not None
    busy = running > 0
    expected = float((running * duration)[busy].sum() / duration[busy].sum())
    assert use.running_mean == pytest.approx(expected)
    assert use.running_mean == pytest.approx(77.5, abs=0.1)  # not the plain mean, 55
    assert use.kv_mean == pytest.approx(expected * 2 / 400)
    assert use.running_peak == 100 and use.kv_peak == pytest.approx(0.5)


def test_no_cap_within_the_tpot_slo_names_the_closest_without_rounding_onto_it() -> None:
    """A TPOT p90 of 12.02 ms reads "12 ms" in a table; beside a 12 ms SLO none met, the
    finding writes it so that it does not read as the SLO."""
    cells = [report.CellResult(
        name=f"s{seqs}", run_dir=Path("."), state="done",
        summary={"tpot_s": {"p90": tpot}, "throughput": {"output_tokens_per_s": 100.0}},
        cell={"knobs": {"max_num_seqs": seqs, "max_num_batched_tokens": 8192}})
        for seqs, tpot in ((8, 0.0120223), (32, 0.0131), (128, 0.0158))]
    lines = [line for line in tuning_findings(cells, {"tpot_s": 0.012})
             if line.startswith("Latency-sensitive")]
    assert lines == ["Latency-sensitive: no max_num_seqs tried kept TPOT p90 within the 12 ms "
                     "TPOT SLO (the closest: `s8`, max_num_seqs 8, at 12.02 ms)."]


BEHIND = "fell behind: completed 6.52 req/s of 7.75 arriving over the second half"
# (folder, load, attainment, kept pace, stopped early): passed, met the SLO but fell behind,
# stopped early as over-saturated
PROBES = (("rate-6.169", 6.169, 1.0, True, None), ("rate-6.442", 6.442, 1.0, False, None),
          ("rate-8", 8.0, 0.7, None, "over-saturated"))


def _probes_of_a_search(search: Path, *, record: bool = True) -> list[report.CellResult]:
    """A capacity search's probes as report cells, with its search.json when ``record``."""
    import json

    entries = [{"load": load, "run_dir": name, "attainment": att, "passed": kept is True,
                "stopped": stopped, "kept_pace": kept,
                "behind": BEHIND if kept is False else None}
               for name, load, att, kept, stopped in PROBES]
    if record:
        search.mkdir(parents=True, exist_ok=True)
        (search / "search.json").write_text(json.dumps({
            "setting": "fcfs", "engine": {"name": "fcfs"}, "kind": "rate", "unit": "req/s",
            "status": "found", "capacity": 6.169, "target_attainment": 0.99,
            "bracket": {"passing": 6.169, "failing": 6.442}, "probes": entries}))
    return [report.CellResult(
        name=name, run_dir=search / name, state="done",
        summary={"goodput": {"slo_attainment": att}, "stopped_early": stopped},
        cell={"engine": {"name": "fcfs"}, "load": {"kind": "rate", "value": load}})
        for name, load, att, kept, stopped in PROBES]


def _attainment_column(cells: list[report.CellResult]) -> list[str]:
    from harness.report.sections import curves_section

    text = "\n".join(curves_section(load_series(cells), False))
    rows = [line for line in text.splitlines() if line.startswith("| ")][1:]
    return [row.rsplit("|", 2)[-2].strip() for row in rows]


def test_a_probe_that_fell_behind_is_marked_failed_in_the_curve_table(tmp_path: Path) -> None:
    """A capacity report's curve rows read "100%" above the capacity it reported for probes
    that met the SLO but failed as falling behind: the reason was only in a later table. The
    mark is read from the search's search.json, the record the capacity table reads, so the
    two tables say the same of each probe."""
    from harness.report.curves import find_searches

    cells = _probes_of_a_search(tmp_path / "fcfs")
    assert _attainment_column(cells) == [
        "100%", "100% (failed: fell behind)", "70.0% (stopped early)"]
    [row] = capacity_rows(load_series(cells), find_searches(cells, None), 0.99)
    assert f"6.442 met the SLO but {BEHIND}" in row.evidence


def test_the_curve_table_reads_a_probe_s_pace_from_search_json_before_probe_json(
        tmp_path: Path) -> None:
    """search.json decides when it lists the probe (a probe.json saying otherwise is not
    read); a probe folder no search.json lists is marked from its own probe.json."""
    import json

    from harness.report.curves import _probe_behind

    search = tmp_path / "fcfs"
    opposite = {True: False, False: True, None: None}
    for name, _, _, kept, _ in PROBES:
        said = opposite[kept]  # each probe.json says the opposite of search.json
        (search / name).mkdir(parents=True)
        (search / name / "probe.json").write_text(json.dumps({
            "kept_pace": said, "behind": "fell behind: probe.json's" if said is False
            else None}))
    cells = _probes_of_a_search(search)
    assert [p.behind for p in load_series(cells)[0].points] == [None, BEHIND, None]
    (search / "search.json").unlink()
    assert [p.behind for p in load_series(cells)[0].points] == [
        "fell behind: probe.json's", None, None]
    for name, _, _, kept, _ in PROBES:  # probe.json alone, as a search writes it
        (search / name / "probe.json").write_text(json.dumps({
            "kept_pace": kept, "behind": BEHIND if kept is False else None}))
    assert _attainment_column(cells) == [
        "100%", "100% (failed: fell behind)", "70.0% (stopped early)"]
    assert _probe_behind(search / "rate-6.442") == BEHIND
    assert _probe_behind(search / "rate-6.169") is None and _probe_behind(tmp_path) is None
