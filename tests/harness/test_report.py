"""The comparative report: formatting, findings, and a golden file on fixed run folders.

The fixture run folders under tests/data/report_golden/ are fabricated (fixed numbers, no
engine) and committed. To regenerate them and the golden reports after an intended change:

    BATCHLAB_UPDATE_GOLDEN=1 .venv/bin/pytest tests/harness/test_report.py
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from harness import report
from harness.metrics import Slo, summarize
from harness.report.curves import Baselines
from harness.results import (
    STEPS_FILE,
    SUMMARY_FILE,
    write_json_atomic,
    write_parquet_atomic,
    write_timelines,
)
from harness.timeline import RequestTimeline

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "report_golden"
SCENARIO_DIR = GOLDEN / "fixture-scenario"
UPDATE = os.environ.get("BATCHLAB_UPDATE_GOLDEN") == "1"
SLO = Slo(ttft_s=1.0, tpot_s=0.05)
METRICS_DOC = "../../docs/metrics.md"

# ---------------------------------------------------------------- fabricated fixtures

KNOBS = {
    "max_num_seqs": 16, "max_num_batched_tokens": 2048, "policy": "fcfs",
    "preemption": "recompute", "chunked_prefill": True, "weights_dtype": "bf16",
    "kv_cache_dtype": "bf16", "gpu_memory_utilization": 0.9, "prefix_caching": False,
    "tensor_parallel_size": 1, "max_model_len": None, "extra_args": [],
}
TRACE = {
    "source": "harness/data/azure_conv_excerpt.csv", "format": "azure",
    "digest": "3f2a9c0d1e7b5a4c8d6e2f1a0b9c8d7e", "notes": [], "counts": {},
    "stats": {"num_requests": 40, "span_s": 9.75, "prompt_tokens_mean": 450.0,
              "output_tokens_mean": 17.5},
}


def _timelines(ttft_s: float, tpot_s: float, *, live: bool = False, preempt_every: int = 0,
               fail_ids: tuple[int, ...] = (), short_ids: tuple[int, ...] = ()
               ) -> list[RequestTimeline]:
    """40 requests every 0.25 s; class 0 (every third request) served twice as fast."""
    out = []
    for i in range(40):
        arrival = 0.25 * i
        n = 5 + (i * 7) % 26
        prio = 0 if i % 3 == 0 else 1
        speed = 0.5 if prio == 0 else 1.0
        start = arrival + (0.002 * (i % 5) if live else 0.0)
        first = start + ttft_s * speed * (1 + (i % 4) / 4)
        produced = n - 2 if i in short_ids else n
        chunks = tuple(first + k * tpot_s * (1 + (i % 3) / 10) for k in range(produced))
        failed = i in fail_ids
        out.append(RequestTimeline(
            request_id=f"r{i}", arrival_s=arrival, num_prompt_tokens=100 + (i * 37) % 800,
            num_target_output_tokens=n, priority=prio,
            sent_s=start if live else None,
            chunk_times_s=chunks[:3] if failed else chunks,
            chunk_num_tokens=(1,) * (3 if failed else produced),
            finished_s=None if failed else chunks[-1],
            num_preemptions=1 if preempt_every and i % preempt_every == 0 else 0,
            error_kind="timeout" if failed else None,
            error_message="no completion within 30 s" if failed else "",
            finish_reason=None if failed else "length",
            token_count_source="usage" if live else "engine",
        ))
    return out


def _steps(num_running_cap: int, slowness: float) -> pa.Table:
    t = np.round(np.arange(0, 12, 0.1), 3)
    waiting = np.clip(np.round((np.sin(t) + 1) * 4 * slowness), 0, None).astype(np.int64)
    running = np.minimum(num_running_cap, (np.arange(t.size) % 9) + 1).astype(np.int64)
    used = (running * 12).astype(np.int64)
    zeros = np.zeros(t.size, dtype=np.int64)
    return pa.table({
        "t_s": t, "duration_s": np.full(t.size, 0.1), "num_running": running,
        "num_waiting": waiting, "num_prefill_tokens": zeros, "num_decode_tokens": running,
        "num_padded_tokens": zeros, "num_kv_blocks_used": used,
        "num_kv_blocks_total": np.full(t.size, 400, dtype=np.int64), "num_preempted": zeros,
    })


def _write_cell(name: str, timelines: list[RequestTimeline], *, knobs: dict, manifest: dict,
                steps: pa.Table | None, telemetry: pa.Table | None = None,
                live: bool = False) -> None:
    d = SCENARIO_DIR / name
    d.mkdir(parents=True, exist_ok=True)
    write_timelines(d, timelines, live=live)
    if steps is not None:
        write_parquet_atomic(steps, d / STEPS_FILE)
    if telemetry is not None:
        write_parquet_atomic(telemetry, d / report.TELEMETRY_FILE)
    write_json_atomic(summarize(timelines, slo=SLO), d / SUMMARY_FILE)
    base = {"kind": "live" if live else "simulated", "knobs": knobs, "trace": TRACE,
            "slo": SLO.as_dict(), "model": "llama-3.1-8b", "gpu": "h100-sxm",
            "command": ["batchlab", "run", "scenarios/fixture.yaml", "--only", name],
            "batchlab_version": "0.1.0", "host": "fixture-host",
            "created_at": "2025-01-01T00:00:00Z", "approximations": []}
    write_json_atomic({**base, **manifest}, d / report.MANIFEST_FILE)
    engine = manifest["engine"]["name"]
    write_json_atomic({"name": name, "engine": {"name": name.split("__")[0], "engine": engine,
                                                "mode": "live" if live else "simulated"},
                       "knobs": knobs, "grid": {}, "load": {"kind": "trace", "value": None},
                       "scenario": "fixture-scenario", "digest": "0" * 16},
                      d / report.CELL_FILE)
    write_json_atomic({"state": "done", "attempt": 1, "digest": "0" * 16},
                      d / report.STATUS_FILE)


def _reference_config(knobs: dict) -> dict:
    return {**{k: knobs[k] for k in ("policy", "preemption", "max_num_seqs",
                                     "max_num_batched_tokens", "chunked_prefill",
                                     "weights_dtype", "kv_cache_dtype")},
            "admission": "optimistic", "num_gpu_blocks": 400, "block_size": 16,
            "max_model_len": 8192}


def make_fixtures() -> None:
    """Write the fixture scenario folder: three simulated cells, one live, one failed."""
    if SCENARIO_DIR.exists():
        shutil.rmtree(SCENARIO_DIR)
    SCENARIO_DIR.mkdir(parents=True)
    cells = ["static", "continuous", "continuous-chunked", "vllm", "tgi"]
    write_json_atomic({
        "name": "fixture-scenario",
        "question": "Does continuous batching beat static batching on this trace?",
        "source": "scenarios/fixture.yaml",
        "trace": {"path": TRACE["source"], "options": {"limit": 40}},
        "model": "llama-3.1-8b", "gpu": "h100-sxm", "slo": SLO.as_dict(),
        "priority_classes": [{"name": "interactive", "share": 0.33, "priority": 0},
                             {"name": "batch", "share": 0.67, "priority": 1}],
        "baseline": "static", "cells": cells,
        "command": ["batchlab", "run", "scenarios/fixture.yaml"],
    }, SCENARIO_DIR / report.SCENARIO_FILE)
    static = {**KNOBS, "policy": "static", "chunked_prefill": False}
    cont = {**KNOBS, "chunked_prefill": False}
    chunked = dict(KNOBS)
    _write_cell("static", _timelines(3.2, 0.031), knobs=static, steps=_steps(16, 3.0),
                manifest={"engine": {"name": "reference", "mode": "simulated",
                                     "version": "0.1.0",
                                     "config": _reference_config(static)}})
    _write_cell("continuous", _timelines(0.41, 0.022, preempt_every=7),
                knobs=cont, steps=_steps(16, 1.0),
                manifest={"engine": {"name": "reference", "mode": "simulated",
                                     "version": "0.1.0",
                                     "config": _reference_config(cont)}})
    _write_cell("continuous-chunked", _timelines(0.18, 0.024, preempt_every=13),
                knobs=chunked, steps=_steps(16, 0.5),
                manifest={"engine": {"name": "reference", "mode": "simulated",
                                     "version": "0.1.0",
                                     "config": _reference_config(chunked)}})
    tele_t = np.round(np.arange(0, 12, 0.25), 3)
    telemetry = pa.table({
        "t_s": tele_t, "num_running": np.minimum(16, np.arange(tele_t.size) % 12 + 1),
        "num_waiting": np.arange(tele_t.size) % 3,
        "kv_usage": np.round(np.linspace(0.1, 0.6, tele_t.size), 3),
    })
    _write_cell(
        "vllm", _timelines(0.35, 0.021, live=True, fail_ids=(5, 17), short_ids=(8,)),
        knobs=chunked, steps=None, telemetry=telemetry, live=True,
        manifest={
            "engine": {"name": "vllm", "mode": "launch", "version": "0.6.3"},
            "mapping": [
                {"knob": "max_num_seqs", "value": 16, "flags": ["--max-num-seqs", "16"],
                 "status": "applied", "note": ""},
                {"knob": "chunked_prefill", "value": True,
                 "flags": ["--enable-chunked-prefill"], "status": "applied", "note": ""},
                {"knob": "preemption", "value": "recompute", "flags": [],
                 "status": "approximated", "note": "vLLM V1 always recomputes"},
            ],
            "client_limited": False,
        })
    tgi = SCENARIO_DIR / "tgi"
    tgi.mkdir()
    write_json_atomic({"state": "failed", "attempt": 1, "digest": "0" * 16,
                       "reason": "EngineError: engine would not start: "
                                 "text-generation-launcher: command not found"},
                      tgi / report.STATUS_FILE)


def _golden_context(scenario_dir: Path) -> tuple[list[report.CellResult], report.ReportContext]:
    meta, cells = report.load_scenario_dir(scenario_dir)
    ctx = report.scenario_context(meta, cells, scenario_dir, metrics_doc=METRICS_DOC)
    ctx = dataclasses.replace(ctx, rerender=["batchlab", "report", "reports/fixture-scenario"])
    return cells, ctx


def _check_golden(text: str, golden: Path) -> None:
    if UPDATE:
        golden.write_text(text)
    assert golden.exists(), f"{golden} missing: run with BATCHLAB_UPDATE_GOLDEN=1"
    assert text == golden.read_text(), (
        f"report differs from {golden}; if the change is intended, regenerate with "
        "BATCHLAB_UPDATE_GOLDEN=1")


@pytest.fixture(scope="module")
def fixture_scenario() -> Path:
    if UPDATE:
        make_fixtures()
    assert SCENARIO_DIR.exists(), "fixtures missing: run with BATCHLAB_UPDATE_GOLDEN=1"
    return SCENARIO_DIR


# ---------------------------------------------------------------- golden files


def test_scenario_report_matches_golden(fixture_scenario: Path, tmp_path: Path) -> None:
    cells, ctx = _golden_context(fixture_scenario)
    text = report.render_markdown(cells, ctx, tmp_path)
    _check_golden(text, GOLDEN / "expected_report.md")
    for png in ("latency_cdf.png", "engine_state.png", "throughput.png"):
        assert (tmp_path / png).stat().st_size > 1000, png
        assert f"]({png})" in text


def test_report_is_deterministic(fixture_scenario: Path, tmp_path: Path) -> None:
    cells, ctx = _golden_context(fixture_scenario)
    first = report.render_markdown(cells, ctx, tmp_path / "a", draw=False)
    second = report.render_markdown(cells, ctx, tmp_path / "b", draw=False)
    assert first == second


def test_single_run_report_matches_golden(fixture_scenario: Path, tmp_path: Path) -> None:
    run = tmp_path / "continuous"
    shutil.copytree(fixture_scenario / "continuous", run)
    (run / report.CELL_FILE).unlink()
    (run / report.STATUS_FILE).unlink()
    out = report.render_run_report(run, metrics_doc=METRICS_DOC)
    assert out == run / "report.md"
    text = out.read_text().replace(str(run), "RUN_DIR")
    _check_golden(text, GOLDEN / "expected_run_report.md")
    assert (run / "latency_cdf.png").exists()


def test_golden_report_content(fixture_scenario: Path, tmp_path: Path) -> None:
    """What a reader must find, whatever the exact wording."""
    cells, ctx = _golden_context(fixture_scenario)
    text = report.render_markdown(cells, ctx, tmp_path, draw=False)
    findings = text.split("## Key findings")[1].split("## Cells")[0]
    assert "the output tokens/s of `static`" in findings
    assert "TTFT p90 fell from" in findings
    assert "`tgi` did not finish: EngineError: engine would not start" in findings
    assert "`vllm` failed 2 of 40 requests (timeout 2)" in findings
    assert "Class `interactive` (priority 0)".replace("Class", "class") in findings
    assert "digest `3f2a9c0d1e7b`" in text
    assert "vllm 0.6.3 (live)" in text
    assert "preemption=recompute approximated (vLLM V1 always recomputes)" in text
    assert "`--max-num-seqs 16`" in text
    for section in ("## Latency", "### TTFT", "### TPOT", "### ITL", "### E2E latency",
                    "## Throughput", "## Goodput and SLO attainment", "## Preemptions",
                    "## Output-length fidelity", "## Failures", "## Per priority class",
                    "### Class interactive (priority 0)", "## Reproduce"):
        assert section in text, section
    assert f"[docs/metrics.md]({METRICS_DOC})" in text
    # The live cell is paired with the simulated cell of the same trace and knobs.
    assert "## Prediction fidelity" in text
    assert "### `vllm` measured, `continuous-chunked` predicted" in text
    assert "batchlab run scenarios/fixture.yaml" in text


def test_render_scenario_report_writes_files(fixture_scenario: Path, tmp_path: Path) -> None:
    copy = tmp_path / "fixture-scenario"
    shutil.copytree(fixture_scenario, copy)
    out = report.render_scenario_report(copy, baseline="continuous")
    assert out == copy / "report.md"
    text = out.read_text()
    assert "| Baseline | `continuous` |" in text
    assert (copy / "engine_state.png").exists()


def test_compare_run_folders_from_different_runs(fixture_scenario: Path, tmp_path: Path) -> None:
    """A simulated run and a live run, made at different times, compared in one report."""
    sim = tmp_path / "sim-2024"
    live = tmp_path / "vllm-2025"
    shutil.copytree(fixture_scenario / "continuous-chunked", sim)
    shutil.copytree(fixture_scenario / "vllm", live)
    for d in (sim, live):
        (d / report.CELL_FILE).unlink()
    out = report.render_comparison([sim, live], tmp_path / "cmp" / "report.md",
                                   baseline="sim-2024", metrics_doc=METRICS_DOC)
    text = out.read_text()
    assert "# Comparison of sim-2024, vllm-2025" in text
    assert "| Baseline | `sim-2024` |" in text
    assert "reference 0.1.0 (simulated); vllm 0.6.3 (live)" in text
    assert "`vllm-2025`" in text.split("## Key findings")[1]
    with pytest.raises(ValueError, match="no such cell"):
        report.render_comparison([sim, live], tmp_path / "x.md", baseline="nope")


def test_report_cli_rerenders_without_running(fixture_scenario: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cli import main

    copy = tmp_path / "fixture-scenario"
    shutil.copytree(fixture_scenario, copy)
    before = {p.name: p.stat().st_mtime_ns for p in copy.rglob("*.parquet")}
    assert main(["report", str(copy)]) == 0
    assert f"report: {copy / 'report.md'}" in capsys.readouterr().out
    after = {p.name: p.stat().st_mtime_ns for p in copy.rglob("*.parquet")}
    assert before == after
    out = tmp_path / "two.md"
    assert main(["report", str(copy / "static"), str(copy / "vllm"), "-o", str(out)]) == 0
    assert out.exists()
    assert main(["report", str(tmp_path / "missing")]) == 2


# ---------------------------------------------------------------- formatting


@pytest.mark.parametrize(("value", "text"), [
    (None, "–"), (float("nan"), "–"), (0.0, "0 ms"), (0.0000123, "12.3 µs"),
    (0.0009996, "1 ms"), (0.01234, "12.3 ms"), (0.9, "900 ms"), (0.9996, "1 s"),
    (14.23, "14.2 s"), (1234.5, "1,230 s"),
])
def test_fmt_seconds(value: float | None, text: str) -> None:
    assert report.fmt_seconds(value) == text


def test_number_and_delta_formats() -> None:
    assert report.fmt_number(12345.6, "tok/s") == "12,300 tok/s"
    assert report.fmt_number(0.5) == "0.5"
    assert report.fmt_pct(0.975) == "97.5%"
    assert report.fmt_pct(1.0) == "100%"
    assert report.fmt_delta(280, 100) == "2.8×"
    assert report.fmt_delta(0.9, 14.2) == "-94%"
    assert report.fmt_delta(101, 100) == "+1%"
    assert report.fmt_delta(100.2, 100) == "±0%"
    assert report.fmt_delta(5, 0) == ""
    assert report.fmt_delta(0.602, 169) == "1/281"  # a 99.6% fall is not shown as -100%
    assert report.table(["a", "b"], [["x|y", 1]]) == "| a | b |\n|:---|---:|\n| x\\|y | 1 |"


def test_findings_state_largest_difference_first() -> None:
    def cell(name: str, tps: float, ttft: float) -> report.CellResult:
        summary = {"throughput": {"output_tokens_per_s": tps},
                   "ttft_s": {"p90": ttft}, "tpot_s": {"p90": 0.02},
                   "num_requests": 10, "num_completed": 10, "num_failed": 0}
        return report.CellResult(name=name, run_dir=Path("."), state="done", summary=summary)

    base, small, big = cell("b", 100, 10.0), cell("small", 110, 9.0), cell("big", 280, 0.9)
    ctx = report.ReportContext(title="t")
    lines = report.key_findings([base, small, big], base, ctx, {})
    assert lines[0] == ("`big` served 2.8× the output tokens/s of `b` (280 vs 100 tok/s); "
                        "TTFT p90 fell from 10 s to 900 ms; TPOT p90 about the same "
                        "(20 ms vs 20 ms).")
    assert lines[1].startswith("`small` served 1.1× the output tokens/s")
    assert lines[2].startswith("Across all cells: highest output throughput `big` (280 tok/s)")


def _load_cell(engine: str, rate: float | None, tps: float) -> report.CellResult:
    summary = {"throughput": {"output_tokens_per_s": tps}, "ttft_s": {"p90": 0.1},
               "tpot_s": {"p90": 0.02}, "num_requests": 10, "num_completed": 10,
               "num_failed": 0}
    load = {"kind": "rate", "value": rate} if rate is not None else {}
    return report.CellResult(
        name=f"{engine}__rate-{rate}", run_dir=Path("."), state="done", summary=summary,
        cell={"engine": {"name": engine, "engine": "reference"}, "load": load})


def test_across_loads_each_cell_is_compared_at_its_own_load(tmp_path: Path) -> None:
    # prefix-caching.yaml: two settings at two loads. A change of load is not a change of
    # setting: `cache` at rate 4 is compared with `plain` at rate 4, never at rate 2.
    plain2, plain4 = _load_cell("plain", 2, 100), _load_cell("plain", 4, 180)
    cache2, cache4 = _load_cell("cache", 2, 120), _load_cell("cache", 4, 270)
    lonely = _load_cell("cache", 8, 300)  # the baseline setting never ran at rate 8
    cells = [plain2, plain4, cache2, cache4, lonely]
    bases = Baselines.of(cells, plain2)
    assert bases.per_load and bases.compared()
    assert [bases.of_cell(c) for c in cells] == [plain2, plain4, plain2, plain4, None]
    assert bases.phrase() == "the baseline setting plain at the same load"
    ctx = report.ReportContext(title="t", baseline="plain__rate-2")
    lines = report.key_findings(cells, plain2, ctx, {})
    assert any(line.startswith("`cache__rate-4` served 1.5× the output tokens/s of "
                               "`plain__rate-4` (270 vs 180 tok/s)") for line in lines)
    assert any(line.startswith("`cache__rate-2` served 1.2× the output tokens/s of "
                               "`plain__rate-2` (120 vs 100 tok/s)") for line in lines)
    assert not any(line.startswith(("`plain__rate-4`", "`cache__rate-8`")) for line in lines)
    # no leaders across loads (the lowest load would always lead on latency), and no load
    # here has the three cells a leaders line needs
    assert not any(line.startswith(("Across all cells", "At ")) for line in lines)
    third2, third4 = _load_cell("third", 2, 90), _load_cell("third", 4, 300)
    lines = report.key_findings([*cells, third2, third4], plain2, ctx, {})
    assert [line.split(":")[0] for line in lines if line.startswith("At ")] == \
        ["At 2 req/s", "At 4 req/s"]
    assert "At 4 req/s: highest output throughput `third__rate-4` (300 tok/s)" in "\n".join(lines)
    text = report.render_markdown(cells, ctx, tmp_path, draw=False)
    assert "in brackets the change against the baseline setting `plain` at the same load" in text
    rows = {line.split(" | ")[0]: line for line in text.splitlines()
            if line.startswith("| `") and "tok/s" not in line and line.count("|") == 7}
    assert "(+50%)" in rows["| `cache__rate-4`"] and "(" not in rows["| `plain__rate-4`"]
    assert "(" not in rows["| `cache__rate-8`"]


def test_at_one_load_every_cell_is_compared_with_the_baseline_cell() -> None:
    cells = [_load_cell("plain", None, 100), _load_cell("cache", None, 150)]
    bases = Baselines.of(cells, cells[0])
    assert not bases.per_load and [bases.of_cell(c) for c in cells] == [cells[0], cells[0]]
    assert bases.phrase(lambda t: f"`{t}`") == "the baseline `plain__rate-None`"
    single = Baselines.of(cells[:1], cells[0])
    assert not single.compared()  # one run: nothing to compare, no bracket sentence


def test_batch_size_sweep_findings_and_plot(tmp_path: Path) -> None:
    cells = []
    for bs, tpot, tps in ((1, 0.007, 140), (4, 0.008, 500), (16, 0.012, 1300),
                          (64, 0.04, 3200), (256, 0.09, 4100)):
        summary = {"throughput": {"output_tokens_per_s": tps}, "ttft_s": {"p90": 0.1},
                   "tpot_s": {"p50": tpot * 0.8, "p90": tpot}, "num_requests": 10,
                   "num_completed": 10, "num_failed": 0}
        cells.append(report.CellResult(
            name=f"bs__max_num_seqs-{bs}", run_dir=tmp_path, state="done", summary=summary,
            cell={"knobs": {**KNOBS, "max_num_seqs": bs},
                  "engine": {"name": "bs", "engine": "reference", "mode": "simulated"}}))
    ctx = report.ReportContext(title="t", slo={"tpot_s": 0.05})
    lines = report.key_findings(cells, cells[0], ctx, {})
    assert ("From max_num_seqs 1 to 256, output throughput rose 29× (140 to 4,100 tok/s) "
            "while TPOT p90 went from 7 ms to 90 ms.") in lines
    assert any(line.startswith("The largest max_num_seqs whose TPOT p90 meets the 50 ms TPOT "
                               "SLO is 64") for line in lines)
    text = report.render_markdown(cells, ctx, tmp_path)
    assert "](batch_size.png)" in text
    assert (tmp_path / "batch_size.png").exists()


def test_report_with_no_results(tmp_path: Path) -> None:
    failed = report.CellResult(name="x", run_dir=tmp_path, state="failed", reason="boom")
    text = report.render_markdown([failed], report.ReportContext(title="t"), tmp_path)
    assert "- No cell produced results." in text
    assert "- `x` did not finish: boom." in text


def test_golden_fixture_summaries_are_current(fixture_scenario: Path) -> None:
    """The committed summaries were produced by harness.metrics; flag drift in the schema."""
    summary = json.loads((fixture_scenario / "static" / SUMMARY_FILE).read_text())
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "throughput", "goodput", "by_priority",
                "output_length_fidelity", "failures", "num_preemptions"):
        assert key in summary, key


def test_one_trace_at_other_arrivals_is_one_line_only_for_load_points() -> None:
    from harness.report.runs import CellResult
    from harness.report.sections import header

    def cell(name: str, digest: str, load: dict[str, object] | None) -> CellResult:
        trace = {"source": "t.csv", "digest": digest, "stats": {"num_requests": 10}}
        return CellResult(name, Path(name), "done", summary={}, manifest={"trace": trace},
                          cell={"load": load} if load else {})

    def trace_row(cells: list[CellResult]) -> str:
        lines = header(cells, None, report.ReportContext(title="t"))
        return next(ln for ln in lines[-2].splitlines() if ln.startswith("| Trace"))

    at_loads = [cell("a", "d1", {"kind": "rate", "value": 1}),
                cell("b", "d2", {"kind": "rate", "value": 2})]
    assert "arrivals at each cell's load (2 arrival schedules" in trace_row(at_loads)
    # two runs of the trace at other timings, not load points of one scenario: two lines
    runs = [cell("a", "d1", None), cell("b", "d2", None)]
    assert trace_row(runs).count("<br>") == 1 and "each cell's load" not in trace_row(runs)


def test_the_cells_table_gives_the_knobs_that_took_effect(tmp_path: Path) -> None:
    """A profile's engine defaults (here prefix caching) are in manifest.json, not in the
    scenario's cell.json: the report must show what ran, not what the scenario asked."""
    from harness.report.runs import CellResult
    from harness.report.sections import cells_section

    asked = {"max_num_seqs": 64, "prefix_caching": False}
    plain = CellResult("plain", tmp_path / "a", "done", summary={},
                       manifest={"knobs": asked}, cell={"knobs": asked})
    profiled = CellResult("profiled", tmp_path / "b", "done", summary={},
                          manifest={"knobs": {**asked, "prefix_caching": True}},
                          cell={"knobs": asked})
    never_ran = CellResult("never-ran", tmp_path / "c", "not_run", cell={"knobs": asked})
    assert profiled.knobs["prefix_caching"] is True
    assert profiled.asked_knobs["prefix_caching"] is False
    assert never_ran.knobs == asked
    text = "\n".join(cells_section([plain, profiled, never_ran]))
    assert "| `plain` | – | – | false |" in text
    assert "| `profiled` | – | – | true |" in text
    assert "Knobs common to every cell: max_num_seqs=64." in text


def test_a_class_itl_tail_is_named_when_it_moved_unlike_tpot(tmp_path: Path) -> None:
    """The chunked-prefill question: a chunk budget that leaves TPOT alone but lets a long
    prefill share a step with chat decodes shows in the chat class's ITL p99 alone."""
    from harness.report.context import ReportContext
    from harness.report.findings import _priority_findings
    from harness.report.runs import CellResult

    def cell(name: str, itl_p99: float) -> CellResult:
        cls = {"ttft_s": {"p90": 1.0}, "tpot_s": {"p90": 0.03}, "itl_s": {"p99": itl_p99}}
        return CellResult(name, tmp_path / name, "done",
                          summary={"by_priority": {"0": cls, "1": cls}})

    base, same, worse = cell("base", 0.06), cell("same", 0.065), cell("worse", 0.24)
    texts = _priority_findings([base, same, worse], Baselines.of([base, same, worse], base),
                               ReportContext(title="t"))
    assert texts == ["Under `worse` rather than `base`: class priority 0 TTFT p90 about the "
                     "same (1 s vs 1 s), ITL p99 rose from 60 ms to 240 ms; class priority 1 "
                     "TTFT p90 about the same (1 s vs 1 s), ITL p99 rose from 60 ms to 240 ms."]


def test_a_class_worst_gap_is_named_when_it_moved_against_its_itl_p99(tmp_path: Path) -> None:
    """Whole-prompt prefills stall chat decodes for a few steps in a thousand: p99 cannot see
    it, so a chunk budget that raised ITL p99 while it cut the worst gap must say both."""
    from harness.report.context import ReportContext
    from harness.report.findings import _priority_findings
    from harness.report.runs import CellResult

    def cell(name: str, itl_p99: float, itl_max: float) -> CellResult:
        cls = {"ttft_s": {"p90": 1.0}, "tpot_s": {"p90": 0.03},
               "itl_s": {"p99": itl_p99, "max": itl_max}}
        return CellResult(name, tmp_path / name, "done", summary={"by_priority": {"0": cls,
                                                                                  "1": cls}})

    base, chunked = cell("whole", 0.058, 1.23), cell("chunked", 0.226, 0.377)
    [text] = _priority_findings([base, chunked], Baselines.of([base, chunked], base),
                                ReportContext(title="t"))
    assert "ITL p99 rose from 58 ms to 226 ms, its worst token gap fell from 1.23 s to 377 ms" \
        in text


def test_a_capacity_searchs_class_findings_start_at_its_capacity(tmp_path: Path) -> None:
    """fcfs against priority, searched: the per-class findings compared the failing probes
    (their gaps are larger) and never the capacity load, the search's answer."""
    from harness.report.context import ReportContext
    from harness.report.findings import _priority_findings
    from harness.report.runs import CellResult

    def cell(name: str, ttft0: float, ttft1: float) -> CellResult:
        return CellResult(name, tmp_path / name, "done", summary={"by_priority": {
            "0": {"ttft_s": {"p90": ttft0}}, "1": {"ttft_s": {"p90": ttft1}}}})

    cells = [cell("fcfs/rate-8", 0.31, 0.29), cell("fcfs/rate-9.5", 1.38, 1.46),
             cell("fcfs/rate-8.7", 0.68, 0.85), cell("fcfs/rate-8.4", 0.48, 0.54),
             cell("priority/rate-8", 0.13, 0.36), cell("priority/rate-9.5", 0.2, 1.67),
             cell("priority/rate-8.7", 0.17, 1.08), cell("priority/rate-8.4", 0.14, 0.66)]
    by_name = {c.name: c for c in cells}
    bases = Baselines(cells[0], {c.name: by_name[c.name.replace("priority", "fcfs")]
                                 for c in cells}, per_load=True)
    texts = _priority_findings(cells, bases, ReportContext(title="t"))
    assert not any(t.startswith("Under `priority/rate-8` ") for t in texts)  # gaps largest
    texts = _priority_findings(cells, bases, ReportContext(title="t"),
                               first={"priority/rate-8", "fcfs/rate-8"})
    assert texts[0] == ("Under `priority/rate-8` rather than `fcfs/rate-8`: class priority 0 "
                        "TTFT p90 fell from 310 ms to 130 ms; class priority 1 TTFT p90 rose "
                        "from 290 ms to 360 ms.")
