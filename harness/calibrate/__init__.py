"""Calibrate the reference engine's cost model against a live engine.

``batchlab calibrate`` runs a short designed workload against a real server, measures engine
step times from the streamed token timestamps, fits the cost model's coefficients and writes a
profile (``adapters.reference.cost_model.load_profile`` reads it)::

    phases (one server, one after another)        what they isolate
      pilot         the prefill ladder, 1 user    nothing (warm-up; times the next phase)
      prefill       prompts 16..L, one at a time  prefill cost per token, front-end latency
      decode-cN     N requests at once, short     step cost per running sequence
      decode-long-cN  N at once, long prompts     step cost per KV token
           │
           ▼  token timestamps of all requests of a phase, clustered into engine steps
    StepSample(duration_s, num_seqs, num_tokens, num_kv_tokens, num_attention_pairs, ...)
           │
           ▼  weighted non-negative least squares inside a grid search (fit_step_model)
    step_s = max(bytes / B, flops / F) + step_overhead + per_seq·seqs + per_kv_token·kv
             + per_attention_pair·pairs
    ttft_s = frontend_latency + step_s(the prefill step)          (on an idle engine)
           │
           ▼
    PROFILE.json: CostModelParams fields (+ "metadata": the fit, its residuals, the workload)

Why token timestamps work: a running request gets exactly one token per engine step (vLLM V1,
TGI, TensorRT-LLM all stream each step's token as soon as the step ends), so the tokens of all
running requests arrive together, one cluster per step, and the gap between a request's
consecutive tokens is one step's duration. A span of steps is used only when everything it
computed is visible: the same members throughout, each advanced by the same number of tokens,
and no request waiting for its first token (an unseen prefill chunk could hide in it).
docs/cost-model.md ("Calibration") describes the method and its limits.

Modules, in the order the pipeline runs them::

    workload.py   the designed phases and their requests (``WorkloadSpec``, ``design_workload``)
    measure.py    the phases replayed against a live engine; KV cache, step counts, speed probe
    steps.py      engine steps recovered from the token timestamps (``decode_step_samples``)
    fit.py        ``StepSample``, the step-time model and its fit (``fit_step_model``; numpy)
    device.py     the device, and the reference engine configured like the live one
    profile.py    the fit as a profile with its metadata; ``calibrate``, the whole of it
"""

from harness.calibrate.device import (
    DEFAULT_DEVICE_WITHOUT_GPU,
    NO_MEMORY_TERM_BANDWIDTH,
    detect_device,
    engine_dtype_bytes,
    fit_space,
    gpu_catalog_name,
    reference_config,
)
from harness.calibrate.fit import (
    LINEAR_TERMS,
    MEMORY_TERM_MIN_GAIN,
    OUTLIER_MIN_SPREAD,
    CostShape,
    FitSpace,
    StepFit,
    StepSample,
    fit_step_model,
    nnls,
)
from harness.calibrate.measure import (
    CalibrationError,
    KvCacheInfo,
    PhaseResult,
    SpeedProbe,
    first_failure,
    kv_cache_from_metrics,
    probe_kv_cache,
    probe_reference,
    probe_server_knobs,
    run_phases,
    speed_probe,
)
from harness.calibrate.profile import (
    SAMPLES_FILE,
    CalibrationResult,
    calibrate,
    profile_params,
    samples_table,
)
from harness.calibrate.steps import decode_step_samples, first_token_samples, samples_from_phase
from harness.calibrate.workload import (
    SEND_GAP_S,
    Phase,
    WorkloadSpec,
    design_workload,
    phase_trace,
    space_arrivals,
)

__all__ = [
    "DEFAULT_DEVICE_WITHOUT_GPU",
    "LINEAR_TERMS",
    "MEMORY_TERM_MIN_GAIN",
    "NO_MEMORY_TERM_BANDWIDTH",
    "OUTLIER_MIN_SPREAD",
    "SAMPLES_FILE",
    "SEND_GAP_S",
    "CalibrationError",
    "CalibrationResult",
    "CostShape",
    "FitSpace",
    "KvCacheInfo",
    "Phase",
    "PhaseResult",
    "SpeedProbe",
    "StepFit",
    "StepSample",
    "WorkloadSpec",
    "calibrate",
    "decode_step_samples",
    "design_workload",
    "detect_device",
    "engine_dtype_bytes",
    "first_failure",
    "first_token_samples",
    "fit_space",
    "fit_step_model",
    "gpu_catalog_name",
    "kv_cache_from_metrics",
    "nnls",
    "phase_trace",
    "probe_kv_cache",
    "probe_reference",
    "probe_server_knobs",
    "profile_params",
    "reference_config",
    "run_phases",
    "samples_from_phase",
    "samples_table",
    "space_arrivals",
    "speed_probe",
]
