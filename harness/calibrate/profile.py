"""The profile: the fit as CostModelParams fields with its metadata, written by ``calibrate``."""

from __future__ import annotations

import asyncio
import math
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from adapters.base import Knobs, LaunchPlan
from adapters.process import probe_version
from adapters.reference.config import ReferenceConfig
from adapters.reference.cost_model import CostModel
from adapters.reference.hardware import GPUS
from harness.calibrate.device import NO_MEMORY_TERM_BANDWIDTH, fit_space, reference_config
from harness.calibrate.fit import CostShape, StepFit, StepSample, fit_step_model
from harness.calibrate.measure import (
    CalibrationError,
    KvCacheInfo,
    PhaseResult,
    probe_kv_cache,
    run_phases,
)
from harness.calibrate.workload import WorkloadSpec, design_workload
from harness.live.telemetry import DEFAULT_INTERVAL_S
from harness.manifest import batchlab_version, jsonable
from harness.redact import redact_argv, redact_tree, redact_url
from harness.results import write_json_atomic, write_parquet_atomic


def profile_params(fit: StepFit, config: ReferenceConfig, device: str,
                   kv: KvCacheInfo | None) -> tuple[dict[str, Any], list[str]]:
    """The fit as ``CostModelParams`` fields, and notes on what could not be identified."""
    notes: list[str] = []
    values: dict[str, Any] = {"device": device}
    c = fit.coefficients
    if fit.num_compute_bound == 0:
        notes.append("no measured step was compute-bound (prefills too short, batches too "
                     "small): the compute figure is the fit's guess, not a measurement, and "
                     "predictions of compute-bound steps (long prompts, large batches) are "
                     "not calibrated; a --long-prompt-tokens or --max-num-batched-tokens that "
                     "reaches the compute bound measures it")
    if device.lower() in GPUS:
        gpu = config.gpu_spec
        values["memory_efficiency"] = min(1.0, fit.memory_bytes_per_s
                                          / gpu.hbm_bandwidth_bytes_per_s)
        values["compute_efficiency"] = min(1.0, fit.compute_flops_per_s / gpu.peak_bf16_flops)
    else:
        bw = fit.memory_bytes_per_s
        if not math.isfinite(bw):  # the fit has no memory term: neither may the profile
            bw = NO_MEMORY_TERM_BANDWIDTH
            notes.append("no measured step was memory-bound, so the fit has no memory term and "
                         "the memory bandwidth is not identified; hbm_bandwidth_bytes_per_s "
                         f"{bw:.0e} stands for \"no memory term\" (bytes / bandwidth is then "
                         "negligible), so the profile predicts what the fit measured")
        values.update(memory_efficiency=1.0, compute_efficiency=1.0,
                      hbm_bandwidth_bytes_per_s=bw, peak_bf16_flops=fit.compute_flops_per_s,
                      activation_fixed_bytes=0.0)
    values.update(
        step_overhead_s=c["step_overhead_s"], per_seq_overhead_s=c["per_seq_overhead_s"],
        per_token_overhead_s=0.0, per_kv_token_overhead_s=c["per_kv_token_overhead_s"],
        per_attention_pair_overhead_s=c["per_attention_pair_overhead_s"],
        frontend_latency_s=c["frontend_latency_s"],
    )
    dtype_b = config.params.weight_bytes_per_param  # set from the engine's --dtype
    if dtype_b is not None:
        values.update(weight_bytes_per_param=dtype_b, kv_bytes_per_element=dtype_b)
    if device.lower() not in GPUS:
        values["memory_bytes"] = _device_memory_bytes(config, values, kv, notes)
    return values, notes


def _device_memory_bytes(config: ReferenceConfig, values: Mapping[str, Any],
                         kv: KvCacheInfo | None, notes: list[str]) -> float:
    """Memory such that the reference's KV budget (weights, activations, the rest for KV, at
    the knobs' memory utilisation) leaves the KV cache the engine reported."""
    params = replace(config.params, **{k: v for k, v in values.items() if k != "device"},
                     device=values["device"], memory_bytes=1e15)
    cm = CostModel(config.model_spec, config.gpu_spec, params,
                   weights_dtype=config.weights_dtype, kv_cache_dtype=config.kv_cache_dtype,
                   tp=config.tp, block_size=config.block_size)
    if kv is not None:
        kv_bytes = (kv.num_blocks + 0.5) * kv.block_size * cm.kv_bytes_per_token
    else:
        kv_bytes = 4 * 2**30
        notes.append("the engine did not report its KV cache size; memory_bytes leaves 4 GiB "
                     "for KV")
    reserve = cm.activation_reserve_bytes(config.max_num_batched_tokens, config.max_num_seqs)
    return float((cm.weight_bytes + reserve + kv_bytes) / config.gpu_memory_utilization)



@dataclass(frozen=True)
class CalibrationResult:
    profile: dict[str, Any]
    fit: StepFit
    phases: list[PhaseResult]
    samples: list[StepSample]
    kv: KvCacheInfo | None


def calibrate(
    plan: LaunchPlan,
    knobs: Knobs,
    *,
    reference_model: str,
    device: str,
    out_path: Path,
    work_dir: Path,
    spec: WorkloadSpec | None = None,
    tokenizer_path: str | None = None,
    telemetry_interval_s: float | None = DEFAULT_INTERVAL_S,
    command: Sequence[str] | None = None,
    log: Callable[[str], None] = print,
    replay: Mapping[str, Any] | None = None,
) -> CalibrationResult:
    """Run the workload against the server ``plan`` describes, fit, and write the profile.

    ``knobs`` are the server's (launched with them, or declared for an attached server);
    ``reference_model`` is the model's shape for the cost model (a catalog name or a local
    config.json); ``device`` names the hardware (a catalog GPU keeps its datasheet figures
    and gets efficiencies; anything else is described by effective figures). The phases'
    run folders and ``samples.parquet`` go to ``work_dir``. ``replay``: further
    ``ReplayConfig`` fields for the workload's requests (a prompt salt, ...).
    """
    kv = probe_kv_cache(plan.base_url)
    version = asyncio.run(probe_version(plan.base_url, plan.version_paths)).get("version")
    config = reference_config(reference_model, knobs, device, kv=kv)
    if spec is None:
        spec = WorkloadSpec(max_num_seqs=knobs.max_num_seqs,
                            max_num_batched_tokens=knobs.max_num_batched_tokens,
                            max_model_len=config.resolved_max_model_len)
    phases = design_workload(spec)
    log(f"calibrating {plan.engine} {version or '(version unknown)'} at {plan.base_url} on "
        f"{device}: {len(phases)} phases, "
        f"{sum(len(p.requests) for p in phases)} requests")
    started = time.perf_counter()
    results = run_phases(plan, phases, work_dir, tokenizer_path=tokenizer_path,
                         telemetry_interval_s=telemetry_interval_s, log=log, replay=replay)
    engine_s = time.perf_counter() - started
    samples = [s for r in results for s in r.samples]
    write_parquet_atomic(samples_table(samples), work_dir / SAMPLES_FILE)

    shape = CostShape.of(config.cost_model())
    fit = fit_step_model(samples, shape, fit_space(config, device))
    values, notes = profile_params(fit, config, device, kv)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    profile: dict[str, Any] = {
        **values,
        "source": f"batchlab calibrate: {plan.engine} {version or ''} on {device}, "
                  f"model {reference_model}, {created}".replace("  ", " "),
        "metadata": {
            "created_at": created,
            "batchlab_version": batchlab_version(),
            "command": redact_argv(command) if command is not None else None,
            "engine": {
                "name": plan.engine, "version": version, "base_url": redact_url(plan.base_url),
                "launched": plan.launch, "model": plan.model,
                "block_size": None if kv is None else kv.block_size,
                "num_kv_blocks": None if kv is None else kv.num_blocks,
            },
            "knobs": redact_tree(jsonable(knobs.as_dict())),  # extra_args' secret values
            "reference_model": reference_model,
            "device": device,
            "host": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                     "load_average": _load_average()},
            "fit": fit.as_dict(),
            "notes": notes,
            "workload": [r.as_dict() for r in results],
            "telemetry_interval_s": telemetry_interval_s,
            "engine_time_s": round(engine_s, 3),
            "work_dir": str(work_dir),
        },
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(profile, out_path)
    try:  # the profile must load as the reference engine will load it
        reference_config(reference_model, knobs, device, profile=str(out_path), kv=kv)
    except ValueError as exc:
        raise CalibrationError(f"{out_path}: the fitted profile does not load: {exc}") from None
    return CalibrationResult(profile, fit, results, samples, kv)


SAMPLES_FILE = "samples.parquet"


def samples_table(samples: Sequence[StepSample]) -> pa.Table:
    return pa.table({
        "phase": pa.array([s.phase for s in samples], pa.string()),
        "duration_s": pa.array([s.duration_s for s in samples], pa.float64()),
        "num_seqs": pa.array([s.num_seqs for s in samples], pa.int64()),
        "num_tokens": pa.array([s.num_tokens for s in samples], pa.int64()),
        "num_kv_tokens": pa.array([s.num_kv_tokens for s in samples], pa.float64()),
        "num_attention_pairs": pa.array([s.num_attention_pairs for s in samples], pa.float64()),
        "includes_frontend": pa.array([s.includes_frontend for s in samples], pa.bool_()),
        "num_steps": pa.array([s.num_steps for s in samples], pa.int64()),
    })



def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
