"""The device calibrated, and the reference engine configured like the live one on it."""

from __future__ import annotations

import shutil
import subprocess

from adapters.base import Knobs
from adapters.knobs import ReferenceKnobs
from adapters.reference.config import ReferenceConfig
from adapters.reference.cost_model import CostModelParams
from adapters.reference.hardware import GPUS
from harness.calibrate.fit import FitSpace
from harness.calibrate.measure import KvCacheInfo

DEFAULT_DEVICE_WITHOUT_GPU = "cpu"
# How a profile says "no memory term" (the fit found no memory-bound step) in a field the
# cost model reads as a bandwidth: bytes / 1e18 B/s is 16 ns for 16 GB of weights, far below
# any step, so the profile predicts the fit's own max(0, flops / F) + overheads.
NO_MEMORY_TERM_BANDWIDTH = 1e18
_DTYPE_BYTES = {"float32": 4.0, "fp32": 4.0, "float": 4.0, "float16": 2.0, "half": 2.0,
                "fp16": 2.0, "bfloat16": 2.0, "bf16": 2.0}


def detect_device() -> str:
    """The local accelerator as a catalog name (``nvidia-smi``), else ``cpu``.

    Only meaningful when the engine runs on this machine; pass ``--device`` otherwise."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return DEFAULT_DEVICE_WITHOUT_GPU
    try:
        out = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return DEFAULT_DEVICE_WITHOUT_GPU
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return gpu_catalog_name(names[0]) if names else DEFAULT_DEVICE_WITHOUT_GPU


def gpu_catalog_name(nvidia_name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``h100-sxm``; unknown names are slugged as they are."""
    n = nvidia_name.lower()
    if "h200" in n:
        return "h200"
    if "h100" in n:
        return "h100-pcie" if "pcie" in n else "h100-sxm"
    if "a100" in n and "80" in n:
        return "a100-80gb"
    return "-".join(n.replace("nvidia", "").split())


def engine_dtype_bytes(knobs: Knobs) -> float | None:
    """Bytes per weight and KV element when ``extra_args`` set the engine's ``--dtype``
    (e.g. float32 on a CPU); None: the knobs' own dtypes apply."""
    args = list(knobs.extra_args)
    for i, arg in enumerate(args):
        value = None
        if arg == "--dtype" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--dtype="):
            value = arg.split("=", 1)[1]
        if value is not None:
            return _DTYPE_BYTES.get(value.lower())
    return None


def reference_config(reference_model: str, knobs: Knobs, device: str, *,
                     params: CostModelParams | None = None, profile: str | None = None,
                     kv: KvCacheInfo | None = None) -> ReferenceConfig:
    """The reference engine configured like the live one: the same knobs, the same KV cache
    (when the engine reported it), on ``device`` with ``params`` or a ``profile`` file (neither:
    placeholder figures, enough for the cost model's shape)."""
    catalog = device.lower() in GPUS
    if params is None and profile is None:
        dtype_b = engine_dtype_bytes(knobs)
        params = CostModelParams(
            device=None if catalog else device,
            memory_bytes=None if catalog else 1e12,
            hbm_bandwidth_bytes_per_s=None if catalog else 1e12,
            peak_bf16_flops=None if catalog else 1e12,
            weight_bytes_per_param=dtype_b, kv_bytes_per_element=dtype_b,
        )
    reference = (ReferenceKnobs() if kv is None
                 else ReferenceKnobs(block_size=kv.block_size, num_gpu_blocks=kv.num_blocks))
    return ReferenceConfig.from_knobs(knobs, reference, model=reference_model,
                                      gpu=device if catalog else None, profile=profile,
                                      cost_params=params)


def fit_space(config: ReferenceConfig, device: str) -> FitSpace:
    """Where the fit looks for ``device`` (see ``FitSpace``)."""
    if device.lower() in GPUS:
        gpu = config.gpu_spec
        return FitSpace(
            bandwidth_range=(0.02 * gpu.hbm_bandwidth_bytes_per_s, gpu.hbm_bandwidth_bytes_per_s),
            compute_range=(0.005 * gpu.peak_bf16_flops, gpu.peak_bf16_flops),
            allow_no_memory_term=False, attention_overheads=False)
    return FitSpace()  # wide ranges: from a slow CPU to beyond today's fastest GPUs
