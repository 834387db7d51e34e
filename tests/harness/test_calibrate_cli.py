"""`batchlab calibrate` then `batchlab validate`, end to end, against the served reference engine.

The served reference (``batchlab serve reference --profile TRUTH``) is a real HTTP engine whose
steps last what a known profile says, on the wall clock, so the whole command path runs
(attach, workload phases, step extraction, fit, profile file, live replay with telemetry,
simulation, fidelity.json, the report) and the fitted profile can be checked against the truth.
The real-engine version of this (vLLM on CPU) is tests/harness/test_calibrate_vllm_real.py.

Bounds are loose on purpose: the served engine sleeps through its steps on a shared 2-core
machine, so each step can end late by the event loop's granularity and by starvation; a wrong
fit or a broken pipeline misses them by far more.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters.reference.config import ReferenceConfig
from adapters.reference.cost_model import CostModel, CostModelParams, load_profile
from harness.cli import main
from harness.report.fidelity import METRICS, PERCENTILES
from harness.serve import launch_server_process

pytestmark = pytest.mark.timeout(300)

SMALL_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 768,
    "num_hidden_layers": 4, "num_attention_heads": 12, "num_key_value_heads": 4,
    "head_dim": 64, "intermediate_size": 2048, "vocab_size": 2048,
    "max_position_embeddings": 2048, "tie_word_embeddings": False,
}
TRUTH = {  # steps of a few ms: decode ~4-8 ms, a 500-token prefill ~130 ms
    "device": "testdev", "memory_bytes": 8e9, "hbm_bandwidth_bytes_per_s": 1e11,
    "peak_bf16_flops": 2e11, "memory_efficiency": 1.0, "compute_efficiency": 1.0,
    "step_overhead_s": 0.003, "per_seq_overhead_s": 2e-4, "per_kv_token_overhead_s": 5e-7,
    "weight_bytes_per_param": 4.0, "kv_bytes_per_element": 4.0, "activation_fixed_bytes": 0.0,
}
KNOBS = ["--max-num-seqs", "8", "--max-num-batched-tokens", "1024", "--extra-arg=--dtype",
         "--extra-arg=float32"]  # the served engine runs the truth profile: fp32 weights


def _cost_model(config: Path, params: CostModelParams) -> CostModel:
    return ReferenceConfig(model=str(config), gpu="testdev", cost_params=params,
                           max_model_len=512).cost_model()


def test_calibrate_and_validate_against_the_served_reference(tmp_path: Path) -> None:
    config = tmp_path / "model" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(SMALL_LLAMA))
    truth = tmp_path / "truth.json"
    truth.write_text(json.dumps(TRUTH))
    engine = ("--model", str(config), "--gpu", "testdev", "--profile", str(truth),
              "--max-num-seqs", "8", "--max-num-batched-tokens", "1024", "--max-model-len",
              "512", "--served-model-name", "test-model")
    profile = tmp_path / "fitted.json"
    out = tmp_path / "validate"
    target = ["--engine", "reference", "--model", "test-model", "--reference-model",
              str(config), *KNOBS, "--max-model-len", "512"]
    with launch_server_process(engine, log_path=tmp_path / "server.log") as server:
        assert main(["calibrate", "--url", server.url, *target, "--gpu", "testdev",
                     "--output-tokens", "16", "--out", str(profile)]) == 0
        assert main(["validate", "--url", server.url, *target, "--profile", str(profile),
                     "--trace", "harness/data/azure_conv_excerpt.csv", "--limit", "20",
                     "--on-too-long", "clip", "--rate", "5", "--out", str(out)]) == 0

    # The profile: loadable, described as the device, with the fit's metadata.
    params = load_profile(profile)
    raw = json.loads(profile.read_text())
    assert params.device == "testdev" and params.weight_bytes_per_param == 4.0
    meta = raw["metadata"]
    assert meta["engine"]["name"] == "reference" and not meta["engine"]["launched"]
    assert [p["name"] for p in meta["workload"]][:2] == ["pilot", "prefill"]
    assert all(p["num_completed"] == p["num_requests"] for p in meta["workload"])
    # every workload's step samples went into the fit: enough to pin its few coefficients many
    # times over (how many a run gets depends on how often a loaded machine lets the
    # telemetry scraper in: 86 to 140 seen)
    assert meta["fit"]["num_samples"] == sum(p["num_samples"] for p in meta["workload"])
    assert meta["fit"]["num_samples"] >= 40
    # The fit reproduces the truth's step times where it was measured (a served step ends
    # late by up to a few ms on a loaded machine, which the overhead absorbs).
    assert meta["fit"]["median_abs_relative_error"] < 0.2
    # It times the truth's steps like the truth: prefills of 500 and 200 tokens, decodes of 8
    # and of 1. The coefficients one by one trade off (on a loaded machine late steps raise
    # the fitted overhead, and the compute peak rises to compensate: 1.5x in one run of ten),
    # so each alone is only checked for its order of magnitude.
    fitted_model, truth_model = (_cost_model(config, p) for p in (params, load_profile(truth)))
    for step in ((500, 1, 500, 500 * 501 // 2), (200, 1, 200, 200 * 201 // 2),
                 (8, 8, 8 * 300, 8 * 300), (1, 1, 300, 300)):
        assert fitted_model.step_s(*step) == pytest.approx(truth_model.step_s(*step), rel=0.25)
    assert 0.4 * 2e11 < params.peak_bf16_flops < 2.5 * 2e11

    # fidelity.json: every metric and percentile, predicted vs measured
    fid = json.loads((out / "fidelity.json").read_text())
    for metric in METRICS:
        for pct in PERCENTILES:
            assert set(fid[metric][pct]) == {"predicted", "measured", "relative_error"}
    assert set(fid["output_tokens_per_s"]) == {"predicted", "measured", "relative_error"}
    assert fid["per_request"]["num_matched"] == 20
    assert fid["context"]["profile"] == str(profile)
    tpot_error = fid["tpot_s"]["p50"]["relative_error"]
    assert abs(tpot_error) < 0.3, fid["tpot_s"]
    assert abs(fid["output_tokens_per_s"]["relative_error"]) < 0.2
    speed = fid["engine_speed_vs_calibration"]  # a steady engine: no drift where measured
    for when in ("before", "after"):
        # a loaded machine can leave a probe without a span where every stream advanced alike:
        # then it is not measured, and says why, rather than reporting a made-up drift
        if speed[when] is None:
            assert speed[f"{when}_reason"], speed
        else:
            assert abs(speed[when]) < 0.3, speed
    assert (out / "per_request_errors.parquet").exists()
    assert (out / "fidelity.md").read_text().startswith("## Prediction fidelity")
    manifest = json.loads((out / "live" / "manifest.json").read_text())
    assert manifest["knobs"]["max_num_seqs"] == 8 and "declared" in manifest["knobs_note"]

    # The two run folders compare in a report with the prediction-fidelity section.
    report = tmp_path / "report.md"
    assert main(["report", str(out / "live"), str(out / "simulated"), "-o", str(report)]) == 0
    text = report.read_text()
    # the server here is the served reference engine: the report says what is compared
    assert "## Prediction fidelity" in text and "`live` served, `simulated` simulated" in text


def test_calibrate_needs_a_server_and_a_reference_model(capsys: pytest.CaptureFixture[str],
                                                        tmp_path: Path) -> None:
    out = str(tmp_path / "p.json")
    assert main(["calibrate", "--model", "llama-3.1-8b", "--out", out]) == 2
    assert "--launch" in capsys.readouterr().err
    assert main(["calibrate", "--url", "http://127.0.0.1:9", "--model", "no/such-model",
                 "--out", out]) == 2
    assert "--reference-model" in capsys.readouterr().err


@pytest.mark.parametrize(("model", "expected"), [
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b"),
    ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
])
def test_hub_ids_map_to_catalog_shapes(model: str, expected: str,
                                       capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    assert main(["calibrate", "--engine", "vllm", "--launch", "--dry-run", "--model", model,
                 "--gpu", "h100-sxm", "--out", str(tmp_path / "p.json")]) == 0
    assert f"reference model {expected}" in capsys.readouterr().out


def test_calibrate_dry_run_lists_the_phases(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    assert main(["calibrate", "--engine", "vllm", "--launch", "--dry-run", "--model",
                 "llama-3.1-8b", "--gpu", "h100-sxm", "--max-num-seqs", "64",
                 "--max-model-len", "4096", "--out", str(tmp_path / "p.json")]) == 0
    text = capsys.readouterr().out
    assert ("phase prefill: 27 requests, prompts [16, 32, 64, 128, 256, 512, 1024, 2048, "
            "4092], one at a time") in text
    assert "phase decode-c64: 64 requests" in text
    assert "device h100-sxm; reference model llama-3.1-8b" in text
    assert not (tmp_path / "p.json").exists()
