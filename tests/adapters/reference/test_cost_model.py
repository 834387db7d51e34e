"""The roofline cost model, the catalogs and calibration profiles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters.reference.config import ConfigError, ReferenceConfig
from adapters.reference.cost_model import (
    CostModel,
    CostModelParams,
    ProfileError,
    load_profile,
    resolve_gpu,
)
from adapters.reference.hardware import GPUS, lookup_gpu
from adapters.reference.models import MODELS, lookup_model
from adapters.reference.table import costmodel_report, costmodel_table


def _cost(**kw: object) -> CostModel:
    return ReferenceConfig(**kw).cost_model()  # type: ignore[arg-type]


def test_llama_8b_parameter_count_matches_the_published_8b() -> None:
    m = MODELS["llama-3.1-8b"]
    assert m.num_params == pytest.approx(8.03e9, rel=0.005)
    assert MODELS["llama-3.1-70b"].num_params == pytest.approx(70.6e9, rel=0.005)
    assert MODELS["qwen2.5-7b"].num_params == pytest.approx(7.62e9, rel=0.005)
    assert MODELS["mistral-7b"].num_params == pytest.approx(7.25e9, rel=0.005)


def test_worked_example_llama_8b_h100_batch_1_is_memory_bound_near_4_8_ms() -> None:
    cost = _cost(model="llama-3.1-8b", gpu="h100-sxm")
    assert cost.weight_bytes == pytest.approx(16.06e9, rel=0.01)
    # the ideal: ~16 GB / 3.35 TB/s ~ 4.8 ms (15.0 GB are streamed: embeddings are gathered)
    ideal_s = cost.weight_bytes_read / GPUS["h100-sxm"].hbm_bandwidth_bytes_per_s
    assert 4.3e-3 < ideal_s < 4.9e-3
    step = cost.decode_step_cost(1, 1024)
    assert step.bound == "memory"
    assert step.memory_s == pytest.approx((cost.weight_bytes_read + 1025 * 128 * 1024)
                                          / (3.35e12 * 0.8))
    assert 5e-3 < step.total_s < 8e-3  # with efficiency and per-step overhead


def test_large_prefill_is_compute_bound() -> None:
    cost = _cost()
    step = cost.step_cost(8192, 1, 8192, 8192 * 8193 // 2)
    assert step.bound == "compute"
    assert step.flops == pytest.approx(2 * 8192 * MODELS["llama-3.1-8b"].num_linear_params,
                                       rel=0.2)


def test_fp8_weights_halve_linear_bytes_and_use_the_fp8_peak() -> None:
    bf16, fp8 = _cost(), _cost(weights_dtype="fp8")
    m = MODELS["llama-3.1-8b"]
    assert bf16.weight_bytes - fp8.weight_bytes == pytest.approx(m.num_linear_params)
    big = (8192, 1, 8192, 0)
    assert fp8.step_cost(*big).compute_s == pytest.approx(bf16.step_cost(*big).compute_s / 2,
                                                          rel=0.02)
    # A100 has no FP8 tensor cores: same compute time, fewer bytes
    a_bf16, a_fp8 = _cost(gpu="a100-80gb"), _cost(gpu="a100-80gb", weights_dtype="fp8")
    assert a_fp8.step_cost(*big).compute_s == pytest.approx(a_bf16.step_cost(*big).compute_s,
                                                            rel=0.02)
    assert a_fp8.weight_bytes < a_bf16.weight_bytes


def test_fp8_kv_halves_kv_bytes_and_doubles_the_blocks() -> None:
    bf16 = ReferenceConfig(kv_cache_dtype="bf16")
    fp8 = ReferenceConfig(kv_cache_dtype="fp8")
    assert fp8.cost_model().kv_bytes_per_token * 2 == bf16.cost_model().kv_bytes_per_token
    assert bf16.cost_model().kv_bytes_per_token == 2 * 32 * 8 * 128 * 2  # 128 KiB
    assert fp8.resolved_num_gpu_blocks() in (2 * bf16.resolved_num_gpu_blocks(),
                                             2 * bf16.resolved_num_gpu_blocks() + 1)


def test_kv_blocks_from_memory_and_the_override() -> None:
    config = ReferenceConfig(gpu="h100-sxm", gpu_memory_utilization=0.9)
    budget = config.kv_budget()
    assert budget.kv_bytes == pytest.approx(
        budget.usable_bytes - budget.weight_bytes - budget.activation_reserve_bytes)
    assert budget.num_blocks == int(budget.kv_bytes // (16 * 128 * 1024))
    assert 20_000 < budget.num_blocks < 35_000  # about 450k tokens, as vLLM reports
    assert ReferenceConfig(num_gpu_blocks=123).resolved_num_gpu_blocks() == 123
    more = ReferenceConfig(gpu="h200").resolved_num_gpu_blocks()
    assert more > 2 * budget.num_blocks


def test_tensor_parallel_splits_weights_and_kv_and_adds_all_reduce() -> None:
    tp1 = _cost(model="llama-3.1-70b", tp=1, num_gpu_blocks=100)
    tp4 = _cost(model="llama-3.1-70b", tp=4)
    assert tp4.weight_bytes == pytest.approx(tp1.weight_bytes / 4)
    assert tp4.kv_bytes_per_token == tp1.kv_bytes_per_token / 4
    batch1_1, batch1_4 = tp1.decode_step_cost(1, 100), tp4.decode_step_cost(1, 100)
    assert batch1_4.memory_s == pytest.approx(batch1_1.memory_s / 4, rel=0.01)
    assert batch1_4.overhead_s > batch1_1.overhead_s  # 160 all-reduces per step
    with pytest.raises(ConfigError, match=r"gpu: .*no room for the KV cache"):
        ReferenceConfig(model="llama-3.1-70b", tp=1)
    with pytest.raises(ConfigError, match=r"^tp: "):
        ReferenceConfig(model="llama-3.1-8b", tp=3)


def test_swap_time_uses_the_pcie_figure() -> None:
    cost = _cost()
    assert cost.swap_bandwidth_bytes_per_s == pytest.approx(64e9 * 0.4)
    assert cost.swap_s(10) == pytest.approx(10 * 16 * 128 * 1024 / 25.6e9)
    assert cost.step_s(1, 1, 1, 1, 10) == pytest.approx(cost.step_s(1, 1, 1, 1) + cost.swap_s(10))


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"known models: .*llama-3.1-8b"):
        lookup_model("gpt-5")
    with pytest.raises(ValueError, match=r"known GPUs: .*h100-sxm"):
        lookup_gpu("b200")
    with pytest.raises(ConfigError, match=r"^gpu: unknown GPU 'b200'"):
        ReferenceConfig(gpu="b200")
    with pytest.raises(ConfigError, match=r"^model: "):
        ReferenceConfig(model="nope")


def test_hf_config_json_path(tmp_path: Path) -> None:
    cfg = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
           "vocab_size": 2048, "max_position_embeddings": 2048, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = lookup_model(str(tmp_path))
    assert m.head_dim == 64 and m.num_kv_heads == 2 and not m.tie_word_embeddings
    per_layer = 256 * (256 + 2 * 128) + 256 * 256 + 3 * 256 * 512
    assert m.num_params == 2 * 2048 * 256 + 2 * per_layer + 5 * 256
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ValueError, match=r"bad.json: missing num_attention_heads"):
        lookup_model(str(bad))
    uneven = tmp_path / "uneven.json"
    uneven.write_text(json.dumps({**cfg, "num_attention_heads": 12, "num_key_value_heads": 5}))
    with pytest.raises(ValueError, match=r"uneven.json: num_attention_heads \(12\) must be a "
                                         r"multiple of num_key_value_heads \(5\)"):
        lookup_model(str(uneven))


def test_a_gpt2_style_config_is_read_with_its_own_key_names(tmp_path: Path) -> None:
    """GPT-2 configs name the activation activation_function (gelu_new: an ungated MLP, two
    matrices, not SwiGLU's three) and save n_inner as null (4 x hidden): the MLP was counted
    gated, and the null refused."""
    cfg = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
           "n_positions": 1024, "vocab_size": 50257, "activation_function": "gelu_new"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = lookup_model(str(tmp_path))
    assert m.intermediate_size == 4 * 768 and not m.gated_mlp
    assert m.max_position_embeddings == 1024 and m.num_kv_heads == 12
    gated = tmp_path / "gated.json"
    gated.write_text(json.dumps({**cfg, "activation_function": "silu"}))
    assert lookup_model(str(gated)).gated_mlp


def test_h100_pcie_all_reduces_over_pcie_beyond_its_nvlink_bridged_pairs() -> None:
    """An H100 PCIe's NVLink bridge joins pairs only: a group of 4 or 8 all-reduces over
    PCIe Gen5 (64 GB/s a direction), not the bridge's 300 GB/s (4.7 times too quick)."""
    def per_token(tp: int) -> float:
        return ReferenceConfig(model="llama-3.1-70b", gpu="h100-pcie", tp=tp,
                               weights_dtype="fp8").cost_model().allreduce_per_token_s

    for tp, bandwidth in ((2, 300e9), (4, 64e9), (8, 64e9)):
        ring_bytes = 2 * (tp - 1) / tp * 8192 * 2
        assert per_token(tp) == pytest.approx(2 * 80 * ring_bytes / bandwidth)
    sxm = ReferenceConfig(model="llama-3.1-70b", gpu="h100-sxm", tp=8).cost_model()
    assert sxm.allreduce_per_token_s == pytest.approx(2 * 80 * (2 * 7 / 8 * 8192 * 2) / 450e9)


def test_profile_overrides_coefficients_and_hardware(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"memory_efficiency": 0.5, "step_overhead_s": 0.002,
                                "hbm_bandwidth_bytes_per_s": 3.0e12, "metadata": {"r2": 0.99},
                                "_note": "fitted by hand"}))
    params = load_profile(path)
    assert params.memory_efficiency == 0.5 and params.source == str(path)
    config = ReferenceConfig(profile=str(path))
    assert config.gpu_spec.hbm_bandwidth_bytes_per_s == 3.0e12
    assert config.gpu_spec.peak_bf16_flops == GPUS["h100-sxm"].peak_bf16_flops
    slower = config.cost_model().decode_step_cost(1, 100).total_s
    assert slower > _cost().decode_step_cost(1, 100).total_s


def test_profile_may_describe_a_cpu_device(tmp_path: Path) -> None:
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({
        "device": "cpu-2core", "memory_bytes": 16e9, "hbm_bandwidth_bytes_per_s": 20e9,
        "peak_bf16_flops": 2e11, "weight_bytes_per_param": 4.0, "kv_bytes_per_element": 4.0,
        "activation_fixed_bytes": 0}))
    config = ReferenceConfig(model="qwen2.5-0.5b", profile=str(path))
    assert config.gpu_spec.name == "cpu-2core"
    assert config.cost_model().weight_bytes == pytest.approx(4 * MODELS["qwen2.5-0.5b"].num_params)
    with pytest.raises(ConfigError, match=r"fitted on device 'cpu-2core'"):
        ReferenceConfig(model="qwen2.5-0.5b", gpu="h100-sxm", profile=str(path))


@pytest.mark.parametrize(("content", "message"), [
    ("{", "line 1: not valid JSON"),
    ('{"memory_efficency": 0.5}',
     r"unknown profile key 'memory_efficency' \(did you mean 'memory_efficiency'\?\)"),
    ('{"memory_efficiency": 1.5}', r"memory_efficiency must be in \(0, 1\]"),
    ('{"step_overhead_s": "fast"}', "step_overhead_s must be a number"),
    ("[1]", "a profile is a JSON object"),
])
def test_bad_profiles_name_the_file_and_key(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ProfileError, match=message) as info:
        load_profile(path)
    assert str(path) in str(info.value)
    with pytest.raises(ConfigError, match=r"^profile: "):
        ReferenceConfig(profile=str(path))


def test_resolve_gpu_needs_a_full_description_for_unknown_devices() -> None:
    with pytest.raises(ValueError, match=r"lacks memory_bytes"):
        resolve_gpu("tpu", CostModelParams(hbm_bandwidth_bytes_per_s=1e12, peak_bf16_flops=1e14))


def test_costmodel_table_rows_and_report() -> None:
    rows = costmodel_table(ReferenceConfig(gpu="h100-sxm", max_num_seqs=1024), context_len=1024)
    sizes = [r.batch_size for r in rows]
    assert sizes[:5] == [1, 4, 16, 64, 256] and len(rows) == 6
    largest = rows[-1]
    assert largest.runs and largest.batch_size > 256
    assert rows[0].bound == "memory" and rows[0].arithmetic_intensity == pytest.approx(1, rel=0.1)
    tps = [r.output_tokens_per_s for r in rows]
    assert tps == sorted(tps)  # batching raises throughput
    tpots = [r.tpot_s for r in rows]
    assert tpots == sorted(tpots)  # ... at the cost of per-token latency
    report = costmodel_report(ReferenceConfig(gpu="a100-80gb", weights_dtype="fp8"))
    assert "no FP8 tensor cores" in report and "TPOT ms" in report
