"""Published measurements, shipped engine profiles, the fit, and docs/fidelity.md."""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from adapters.base import Knobs
from adapters.reference.config import ConfigError, ReferenceConfig
from adapters.reference.cost_model import (
    PROFILES_DIR,
    CostModelParams,
    ProfileError,
    load_profile,
    resolve_profile,
    shipped_profiles,
)
from harness.metrics import summarize
from harness.published import cli
from harness.published.check import (
    FIDELITY_MD,
    CheckedRow,
    _fmt,
    check_rows,
    error_stats,
    fidelity_digest,
    inputs_digest,
    render_text,
    stats_by_kind,
)
from harness.published.fit import HELD_OUT_SOURCES, fit_profile, split
from harness.published.frozen import evaluate, freeze
from harness.published.profiles import SCHEDULER_KEYS, read_profile
from harness.published.refit import _fit_metadata
from harness.published.replay import (
    RowPrediction,
    closed_loop_timelines,
    metric_value,
    predict_row,
    row_config,
    row_workload,
    window_summary,
)
from harness.published.rows import MEASUREMENTS_CSV, PublishedRow, RowError, load_rows, sources
from harness.published.sensitivity import workload_published
from harness.sim import simulate
from harness.target import ClosedLoop
from harness.timeline import RequestTimeline

# ---------------------------------------------------------------- the data set


def test_measurements_cover_the_engines_gpus_and_sources() -> None:
    rows = load_rows()
    assert len(rows) >= 40
    assert len(sources(rows)) >= 4
    assert {r.engine for r in rows} == {"vllm", "trtllm", "tgi"}
    assert {"h100-sxm", "h200", "a100-80gb"} <= {r.gpu for r in rows}
    assert {"llama-3.1-8b", "llama-3.1-70b"} <= {r.model for r in rows}
    assert {"bf16", "fp8"} <= {r.weights_dtype for r in rows}
    assert {"offline", "rate", "concurrency"} == {r.arrival for r in rows}
    assert any(r.metric.startswith("ttft") for r in rows)
    for r in rows:
        assert r.source and r.source_date, r.row_id
        assert r.profile_name in shipped_profiles(), r.row_id


def test_held_out_sources_are_whole_and_at_least_a_third() -> None:
    rows = load_rows()
    train, held = split(rows)
    assert len(held) * 3 >= len(rows)
    assert not {r.source_id for r in train} & {r.source_id for r in held}
    assert set(HELD_OUT_SOURCES) <= set(sources(rows))


# ---------------------------------------------------------------- profiles


def test_profile_by_name_and_by_path_are_the_same() -> None:
    path = resolve_profile("vllm-h100-sxm")
    assert path.name == "vllm-h100-sxm.json" and path.exists()
    assert load_profile("vllm-h100-sxm") == load_profile(path)
    assert load_profile(str(path)) == load_profile(path)
    config = ReferenceConfig(model="llama-3.1-8b", profile="vllm-h100-sxm")
    assert config.gpu_spec.name == "h100-sxm"
    assert config.params == load_profile(path)


def test_trtllm_profiles_start_and_reject_prompts_over_the_step_budget() -> None:
    """TensorRT-LLM runs with chunked prefill off and a context longer than max_num_tokens,
    rejecting each prompt that does not fit one step; vLLM's rule refuses such a setup."""
    def config(given: dict, profile: str | None = "trtllm-h100-sxm") -> ReferenceConfig:
        return ReferenceConfig.from_knobs(Knobs.from_mapping(given), model="llama-3.1-8b",
                                          gpu=None, profile=profile)

    trt = config({})
    assert not trt.chunked_prefill and trt.oversized_prompts == "reject"
    assert trt.resolved_max_model_len > trt.max_num_batched_tokens
    assert trt.as_dict()["oversized_prompts"] == "reject"
    for name in ("trtllm-h200", "trtllm-a100-80gb"):
        assert config({}, profile=name).oversized_prompts == "reject"
    assert config({}, profile="vllm-h100-sxm").oversized_prompts == "refuse"
    with pytest.raises(ConfigError) as plain:  # chunked prefill off by the user: vLLM's rule
        config({"chunked_prefill": False, "max_num_batched_tokens": 8192}, profile=None)
    assert "profile" not in str(plain.value) and "vLLM's rule" in str(plain.value)
    # a budget nobody set is vLLM's own default then: max(max_model_len, its usual budget)
    unset = config({"chunked_prefill": False}, profile=None)
    assert unset.max_num_batched_tokens == unset.resolved_max_model_len == 131072
    short = config({"chunked_prefill": False, "max_model_len": 4096}, profile=None)
    assert short.max_num_batched_tokens == 8192
    vllm = config({"chunked_prefill": False}, profile="vllm-h100-sxm")
    assert vllm.max_num_batched_tokens == vllm.resolved_max_model_len
    # and the static policy under TensorRT-LLM's profile keeps its budget: it rejects instead
    static = config({"policy": "static"})
    assert static.max_num_batched_tokens == trt.max_num_batched_tokens


def test_a_profile_that_turns_chunked_prefill_off_says_so_when_prompts_cannot_fit(
        tmp_path: Path) -> None:
    """A profile file that turns chunked prefill off but keeps vLLM's rule: the refusal names
    the profile, since the user never turned chunked prefill off."""
    body = json.loads((PROFILES_DIR / "trtllm-h100-sxm.json").read_text())
    del body["metadata"]["scheduler"]["oversized_prompts"]
    path = tmp_path / "no-chunking.json"
    path.write_text(json.dumps(body))
    with pytest.raises(ConfigError, match=r"profile .*no-chunking.json turns chunked prefill "
                                          r"off"):
        ReferenceConfig.from_knobs(Knobs.from_mapping({"max_num_batched_tokens": 8192}),
                                   model="llama-3.1-8b", gpu=None, profile=str(path))


def test_unknown_profile_name_lists_the_shipped_ones() -> None:
    with pytest.raises(ProfileError, match="vllm-h100-sxm"):
        load_profile("no-such-engine-h100")


def test_profile_path_that_does_not_exist_is_an_error(tmp_path) -> None:
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "missing.json")


@pytest.mark.parametrize("name", shipped_profiles())
def test_shipped_profile_has_scheduler_defaults_with_sources_and_fit(name: str) -> None:
    profile = read_profile(name)
    assert name == f"{profile.engine}-{profile.gpu}"
    assert profile.params.device == profile.gpu
    sched = profile.raw["metadata"]["scheduler"]
    for key in ("max_num_seqs", "max_num_batched_tokens", "chunked_prefill", "admission"):
        assert key in sched and key in sched["sources"], key
    assert set(profile.scheduler) <= set(SCHEDULER_KEYS)
    ids = {r.row_id for r in load_rows()}
    fit = profile.fit
    assert set(fit.get("train_row_ids", [])) <= ids
    assert set(fit.get("held_out_row_ids", [])) <= ids
    assert fit.get("fitted") or fit.get("coefficients_from")


def test_engine_settings_override_the_profile() -> None:
    row = _row("x", arrival="offline", arrival_value=None,
               engine_settings="max_num_seqs=256;chunked_prefill=false;"
                                    "frontend_latency_s=0")
    config = row_config(row, read_profile("vllm-h100-sxm"))
    assert config.max_num_seqs == 256 and not config.chunked_prefill
    assert config.max_num_batched_tokens >= config.resolved_max_model_len
    assert config.params.frontend_latency_s == 0


# ---------------------------------------------------------------- simulating a row


def _row(row_id: str, **kw: object) -> PublishedRow:
    base: dict[str, object] = dict(
        row_id=row_id, source_id="synthetic", source="test", source_date="2026-01-01",
        engine="vllm", engine_version="test", gpu="h100-sxm", model="llama-3.1-8b",
        weights_dtype="bf16", kv_cache_dtype="bf16", tensor_parallel_size=1,
        input_tokens=256, output_tokens=64, dataset="synthetic-fixed", num_requests=4,
        arrival="concurrency", arrival_value=1.0, metric="itl_mean_s", value=1.0,
        window="run", engine_settings="", notes="")
    base.update(kw)
    return PublishedRow(**base)  # type: ignore[arg-type]


def test_closed_loop_sends_each_request_when_a_client_frees() -> None:
    def tl(i: int, first: float, end: float) -> RequestTimeline:
        return RequestTimeline(f"r{i}", 0.0, 8, 2, chunk_times_s=(first, end),
                               chunk_num_tokens=(1, 1), finished_s=end, num_output_tokens=2)

    timelines = [tl(0, 1.0, 2.0), tl(1, 1.0, 3.0), tl(2, 2.5, 4.0), tl(3, 3.5, 5.0)]
    out = closed_loop_timelines(timelines, concurrency=2, frontend_latency_s=0.1)
    assert [t.start_s for t in out] == [0.0, 0.0, 1.9, 2.9]
    assert out[2].ttft_s() == pytest.approx(0.6)


@pytest.mark.parametrize("kw", [
    dict(arrival="offline", arrival_value=None, num_requests=64, metric="output_tok_s"),
    dict(arrival="concurrency", arrival_value=4.0, num_requests=16, metric="ttft_mean_s"),
    dict(arrival="concurrency", arrival_value=4.0, num_requests=16, metric="itl_p50_s",
         kv_cache_dtype="fp8"),
])
def test_frozen_schedule_retimes_exactly_like_a_simulation(kw: dict[str, object]) -> None:
    row = _row("frozen", **kw)
    profile = read_profile("vllm-h100-sxm")
    frozen = freeze(row, profile, CostModelParams())
    other = replace(CostModelParams(), memory_efficiency=0.6, compute_efficiency=0.4,
                    step_overhead_s=2e-3, per_seq_overhead_s=3e-5, frontend_latency_s=0.02,
                    per_fp8_kv_token_overhead_s=2e-8)
    assert evaluate(frozen, other) == pytest.approx(
        predict_row(row, profile, other, emulate_closed_loop=True).predicted, rel=1e-9)


def test_fit_recovers_the_coefficients_that_generated_the_rows() -> None:
    truth = replace(CostModelParams(), memory_efficiency=0.7, compute_efficiency=0.45,
                    step_overhead_s=1.5e-3, per_seq_overhead_s=2e-5,
                    frontend_latency_s=0.012, allreduce_latency_s=8e-6,
                    per_fp8_kv_token_overhead_s=2e-8)
    shapes: list[dict[str, Any]] = [
        dict(arrival="offline", arrival_value=None, input_tokens=128, output_tokens=128,
             num_requests=256, metric="output_tok_s"),
        dict(arrival="offline", arrival_value=None, input_tokens=2048, output_tokens=16,
             num_requests=64, metric="output_tok_s"),
        dict(arrival="offline", arrival_value=None, input_tokens=16, output_tokens=256,
             num_requests=512, metric="output_tok_s"),
        dict(input_tokens=256, output_tokens=64, metric="itl_mean_s"),
        dict(input_tokens=256, output_tokens=64, metric="ttft_mean_s"),
        dict(input_tokens=4096, output_tokens=8, metric="ttft_mean_s"),
        dict(arrival_value=64.0, input_tokens=512, output_tokens=128, num_requests=128,
             metric="tpot_mean_s"),
        # tensor-parallel steps pay the all-reduces; an FP8 KV cache pays per token read
        dict(tensor_parallel_size=2, input_tokens=256, output_tokens=64, metric="itl_mean_s"),
        dict(tensor_parallel_size=2, arrival="offline", arrival_value=None, input_tokens=128,
             output_tokens=128, num_requests=256, metric="output_tok_s"),
        dict(kv_cache_dtype="fp8", input_tokens=4096, output_tokens=64, metric="itl_mean_s"),
        dict(kv_cache_dtype="fp8", arrival="offline", arrival_value=None, input_tokens=2048,
             output_tokens=128, num_requests=64, metric="output_tok_s"),
    ]
    assert CostModelParams().allreduce_latency_s != truth.allreduce_latency_s
    assert CostModelParams().per_fp8_kv_token_overhead_s != truth.per_fp8_kv_token_overhead_s
    profile = read_profile("vllm-h100-sxm").with_params(CostModelParams())
    rows = []
    for i, kw in enumerate(shapes):
        row = _row(f"synthetic-{i}", **kw)
        # the fit's own model of a closed loop (the emulation its frozen schedules need)
        value = predict_row(row, profile, truth, emulate_closed_loop=True).predicted
        rows.append(replace(row, value=value))
    # no prior: the optimiser and the frozen re-timing alone must land on the truth (with
    # the default evaluation budget: 800 stops short of it with seven coefficients)
    result = fit_profile(profile, rows, rounds=1, max_evals=1500, prior_weight=0.0)
    names = ("memory_efficiency", "compute_efficiency", "step_overhead_s",
             "per_seq_overhead_s", "frontend_latency_s", "allreduce_latency_s",
             "per_fp8_kv_token_overhead_s")
    assert result.coefficients == names
    for name in names:
        assert getattr(result.params, name) == pytest.approx(getattr(truth, name), rel=0.05), name


# ---------------------------------------------------------------- the check and its document


def test_fidelity_doc_is_current() -> None:
    text = FIDELITY_MD.read_text()
    assert fidelity_digest(text) == inputs_digest(), (
        "docs/fidelity.md is stale: run `batchlab check-published --write-docs`")
    rows = {r.row_id: r for r in load_rows()}
    # a few of the rows quickest to simulate, of every kind of workload: a batch, a vLLM and
    # a TGI closed loop over the whole run, TensorRT-LLM's Poisson arrivals at a rate, and a
    # closed loop's steady window (NIM)
    quick = ["fp8kv-8b-bf16-b1-1024-itl", "vci-8b-h200-tp1-latency",
             "tgiv3-tgi-70b-h100-tp8-long", "trt014-8b-h100-sxm-tp1-467-16-qps16-ttft",
             "nim-70b-h100-tp2-c5-tput"]
    kinds = {(rows[i].engine, rows[i].arrival, rows[i].window) for i in quick}
    assert {("trtllm", "rate", "run"), ("trtllm", "concurrency", "steady"),
            ("tgi", "concurrency", "run")} <= kinds
    for c in check_rows([rows[i] for i in quick], jobs=1):
        line = next(ln for ln in text.splitlines() if ln.startswith(f"| `{c.row.row_id}` |"))
        assert f"| {_fmt(c.prediction.predicted)} |" in line, (
            f"docs/fidelity.md is stale for {c.row.row_id}: run "
            "`batchlab check-published --write-docs`")


def test_profiles_record_their_fit_errors() -> None:
    fit = read_profile("trtllm-h100-sxm").fit
    assert fit["fitted"] and fit["train"]["num_rows"] > 0 and fit["held_out"]["num_rows"] > 0
    assert json.dumps(fit)  # plain JSON


def _fidelity_table(section: str) -> list[list[str]]:
    """The body rows of the table under ``## section`` in docs/fidelity.md, as cells."""
    text = FIDELITY_MD.read_text().split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return [[c.strip().strip("`") for c in line.strip().strip("|").split("|")]
            for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| rows ")]


def test_profiles_store_the_errors_docs_fidelity_shows() -> None:
    """`batchlab profiles` and the predicted-figure labels read each profile's stored fit
    errors; docs/fidelity.md computes them afresh. Both must print the same percentages."""
    def shown(stats: dict[str, Any]) -> tuple[int, str, str, str]:
        return (stats["num_rows"], f"{100 * stats['median_abs_error']:.1f}%",
                f"{100 * stats['worst_abs_error']:.1f}%", stats["worst_row_id"])

    summary = {row[0]: (int(row[1]), row[2], row[3], row[4])
               for row in _fidelity_table("Summary")}
    by_kind = {(row[0], row[1]): (int(row[2]), row[3], row[4], row[5])
               for row in _fidelity_table("By kind of figure")}
    compared = 0
    for name in shipped_profiles():
        fit = read_profile(name).fit
        for key, label in (("train", "train"), ("held_out", "held-out")):
            if fit.get(key):
                assert summary.pop(f"{name}, {label}") == shown(fit[key]), (name, key)
                compared += 1
        for kind, stats in fit["held_out_by_kind"].items():
            assert by_kind.pop((f"{name}, held-out", kind)) == shown(stats), (name, kind)
            compared += 1
    # every profile row of the two tables was one of a profile's records
    assert not [k for k in summary if k.startswith(tuple(shipped_profiles()))]
    assert not [k for k in by_kind if k[0].startswith(tuple(shipped_profiles()))]
    assert compared >= 20


@pytest.mark.parametrize("name", ["tgi-h100-sxm", "trtllm-a100-80gb", "vllm-a100-80gb",
                                  "vllm-h200"])
def test_a_small_profiles_stored_held_out_errors_are_its_rows_simulated_now(name: str) -> None:
    """The held-out errors a profile stores (shown by `batchlab profiles` and the predicted
    labels) are those of its held-out rows simulated with it today, not stale numbers."""
    fit = read_profile(name).fit
    held = [r for r in load_rows()
            if r.profile_name == name and r.source_id in HELD_OUT_SOURCES]
    assert 0 < len(held) <= 4 and [r.row_id for r in held] == fit["held_out_row_ids"]
    checked = check_rows(held, jobs=1)
    assert all(c.held_out for c in checked)
    errors = [c.error for c in checked]
    stored = fit["held_out"]
    assert stored["num_rows"] == len(held)
    assert stored["median_abs_error"] == pytest.approx(
        float(np.median(np.abs(errors))), abs=1e-6)
    assert stored["worst_abs_error"] == pytest.approx(max(map(abs, errors)), abs=1e-6)
    assert stored["worst_row_id"] == held[int(np.argmax(np.abs(errors)))].row_id
    assert stored["num_over"] == sum(e > 0 for e in errors)
    assert stored["sources"] == sorted({r.source_id for r in held})
    stats = error_stats(checked)
    assert stats is not None and stats.as_dict() == stored
    assert {kind: s.as_dict() for kind, s in stats_by_kind(checked).items()} == \
        fit["held_out_by_kind"]
    published = error_stats(c for c in checked if workload_published(c.row))
    assert (published.as_dict() if published else None) == fit["held_out_workload_published"]


def test_check_published_cli_for_one_profile(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    cli.check_add_arguments(parser)
    assert cli.check_run(parser.parse_args(["--profile", "tgi-h100-sxm", "--jobs", "1"])) == 0
    said = capsys.readouterr()
    out = said.out
    # before a wait that may last minutes, stderr says what is simulated
    assert said.err == ("simulating 2 published rows, each with its whole published request "
                        "count (220 requests; all of the rows take about two minutes on two "
                        "cores)\n")
    assert "tgiv3-tgi-70b-h100-tp8-long" in out and "held-out" in out
    # TGI's held-out figures are run durations: throughput, the only kind it was measured on
    stats = read_profile("tgi-h100-sxm").fit["held_out_by_kind"]["throughput"]
    assert [ln for ln in out.splitlines() if ln.startswith("  held-out ")] == [
        f"  held-out throughput: {stats['num_rows']} rows, median |error| "
        f"{100 * stats['median_abs_error']:.1f}%, worst {100 * stats['worst_abs_error']:.1f}% "
        f"({stats['worst_row_id']}), {stats['num_over']} predicted high"]

    assert cli.check_run(parser.parse_args(["--profile", "nope"])) == 2


def test_check_published_names_the_engine_of_a_calibrated_profile(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A profile `batchlab calibrate` wrote records its engine as an object: the refusal names
    the engine, not the object, and says what the published figures are of."""
    raw = json.loads(read_profile("vllm-h100-sxm").path.read_text())
    raw["metadata"]["engine"] = {"name": "reference", "version": "0.1.0",
                                 "base_url": "http://127.0.0.1:8000"}
    raw["metadata"].pop("fit", None)
    path = tmp_path / "calibrated.json"
    path.write_text(json.dumps(raw))
    parser = argparse.ArgumentParser()
    cli.check_add_arguments(parser)
    assert cli.check_run(parser.parse_args(["--profile", str(path)])) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"batchlab check-published: error: --profile {path}: no published "
                          "rows for engine 'reference' on h100-sxm (the published figures are "
                          "of tgi, trtllm, vllm")
    assert "base_url" not in err


_PROFILES_LINE = re.compile(
    r"(?P<name>\S+) +(?P<fitted>yes|from \S+) +(?P<train_rows>\d+) +(?P<train_median>\S+) "
    r"+(?P<held_rows>\d+) +(?P<held_median>\S+) +(?P<held_worst>\S+) "
    r"+(?P<published>\d+, \S+, \S+)  (?P<by_kind>\S.*)")


def test_profiles_cli_lists_every_profile(capsys: pytest.CaptureFixture[str]) -> None:
    def pct(stats: dict[str, Any] | None, key: str) -> str:
        return f"{100 * stats[key]:.1f}%" if stats else "-"

    parser = argparse.ArgumentParser()
    cli.profiles_add_arguments(parser)
    assert cli.profiles_run(parser.parse_args([])) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "profile", "fitted", "train", "rows", "train", "median", "held-out", "rows", "held-out",
        "median", "held-out", "worst", "published", "workload:", "n,", "median,", "worst",
        "held-out", "figures", "by", "kind"]
    table = lines[1:lines.index("")]
    assert [ln.split(" ", 1)[0] for ln in table] == shipped_profiles()
    for name, line in zip(shipped_profiles(), table, strict=True):
        m = _PROFILES_LINE.fullmatch(line)
        assert m is not None, line
        fit = read_profile(name).fit
        train, held = fit.get("train"), fit.get("held_out")
        pub = fit.get("held_out_workload_published")
        assert held is not None and held["num_rows"] > 0, name
        assert m["fitted"] == ("yes" if fit["fitted"] else f"from {fit['coefficients_from']}")
        assert m.group("train_rows", "train_median") == (
            str(train["num_rows"] if train else 0), pct(train, "median_abs_error")), name
        assert m.group("held_rows", "held_median", "held_worst") == (
            str(held["num_rows"]), pct(held, "median_abs_error"),
            pct(held, "worst_abs_error")), name
        assert m["published"] == (
            f"{pub['num_rows']}, {pct(pub, 'median_abs_error')}, {pct(pub, 'worst_abs_error')}"
            if pub else "0, -, -"), name
        assert m["by_kind"] == ", ".join(
            f"{kind} {s['num_rows']} ({100 * s['median_abs_error']:.1f}%)"
            for kind, s in fit["held_out_by_kind"].items()), name


def test_check_published_with_a_profile_file(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / "my-tgi.json"
    mine.write_text(resolve_profile("tgi-h100-sxm").read_text())
    parser = argparse.ArgumentParser()
    cli.check_add_arguments(parser)
    assert cli.check_run(parser.parse_args(["--profile", str(mine)])) == 0
    assert "tgiv3-tgi-70b-h100-tp8-small" in capsys.readouterr().out


# ---------------------------------------------------------------- closed loops and their window


def _loop_row(**kw: object) -> PublishedRow:
    defaults: dict[str, object] = dict(output_tokens=32, num_requests=24, arrival_value=4.0,
                                       metric="ttft_mean_s")
    return _row("w", **{**defaults, **kw})


def _tl(i: int, sent: float, first: float, end: float) -> RequestTimeline:
    return RequestTimeline(f"r{i}", sent, 8, 3, chunk_times_s=(first, (first + end) / 2, end),
                           chunk_num_tokens=(1, 1, 1), finished_s=end, num_output_tokens=3)


def test_a_steady_window_leaves_out_the_ramp_and_the_drain() -> None:
    # two users, eight requests: r0, r1 are the ramp, r6, r7 the drain
    timelines = [_tl(0, 0.0, 5.0, 6.0), _tl(1, 0.0, 5.0, 7.0)]
    for i in range(2, 8):
        sent = float(i + 4)
        timelines.append(_tl(i, sent, sent + 1.0, sent + 2.0))
    row = _loop_row(arrival_value=2.0, window="steady")
    summary = window_summary(list(reversed(timelines)), row)  # order does not matter
    assert summary["num_requests"] == 4  # r2..r5
    assert summary["ttft_s"]["mean"] == pytest.approx(1.0)  # the ramp's 5 s TTFTs left out
    # window: from r2's send (6 s) to r6's send (10 s); tokens of every request inside it
    t0, t1 = 6.0, 10.0
    tokens = sum(t0 <= t < t1 for tl in timelines for t in tl.chunk_times_s)
    done = sum(t0 <= tl.finished_s < t1 for tl in timelines if tl.finished_s is not None)
    assert summary["throughput"]["output_tokens_per_s"] == pytest.approx(tokens / (t1 - t0))
    assert summary["throughput"]["requests_per_s"] == pytest.approx(done / (t1 - t0))
    # the whole run, for comparison
    whole = window_summary(timelines, replace(row, window="run"))
    assert whole["num_requests"] == 8 and whole["ttft_s"]["mean"] > 1.0


def test_a_steady_window_needs_three_rounds_of_requests() -> None:
    timelines = [_tl(i, float(i), i + 1.0, i + 2.0) for i in range(5)]
    with pytest.raises(ValueError, match="at least 3 x 2 requests"):
        window_summary(timelines, _loop_row(arrival_value=2.0, window="steady"))


def test_a_concurrency_row_is_simulated_as_a_closed_loop() -> None:
    row = _loop_row()
    profile = read_profile("vllm-h100-sxm")
    work = row_workload(row, profile)
    timelines = simulate(work.requests, work.config, closed_loop=ClosedLoop(4)).timelines
    expected = metric_value(summarize(timelines, by_priority=False), row.metric)
    assert predict_row(row, profile).predicted == pytest.approx(expected, rel=1e-12)
    # never more than 4 requests in the system
    events = sorted([(tl.start_s, 1) for tl in timelines]
                    + [(tl.finished_s or 0.0, -1) for tl in timelines], key=lambda e: (e[0], e[1]))
    in_flight = peak = 0
    for _, delta in events:
        in_flight += delta
        peak = max(peak, in_flight)
    assert peak <= 4


def test_the_fit_can_still_ask_for_its_emulated_loop() -> None:
    row = _loop_row(metric="tpot_mean_s")
    profile = read_profile("vllm-h100-sxm")
    simulated = predict_row(row, profile, CostModelParams()).predicted
    emulated = predict_row(row, profile, CostModelParams(),
                           emulate_closed_loop=True).predicted
    assert emulated == pytest.approx(simulated, rel=0.2)  # same loop, two models of it


def test_only_closed_loops_have_a_steady_window(tmp_path: Path) -> None:
    lines = MEASUREMENTS_CSV.read_text().splitlines()
    header = lines[0].split(",")
    offline = next(i for i, ln in enumerate(lines) if ",offline,," in ln)
    bad = lines[offline].replace(",run,", ",steady,", 1)
    (tmp_path / "m.csv").write_text("\n".join([lines[0], bad]) + "\n")
    assert "window" in header
    with pytest.raises(RowError, match=r"m\.csv:2: window 'steady' needs arrival"):
        load_rows(tmp_path / "m.csv")


def test_the_nim_rows_are_steady_windows_and_the_rest_whole_runs() -> None:
    rows = load_rows()
    steady = {r.source_id for r in rows if r.window == "steady"}
    assert steady == {"nim-llama-3.3-70b-1.8.0"}
    assert all(r.arrival == "concurrency" for r in rows if r.window == "steady")


def test_a_fit_records_the_held_out_error_of_each_kind_of_figure() -> None:
    rows = [r for r in load_rows() if r.profile_name == "trtllm-h100-sxm"]
    held = set(HELD_OUT_SOURCES)
    # each row off by a known ratio: 10% for throughput, 20% for TTFT, 30% for TPOT/ITL
    off = {"throughput": 1.1, "TTFT": 0.8, "TPOT/ITL": 1.3, "E2E": 1.0}
    checked = [CheckedRow(r, RowPrediction(r.row_id, r.value * off[r.kind], r.value, 1, 0),
                          r.source_id in held) for r in rows]
    fit = _fit_metadata("trtllm-h100-sxm", rows, checked, None)
    by_kind = fit["held_out_by_kind"]
    assert isinstance(by_kind, dict)
    assert list(by_kind) == ["throughput", "TTFT", "TPOT/ITL"]  # no held-out E2E row
    for kind, stats in by_kind.items():
        assert stats["median_abs_error"] == pytest.approx(abs(off[kind] - 1))
        assert stats["num_rows"] == sum(1 for c in checked if c.held_out and c.row.kind == kind)
    held_out = fit["held_out"]
    assert isinstance(held_out, dict)
    assert sum(s["num_rows"] for s in by_kind.values()) == held_out["num_rows"]


def test_a_run_duration_errs_as_the_throughput_it_implies() -> None:
    """A k6 run predicted to take 27% of its published time served the same work 3.7 times
    faster: its error is +269% of throughput (filed under throughput), not a 73% miss; and it
    counts as predicted high, as an over-predicted throughput does."""
    rows = {r.row_id: r for r in load_rows()}
    duration = rows["tgiv3-vllm-70b-h100-tp8-small"]
    assert duration.metric == "duration_s" and duration.kind == "throughput"
    fast = CheckedRow(duration, RowPrediction(duration.row_id, 0.25 * duration.value,
                                              duration.value, 1, 0), held_out=True)
    assert fast.error == pytest.approx(3.0) and fast.abs_error == pytest.approx(3.0)
    rate = next(r for r in rows.values() if r.metric == "output_tok_s")
    high = CheckedRow(rate, RowPrediction(rate.row_id, 1.5 * rate.value, rate.value, 1, 0),
                      held_out=True)
    assert high.error == pytest.approx(0.5)
    stats = error_stats([fast, high])
    assert stats is not None and stats.num_over == 2
    assert stats.worst_abs_error == pytest.approx(3.0) and stats.worst_row_id == duration.row_id
    # the printed table gives that error beside the ratio, and says how it is taken
    text = render_text([fast, high])
    assert f"{duration.row_id}" in text and " 0.250  +300.0%  held-out" in text
    assert " 1.500   +50.0%  held-out" in text
    assert "for a run's duration (a fixed amount of work) the error of the throughput" in text
