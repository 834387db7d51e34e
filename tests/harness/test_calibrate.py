"""Calibration without a real engine: step extraction, the fit, the workload, the profile.

The reference engine itself is the stand-in for a live one: its timelines stream one token per
request at the end of every step, as vLLM does, and its cost model with known coefficients
generates the "measured" step times the fit must recover.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from adapters.base import Knobs
from adapters.reference import ReferenceConfig
from adapters.reference.cost_model import CostModel, CostModelParams, load_profile
from harness import calibrate as cal
from harness.calibrate import (
    CostShape,
    KvCacheInfo,
    StepSample,
    WorkloadSpec,
    decode_step_samples,
    design_workload,
    first_token_samples,
    fit_step_model,
    nnls,
)
from harness.sim import simulate
from harness.timeline import RequestTimeline
from harness.traces import TraceRequest

SMALL_LLAMA = {  # the shape of models/small-llama (28M parameters), as config.json says
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 768,
    "num_hidden_layers": 4, "num_attention_heads": 12, "num_key_value_heads": 4,
    "head_dim": 64, "intermediate_size": 2048, "vocab_size": 2048,
    "max_position_embeddings": 2048, "tie_word_embeddings": False,
}
CPU_KNOBS = Knobs(max_num_seqs=16, max_num_batched_tokens=2048, max_model_len=1024,
                  extra_args=("--dtype", "float32"))
# A CPU-like device: memory-bound at batch 1, compute-bound beyond ~5 sequences.
CPU_TRUTH = CostModelParams(
    device="testcpu", memory_bytes=8e9, hbm_bandwidth_bytes_per_s=2e10,
    peak_bf16_flops=5e10, memory_efficiency=1.0, compute_efficiency=1.0,
    step_overhead_s=0.02, per_seq_overhead_s=5e-4, per_kv_token_overhead_s=2e-6,
    per_attention_pair_overhead_s=5e-7, frontend_latency_s=0.015, weight_bytes_per_param=4.0,
    kv_bytes_per_element=4.0, activation_fixed_bytes=0.0,
)


@pytest.fixture(scope="module")
def small_llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("small-llama")
    (folder / "config.json").write_text(json.dumps(SMALL_LLAMA))
    return str(folder)


def cpu_config(model: str, params: CostModelParams = CPU_TRUTH) -> ReferenceConfig:
    return cal.reference_config(model, CPU_KNOBS, "testcpu", params=params,
                                kv=KvCacheInfo(block_size=128, num_blocks=1024))


# ---------------------------------------------------------------- NNLS


def test_nnls_matches_unconstrained_when_feasible_and_clips_otherwise() -> None:
    rng = np.random.default_rng(1)
    a = rng.uniform(0.5, 2.0, size=(40, 3))
    x_true = np.array([1.0, 0.5, 2.0])
    assert np.allclose(nnls(a, a @ x_true), x_true)
    # a target that wants a negative second coefficient gets 0 there, and the rest refitted
    y = a @ np.array([1.0, -0.7, 2.0])
    x = nnls(a, y)
    assert x[1] == 0.0 and (x >= 0).all()
    free, *_ = np.linalg.lstsq(a[:, [0, 2]], y, rcond=None)
    assert np.allclose(x[[0, 2]], free)


# ---------------------------------------------------------------- step extraction


def test_decode_steps_from_a_burst_are_exact_engine_steps(small_llama: str) -> None:
    config = cpu_config(small_llama)
    cm = config.cost_model()
    burst = [TraceRequest(f"r{i}", 0.0, 40 + 10 * i, 24) for i in range(6)]
    result = simulate(burst, config)
    samples = decode_step_samples(result.timelines, phase="burst")
    # one prefill step for all six, then 23 decode steps of six sequences
    assert len(samples) == 23
    for s in samples:
        assert s.num_seqs == s.num_tokens == 6 and not s.includes_frontend
        expected = cm.step_s(s.num_tokens, s.num_seqs, s.num_kv_tokens, s.num_attention_pairs)
        assert s.duration_s == pytest.approx(expected, rel=1e-9)
    assert [s.num_kv_tokens for s in samples] == [sum(40 + 10 * i + j for i in range(6))
                                                  for j in range(1, 24)]


def test_decode_steps_skip_steps_with_unseen_work(small_llama: str) -> None:
    """A request that arrives mid-burst and needs several steps of prefill (a 1500-token prompt
    over a 2048 budget shared with decodes fits; 3000 does not) must not leak its chunks into
    the samples: every kept sample is a pure decode step whose cost the model reproduces."""
    config = cpu_config(small_llama)
    cm = config.cost_model()
    reqs = [TraceRequest(f"r{i}", 0.0, 64, 40) for i in range(4)]
    reqs.append(TraceRequest("late", 0.3, 900, 10))
    result = simulate(reqs, config)
    samples = decode_step_samples(result.timelines)
    assert samples
    for s in samples:
        expected = cm.step_s(s.num_tokens, s.num_seqs, s.num_kv_tokens, s.num_attention_pairs)
        assert s.duration_s == pytest.approx(expected, rel=1e-9)


def test_decode_steps_tolerate_delivery_jitter(small_llama: str) -> None:
    config = cpu_config(small_llama)
    result = simulate([TraceRequest(f"r{i}", 0.0, 32, 30) for i in range(8)], config)
    rng = np.random.default_rng(7)
    jittered = [dataclasses.replace(tl, chunk_times_s=tuple(
        t + float(rng.uniform(0, 0.002)) for t in tl.chunk_times_s)) for tl in result.timelines]
    exact = decode_step_samples(result.timelines)
    noisy = decode_step_samples(jittered)
    assert len(noisy) == len(exact) == 29
    for a, b in zip(exact, noisy, strict=True):
        assert b.num_kv_tokens == a.num_kv_tokens
        assert b.duration_s == pytest.approx(a.duration_s, abs=0.0025)


def test_multi_token_chunks_break_the_chain_instead_of_faking_a_step() -> None:
    def tl(rid: str, times: tuple[float, ...], counts: tuple[int, ...]) -> RequestTimeline:
        return RequestTimeline(rid, 0.0, 10, sum(counts), chunk_times_s=times,
                               chunk_num_tokens=counts, finished_s=times[-1])

    a = tl("a", (0.1, 0.2, 0.3, 0.5, 0.6), (1, 1, 1, 2, 1))  # 0.5 carries two steps' tokens
    b = tl("b", (0.1, 0.2, 0.3, 0.5, 0.6), (1, 1, 1, 2, 1))
    samples = decode_step_samples([a, b])
    assert [round(s.duration_s, 6) for s in samples] == [0.1, 0.1, 0.1]
    assert all(s.num_seqs == 2 for s in samples)


def test_first_token_samples_are_frontend_plus_one_prefill_step(small_llama: str) -> None:
    config = cpu_config(small_llama)
    cm = config.cost_model()
    reqs = [TraceRequest(f"p{p}", 10.0 * i, p, 3) for i, p in enumerate((16, 128, 700))]
    samples = first_token_samples(simulate(reqs, config).timelines)
    assert [s.num_tokens for s in samples] == [16, 128, 700]
    for s in samples:
        p = s.num_tokens
        assert s.includes_frontend and s.num_attention_pairs == p * (p + 1) // 2
        expected = CPU_TRUTH.frontend_latency_s + cm.step_s(p, 1, p, p * (p + 1) // 2)
        assert s.duration_s == pytest.approx(expected, rel=1e-9)
    # b is sent while a decodes: a met an idle engine, b did not (nor would a request sent
    # during a's prefill, which might have joined it)
    busy = simulate([TraceRequest("a", 0.0, 500, 20), TraceRequest("b", 1.0, 100, 3)], config)
    assert busy.timelines[0].chunk_times_s[0] < 1.0 < busy.timelines[0].chunk_times_s[-1]
    assert [s.num_tokens for s in first_token_samples(busy.timelines)] == [500]


# ---------------------------------------------------------------- the fit


def synthetic_samples(cm: CostModel, frontend_s: float, *, noise: float = 0.0,
                      batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16),
                      prefill: tuple[int, ...] = (16, 64, 256, 512, 1000),
                      seed: int = 0) -> list[StepSample]:
    rng = np.random.default_rng(seed)

    def jitter() -> float:
        return float(1.0 + noise * rng.standard_normal()) if noise else 1.0

    out = []
    for c in batch_sizes:
        for context in (32, 512):
            for j in range(1, 40, 3):
                kv = c * (context + j)
                out.append(StepSample(cm.step_s(c, c, kv, kv) * jitter(), c, c, kv, kv,
                                      phase=f"c{c}"))
    for p in prefill:
        for _ in range(2):
            pairs = p * (p + 1) // 2
            out.append(StepSample((frontend_s + cm.step_s(p, 1, p, pairs)) * jitter(), 1, p,
                                  p, pairs, includes_frontend=True, phase="prefill"))
    return out


def test_fit_recovers_a_cpu_like_device(small_llama: str) -> None:
    config = cpu_config(small_llama)
    cm = config.cost_model()
    samples = synthetic_samples(cm, CPU_TRUTH.frontend_latency_s)
    fit = fit_step_model(samples, CostShape.of(cm))
    assert fit.memory_bytes_per_s == pytest.approx(2e10, rel=0.03)
    assert fit.compute_flops_per_s == pytest.approx(5e10, rel=0.03)
    c = fit.coefficients
    assert c["step_overhead_s"] == pytest.approx(0.02, rel=0.05)
    assert c["per_seq_overhead_s"] == pytest.approx(5e-4, rel=0.15)
    assert c["per_kv_token_overhead_s"] == pytest.approx(2e-6, rel=0.1)
    assert c["per_attention_pair_overhead_s"] == pytest.approx(5e-7, rel=0.1)
    assert c["frontend_latency_s"] == pytest.approx(0.015, rel=0.1)
    assert fit.median_abs_relative_error < 0.01 and fit.num_outliers == 0


def test_fit_with_noise_predicts_within_the_noise(small_llama: str) -> None:
    config = cpu_config(small_llama)
    cm = config.cost_model()
    noisy = synthetic_samples(cm, CPU_TRUTH.frontend_latency_s, noise=0.05, seed=3)
    fit = fit_step_model(noisy, CostShape.of(cm))
    truth = synthetic_samples(cm, CPU_TRUTH.frontend_latency_s)
    pred = fit.predict_s(CostShape.of(cm), truth)
    rel = np.abs(pred / np.array([s.duration_s for s in truth]) - 1)
    assert np.median(rel) < 0.02 and rel.max() < 0.08


H100_TRUTH = CostModelParams(memory_efficiency=0.72, compute_efficiency=0.55,
                             step_overhead_s=2e-3, per_seq_overhead_s=2e-5,
                             frontend_latency_s=4e-3)


def _h100(max_num_seqs: int, max_num_batched_tokens: int) -> ReferenceConfig:
    """An 8B on an H100 whose efficiencies and overheads are ``H100_TRUTH``."""
    knobs = Knobs(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                  max_model_len=8192)
    return cal.reference_config("llama-3.1-8b", knobs, "h100-sxm", params=H100_TRUTH)


def test_fit_recovers_gpu_efficiencies_on_a_catalog_device() -> None:
    config = _h100(256, 8192)
    cm = config.cost_model()
    samples = synthetic_samples(cm, H100_TRUTH.frontend_latency_s,
                                batch_sizes=(1, 4, 16, 64, 128, 256),
                                prefill=(128, 512, 2048, 4096, 8000))
    space = cal.fit_space(config, "h100-sxm")
    assert not space.allow_no_memory_term and not space.attention_overheads
    fit = fit_step_model(samples, CostShape.of(cm), space)
    values, notes = cal.profile_params(fit, config, "h100-sxm", None)
    assert values["memory_efficiency"] == pytest.approx(0.72, rel=0.03)
    assert values["compute_efficiency"] == pytest.approx(0.55, rel=0.03)
    assert values["step_overhead_s"] == pytest.approx(2e-3, rel=0.1)
    assert values["frontend_latency_s"] == pytest.approx(4e-3, rel=0.1)
    assert "hbm_bandwidth_bytes_per_s" not in values and not notes  # the datasheet stays


def test_a_fit_that_saw_no_compute_bound_step_says_its_compute_figure_is_a_guess() -> None:
    """Prefills of 36 tokens at most and small batches: no step reaches the compute bound, and
    the profile held a compute efficiency a quarter of the truth with no word of it."""
    config = _h100(16, 2048)
    cm = config.cost_model()
    short = synthetic_samples(cm, H100_TRUTH.frontend_latency_s, batch_sizes=(1, 2, 4, 8, 16),
                              prefill=(8, 16, 24, 36))
    fit = fit_step_model(short, CostShape.of(cm), cal.fit_space(config, "h100-sxm"))
    assert fit.num_compute_bound == 0
    _, notes = cal.profile_params(fit, config, "h100-sxm", None)
    assert any(n.startswith("no measured step was compute-bound") for n in notes)
    assert fit.as_dict()["num_compute_bound"] == 0


def _exact_case(small_llama: str, device: str) -> tuple[list[StepSample], CostShape,
                                                       cal.FitSpace, dict[str, float]]:
    """Noise-free samples the fit can match to rounding: the device's figures are the upper
    ends of the search's ranges, which the grid holds exactly."""
    if device == "testcpu":
        cm = cpu_config(small_llama).cost_model()
        space = cal.FitSpace(bandwidth_range=(1e9, 2e10), compute_range=(1e9, 5e10))
        samples = synthetic_samples(cm, CPU_TRUTH.frontend_latency_s)
        expected = {t: getattr(CPU_TRUTH, t) for t in cal.LINEAR_TERMS}
        return samples, CostShape.of(cm), space, {**expected, "memory_bytes_per_s": 2e10,
                                                  "compute_flops_per_s": 5e10}
    truth = CostModelParams(memory_efficiency=1.0, compute_efficiency=1.0,
                            step_overhead_s=2e-3, per_seq_overhead_s=2e-5,
                            frontend_latency_s=4e-3)
    knobs = Knobs(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=8192)
    config = cal.reference_config("llama-3.1-8b", knobs, device, params=truth)
    cm = config.cost_model()
    samples = synthetic_samples(cm, truth.frontend_latency_s,
                                batch_sizes=(1, 4, 16, 64, 128, 256),
                                prefill=(128, 512, 2048, 4096, 8000))
    expected = {"step_overhead_s": 2e-3, "per_seq_overhead_s": 2e-5,
                "frontend_latency_s": 4e-3,
                "memory_bytes_per_s": config.gpu_spec.hbm_bandwidth_bytes_per_s,
                "compute_flops_per_s": config.gpu_spec.peak_bf16_flops}
    return samples, CostShape.of(cm), cal.fit_space(config, device), expected


def _assert_recovers(fit: cal.StepFit, expected: dict[str, float]) -> None:
    got = {**fit.coefficients, "memory_bytes_per_s": fit.memory_bytes_per_s,
           "compute_flops_per_s": fit.compute_flops_per_s}
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-3), name


@pytest.mark.parametrize("device", ["testcpu", "h100-sxm"])
def test_a_noise_free_fit_keeps_samples_a_millionth_off(small_llama: str, device: str) -> None:
    """On noise-free steps the median absolute deviation of the relative errors is rounding,
    and the outlier rule scaled by it alone dropped every first-token sample a millionth off
    the rest: the prefill and front-end terms they pin came out zero. The rule's spread has a
    floor of 1%, so such samples are kept and the coefficients recovered."""
    samples, shape, space, expected = _exact_case(small_llama, device)
    nudged = [dataclasses.replace(s, duration_s=s.duration_s * (1 + 1e-6))
              if s.includes_frontend else s for s in samples]
    fit = fit_step_model(nudged, shape, space)
    assert fit.num_outliers == 0
    _assert_recovers(fit, expected)


@pytest.mark.parametrize("factor", [3.0, 1 / 3])
def test_a_noise_free_fit_still_drops_a_real_outlier(small_llama: str, factor: float) -> None:
    """A step 3x off (or a third) among noise-free samples, the first-token ones a millionth
    off, is the only sample dropped and the rest give the coefficients. The fit absorbed such a
    step of batch 64, the rest kept errors of rounding, and the outlier rule scaled by them
    alone dropped every first-token sample with it (the front end came out zero)."""
    samples, shape, space, expected = _exact_case(small_llama, "h100-sxm")
    nudged = [dataclasses.replace(s, duration_s=s.duration_s * (1 + 1e-6))
              if s.includes_frontend else s for s in samples]
    victim = next(i for i, s in enumerate(nudged)
                  if s.num_seqs == 64 and s.num_kv_tokens > 64 * 512)
    nudged[victim] = dataclasses.replace(nudged[victim],
                                         duration_s=nudged[victim].duration_s * factor)
    fit = fit_step_model(nudged, shape, space)
    assert fit.num_outliers == 1
    _assert_recovers(fit, expected)
    truth_s = samples[victim].duration_s
    assert float(fit.predict_s(shape, [samples[victim]])[0]) == pytest.approx(truth_s, rel=1e-3)


def test_a_bad_first_token_sample_does_not_take_the_good_ones_with_it(
        small_llama: str) -> None:
    """The few first-token samples weigh together as much as every decode step: one of them
    3x off pulled the fit so far that 8 of the 10 good ones came out more than 10% off and
    were dropped with it. Judged again by the fit without the outliers, only the bad one is
    left out, and the front end and prefill terms come out right."""
    samples, shape, space, expected = _exact_case(small_llama, "h100-sxm")
    first = [i for i, s in enumerate(samples) if s.includes_frontend]
    victim = next(i for i in first if samples[i].num_tokens == 512)
    bad = list(samples)
    bad[victim] = dataclasses.replace(bad[victim], duration_s=bad[victim].duration_s * 3)
    fit = fit_step_model(bad, shape, space)
    assert fit.num_outliers == 1
    _assert_recovers(fit, expected)


def test_fit_refuses_too_little_data(small_llama: str) -> None:
    shape = CostShape.of(cpu_config(small_llama).cost_model())
    with pytest.raises(ValueError, match="usable step samples"):
        fit_step_model([StepSample(0.01, 1, 1, 10, 10)] * 3, shape)
    with pytest.raises(ValueError, match="no first-token sample"):
        fit_step_model([StepSample(0.01, 1, 1, 10 + i, 10 + i) for i in range(20)], shape)


# ---------------------------------------------------------------- the whole loop


def run_phase_on_reference(phase: cal.Phase, config: ReferenceConfig) -> list[RequestTimeline]:
    """A phase on the simulated engine: a burst at once; a spaced or one-user phase one
    request at a time (each alone, placed one after another)."""
    if phase.concurrency is None and phase.spaced_by is None:
        return simulate(phase.requests, config).timelines
    out: list[RequestTimeline] = []
    t0 = 0.0
    for req in phase.requests:
        (tl,) = simulate([dataclasses.replace(req, arrival_s=0.0)], config).timelines
        assert tl.finished_s is not None
        out.append(dataclasses.replace(
            tl, arrival_s=t0, chunk_times_s=tuple(t + t0 for t in tl.chunk_times_s),
            finished_s=tl.finished_s + t0))
        t0 += tl.finished_s + 0.01
    return out


def test_calibrating_the_reference_recovers_its_own_profile(small_llama: str,
                                                            tmp_path: Path) -> None:
    truth = cpu_config(small_llama)
    spec = WorkloadSpec(max_num_seqs=16, max_num_batched_tokens=2048, max_model_len=1024)
    samples = []
    for phase in design_workload(spec):
        if phase.name != "pilot":
            samples += cal.samples_from_phase(phase, run_phase_on_reference(phase, truth))
    kv = KvCacheInfo(block_size=128, num_blocks=1024)
    placeholder = cal.reference_config(small_llama, CPU_KNOBS, "testcpu", kv=kv)
    shape = CostShape.of(placeholder.cost_model())
    fit = fit_step_model(samples, shape, cal.fit_space(placeholder, "testcpu"))
    values, notes = cal.profile_params(fit, placeholder, "testcpu", kv)
    assert not notes
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({**values, "metadata": {"fit": fit.as_dict()}}))
    fitted = cal.reference_config(small_llama, CPU_KNOBS, "testcpu", profile=str(path), kv=kv)
    # the fitted profile reproduces the truth's step times over the whole workload
    pred = fit.predict_s(shape, samples)
    measured = np.array([s.duration_s for s in samples])
    assert np.abs(pred / measured - 1).max() < 0.01
    # and its KV budget, without being told the block count, leaves the engine's cache
    assert load_profile(path).per_kv_token_overhead_s == pytest.approx(2e-6, rel=0.1)
    unsized = cal.reference_config(small_llama, CPU_KNOBS, "testcpu", profile=str(path))
    tokens = unsized.resolved_num_gpu_blocks() * unsized.block_size
    assert tokens == pytest.approx(1024 * 128, rel=0.01)
    assert fitted.gpu_spec.name == "testcpu"


# ---------------------------------------------------------------- the workload


@pytest.mark.parametrize(("seqs", "budget", "model_len"), [(16, 2048, 1024), (256, 8192, 8192),
                                                           (3, 512, 300), (8, 4096, 100)])
def test_workload_fits_the_engine_limits(seqs: int, budget: int, model_len: int) -> None:
    spec = WorkloadSpec(max_num_seqs=seqs, max_num_batched_tokens=budget,
                        max_model_len=model_len, num_output_tokens=48 if model_len > 100 else 16)
    phases = design_workload(spec)
    names = [p.name for p in phases]
    assert names[:3] == ["pilot", "prefill", "decode-c1"]
    assert len(set(names)) == len(names)
    for phase in phases:
        assert len(phase.requests) == len({r.request_id for r in phase.requests})
        for r in phase.requests:
            assert r.num_prompt_tokens + r.num_output_tokens <= model_len
            assert r.num_prompt_tokens <= budget
        if phase.name.startswith("decode"):
            assert len(phase.requests) <= seqs
    assert max(spec.batch_sizes()) == min(seqs, 256)
    assert cal.phase_trace(phases[1]).digest == cal.phase_trace(design_workload(spec)[1]).digest


def test_spaced_phase_sends_one_request_at_a_time() -> None:
    spec = WorkloadSpec(max_num_seqs=4, max_num_batched_tokens=512, max_model_len=600)
    pilot, prefill = design_workload(spec)[:2]
    assert prefill.spaced_by == "pilot" and prefill.first_token_samples
    timed = [RequestTimeline(r.request_id, 0.0, r.num_prompt_tokens, 4, chunk_times_s=(0.1,),
                             chunk_num_tokens=(4,), finished_s=0.01 * r.num_prompt_tokens)
             for r in pilot.requests]
    spaced = cal.space_arrivals(prefill, timed).requests
    arrivals = [r.arrival_s for r in spaced]
    assert arrivals[0] == cal.SEND_GAP_S
    for before, after, r in zip(arrivals, arrivals[1:], spaced, strict=False):
        assert after - before == pytest.approx(1.5 * 0.01 * r.num_prompt_tokens
                                               + cal.SEND_GAP_S)


def test_speed_probe_repeats_the_burst_of_four() -> None:
    workload = [{"name": "pilot", "num_requests": 7}, {"name": "decode-c1", "num_requests": 1},
                {"name": "decode-c4", "num_requests": 4}, {"name": "decode-c8", "num_requests": 8},
                {"name": "decode-long-c4", "num_requests": 4}]
    assert cal.probe_reference(workload, 16)["name"] == "decode-c4"
    assert cal.probe_reference(workload, 2)["name"] == "decode-c1"
    assert cal.probe_reference(workload[:1], 16) is None


def test_workload_spec_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="max_num_seqs"):
        WorkloadSpec(max_num_seqs=0, max_num_batched_tokens=8, max_model_len=100).validate()
    with pytest.raises(ValueError, match="max_model_len 40"):
        WorkloadSpec(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=40).validate()


# ---------------------------------------------------------------- engine facts


def test_kv_cache_from_vllm_metrics() -> None:
    text = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",'
        'num_cpu_blocks="None",num_gpu_blocks="1024",prefix_caching_hash_algo="sha256"} 1.0\n'
    )
    assert cal.kv_cache_from_metrics(text) == KvCacheInfo(block_size=128, num_blocks=1024)
    assert cal.kv_cache_from_metrics("# nothing\n") is None
    assert cal.kv_cache_from_metrics("not { prometheus") is None


@pytest.mark.parametrize(("name", "expected"), [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA L4", "l4"),
])
def test_gpu_catalog_names(name: str, expected: str) -> None:
    assert cal.gpu_catalog_name(name) == expected


def test_engine_dtype_from_extra_args() -> None:
    assert cal.engine_dtype_bytes(CPU_KNOBS) == 4.0
    assert cal.engine_dtype_bytes(Knobs(extra_args=("--dtype=bfloat16",))) == 2.0
    assert cal.engine_dtype_bytes(Knobs()) is None


def test_cpu_profile_fields_load_and_describe_the_device(small_llama: str) -> None:
    config = cpu_config(small_llama)
    cm = config.cost_model()
    fit = fit_step_model(synthetic_samples(cm, 0.01), CostShape.of(cm),
                         cal.FitSpace(allow_no_memory_term=False))
    kv = KvCacheInfo(block_size=128, num_blocks=1024)
    values, _ = cal.profile_params(fit, config, "testcpu", kv)
    params = CostModelParams(**values)
    params.validate()
    assert params.device == "testcpu" and params.weight_bytes_per_param == 4.0
    assert params.per_token_overhead_s == 0.0 and params.memory_efficiency == 1.0
    assert math.isfinite(params.hbm_bandwidth_bytes_per_s or math.nan)


# ---------------------------------------------------------------- devices the catalog lacks

EIGHT_B_KNOBS = Knobs(max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=2048)


def _unknown_device(**params: float) -> ReferenceConfig:
    fields: dict[str, float] = {"step_overhead_s": 1e-3, "per_seq_overhead_s": 1e-5,
                                "frontend_latency_s": 2e-3, **params}
    truth = CostModelParams(device="testgpu", memory_bytes=141e9, memory_efficiency=1.0,
                            compute_efficiency=1.0, activation_fixed_bytes=0.0, **fields)
    return cal.reference_config("llama-3.1-8b", EIGHT_B_KNOBS, "testgpu", params=truth)


def test_fit_identifies_the_bandwidth_of_a_device_faster_than_a_terabyte_per_second() -> None:
    """An H200-class device (4.8 TB/s) and a B200-class one (8 TB/s), not in the catalog:
    the search reaches their bandwidths (it stopped at 1 TB/s, a 15 ms floor for an 8B model).
    Measured with 2% noise; the fixed and per-KV-token overheads trade off against the memory
    term, so the bandwidth is pinned only roughly, the step times closely."""
    placeholder = cal.reference_config("llama-3.1-8b", EIGHT_B_KNOBS, "testgpu")
    shape = CostShape.of(placeholder.cost_model())
    for bandwidth in (4.8e12, 8e12):
        cm = _unknown_device(hbm_bandwidth_bytes_per_s=bandwidth, peak_bf16_flops=1e15
                             ).cost_model()
        prefill = (128, 512, 1024, 2000)
        noisy = synthetic_samples(cm, 2e-3, prefill=prefill, noise=0.02, seed=1)
        fit = fit_step_model(noisy, shape, cal.fit_space(placeholder, "testgpu"))
        assert fit.memory_bytes_per_s == pytest.approx(bandwidth, rel=0.2)
        truth = synthetic_samples(cm, 2e-3, prefill=prefill)
        measured = np.array([s.duration_s for s in truth])
        assert np.abs(fit.predict_s(shape, truth) / measured - 1).max() < 0.03


def test_a_fit_without_a_memory_term_writes_a_profile_without_one(tmp_path: Path) -> None:
    """No step memory-bound (the fit keeps no memory term): the profile must not add a memory
    floor the fit never had (1 TB/s would add 15 ms to every step of an 8B model)."""
    truth = _unknown_device(hbm_bandwidth_bytes_per_s=1e18, peak_bf16_flops=4e14,
                            step_overhead_s=6e-3)
    cm = truth.cost_model()
    samples = synthetic_samples(cm, 2e-3, prefill=(128, 512, 1024, 2000))
    placeholder = cal.reference_config("llama-3.1-8b", EIGHT_B_KNOBS, "testgpu")
    shape = CostShape.of(placeholder.cost_model())
    fit = fit_step_model(samples, shape, cal.fit_space(placeholder, "testgpu"))
    assert math.isinf(fit.memory_bytes_per_s)
    values, notes = cal.profile_params(fit, placeholder, "testgpu", None)
    assert values["hbm_bandwidth_bytes_per_s"] == cal.NO_MEMORY_TERM_BANDWIDTH
    assert any("no memory term" in note for note in notes)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({**values, "metadata": {"fit": fit.as_dict()}}))
    fitted = cal.reference_config("llama-3.1-8b", EIGHT_B_KNOBS, "testgpu",
                                  profile=str(path)).cost_model()
    predicted = fit.predict_s(shape, samples)
    for sample, fit_s in zip(samples, predicted, strict=True):
        profile_s = fitted.step_s(sample.num_tokens, sample.num_seqs,
                                  int(sample.num_kv_tokens), int(sample.num_attention_pairs))
        if sample.includes_frontend:
            profile_s += fitted.params.frontend_latency_s
        assert profile_s == pytest.approx(float(fit_s), rel=1e-3)
    assert fitted.decode_step_cost(1, 1024).total_s == pytest.approx(
        cm.decode_step_cost(1, 1024).total_s, rel=0.02)
