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
import math
import threading
from pathlib import Path

import pytest

from adapters.base import Knobs
from adapters.reference.config import ReferenceConfig
from adapters.reference.cost_model import CostModel, CostModelParams, load_profile
from harness.calibrate import CostShape, StepFit, StepSample, reference_config
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


# ---------------------------------------------------------------- setup S: an 8B model served

SERVED_8B = ("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-num-seqs", "8",
             "--max-num-batched-tokens", "2048", "--max-model-len", "2048")
TARGET_8B = ["--engine", "reference", "--model", "llama-3.1-8b", "--reference-model",
             "llama-3.1-8b", "--max-num-seqs", "8", "--max-num-batched-tokens", "2048",
             "--max-model-len", "2048"]


KNOBS_8B = Knobs(max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=2048)


def _decode_tpot_s(profile: Path | None, device: str) -> float:
    """A batch-1 decode step at 1,024 tokens of context, as `batchlab costmodel` times it."""
    config = reference_config("llama-3.1-8b", KNOBS_8B, device,
                              profile=None if profile is None else str(profile),
                              params=None if profile is not None else CostModelParams())
    return config.cost_model().decode_step_cost(1, 1024).total_s


def test_a_profile_of_an_unknown_device_predicts_what_its_fit_measured(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An 8B model on a device the catalog does not list (`--gpu testgpu`): the profile must
    time a decode step as the fit did (no memory floor the fit did not have) and as the
    served engine does."""
    profile = tmp_path / "p2.json"
    with launch_server_process(SERVED_8B, log_path=tmp_path / "server.log") as server:
        assert main(["calibrate", "--url", server.url, *TARGET_8B, "--gpu", "testgpu",
                     "--output-tokens", "16", "--out", str(profile)]) == 0
    out = capsys.readouterr().out
    served = _decode_tpot_s(None, "h100-sxm")  # the served engine: datasheet coefficients
    fitted = _decode_tpot_s(profile, "testgpu")
    assert fitted == pytest.approx(served, rel=0.1), out
    # the fit's own prediction of the same step, from the figures the profile records
    fit = json.loads(profile.read_text())["metadata"]["fit"]
    memory = fit["memory_bytes_per_s"]
    step = StepFit(math.inf if memory is None else memory, fit["compute_flops_per_s"],
                   {t: fit[t] for t in ("step_overhead_s", "per_seq_overhead_s",
                                        "per_kv_token_overhead_s",
                                        "per_attention_pair_overhead_s", "frontend_latency_s")},
                   0, 0, 0.0, 0.0)
    shape = CostShape.of(reference_config("llama-3.1-8b", KNOBS_8B, "testgpu").cost_model())
    (predicted,) = step.predict_s(shape, [StepSample(0.0, 1, 1, 1025, 1025)])
    assert fitted == pytest.approx(float(predicted), rel=0.02)


def test_calibrate_refuses_an_out_folder_before_the_engine_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "adir"
    folder.mkdir()
    # nothing listens on port 9: a check made after attaching would fail with "no ready
    # server" instead, after waiting for it
    assert main(["calibrate", "--url", "http://127.0.0.1:9", *TARGET_8B, "--gpu", "testgpu",
                 "--out", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"--out {folder}: is a folder" in err and "no ready server" not in err


@pytest.mark.parametrize("interval", ["0", "-1", "nan"])
def test_calibrate_refuses_a_telemetry_interval_not_above_zero(
        interval: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--url", "http://127.0.0.1:9", *TARGET_8B,
                 f"--telemetry-interval-s={interval}", "--out", str(tmp_path / "p.json")]) == 2
    assert "--telemetry-interval-s: must be a number of seconds > 0" in capsys.readouterr().err


def test_calibrate_refuses_a_url_that_is_not_http_at_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--url", "ftp://x", *TARGET_8B,
                 "--out", str(tmp_path / "u.json")]) == 2
    said = "--url: 'ftp://x': not an http(s)://host[:port] URL (scheme 'ftp')"
    assert said in capsys.readouterr().err
    assert not (tmp_path / "u.json").exists()  # refused before anything was probed
    assert main(["validate", "--url", "ftp://x", *TARGET_8B, "--profile", "p.json",
                 "--trace", "harness/data/azure_conv_excerpt.csv"]) == 2
    assert said in capsys.readouterr().err


def test_calibrate_workload_errors_name_the_flags(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--url", "http://127.0.0.1:9", *TARGET_8B, "--output-tokens", "4",
                 "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "--output-tokens must be >= 8" in err and "num_output_tokens" not in err


def test_calibrate_points_to_run_folders_only_when_there_are_some(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.live.session

    monkeypatch.setattr(harness.live.session, "ATTACH_READY_TIMEOUT_S", 0.5)
    unreachable = tmp_path / "u.json"  # nothing listens on port 9: nothing ran
    assert main(["calibrate", "--url", "http://127.0.0.1:9", *TARGET_8B,
                 "--out", str(unreachable)]) == 2
    err = capsys.readouterr().err
    assert "no ready server" in err and "run folders" not in err
    assert not unreachable.with_suffix(".calibration").exists()


def test_calibrate_exits_1_and_keeps_the_phases_when_the_server_dies(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The engine dies mid-calibration: a failed run (1, as replay), not bad input (2), and
    the phases measured so far stay on disk."""
    profile = tmp_path / "p.json"
    with launch_server_process(SERVED_8B, log_path=tmp_path / "server.log") as server:
        killer = threading.Timer(2.5, server.process.kill)  # a crash, not a graceful stop
        killer.start()
        try:
            code = main(["calibrate", "--url", server.url, *TARGET_8B, "--gpu", "testgpu",
                         "--output-tokens", "16", "--out", str(profile)])
        finally:
            killer.cancel()
    err = capsys.readouterr().err
    assert code == 1, err
    work_dir = profile.with_suffix(".calibration")
    assert "failed" in err and f"(run folders and server logs: {work_dir})" in err
    assert (work_dir / "pilot" / "requests.parquet").exists()
    assert not profile.exists()


def test_calibrate_summary_shows_small_terms_in_a_unit_that_shows_them() -> None:
    from harness.cli.calibration import fmt_duration

    assert fmt_duration(11.7e-6) == "11.7 µs"
    assert fmt_duration(6.41e-3) == "6.41 ms"
    assert fmt_duration(2.95e-9) == "2.95 ns"
    assert fmt_duration(1.5) == "1.5 s"
    assert fmt_duration(0.0) == "0 s"
