"""Accelerator catalog: the datasheet figures the cost model runs on.

Every figure names its source. Peaks are *dense* tensor-core throughput (NVIDIA datasheets
print the 2:4-sparsity figure first, with an asterisk; the dense figure is half of it).
Bandwidths are bytes per second in one direction unless a field says otherwise. A calibration
profile (``CostModelParams``) may override any figure or describe a device that is not listed
here, such as a CPU.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

GB = 1e9
TB = 1e12
TFLOPS = 1e12
MIB = 2**20


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One accelerator, as the cost model sees it."""

    name: str
    memory_bytes: float  # device memory the runtime reports as total
    hbm_bandwidth_bytes_per_s: float  # peak device-memory bandwidth
    peak_bf16_flops: float  # dense BF16 tensor-core peak, FLOP/s
    peak_fp8_flops: float | None  # dense FP8 tensor-core peak; None: no FP8 tensor cores
    pcie_bandwidth_bytes_per_s: float  # host link, per direction (KV swap goes over it)
    interconnect_bandwidth_bytes_per_s: float  # GPU-to-GPU, per direction (tensor parallel)
    source: str
    # GPUs the interconnect joins (None: all of a node's): a tensor-parallel group larger than
    # this has its all-reduces go over PCIe (an H100 PCIe's NVLink bridge joins pairs only)
    interconnect_group: int | None = None

    def tp_bandwidth_bytes_per_s(self, tp: int) -> float:
        """Per-direction bandwidth of the links a tensor-parallel group of ``tp`` all-reduces
        over: the interconnect's, or PCIe's where the interconnect does not join them all."""
        if self.interconnect_group is not None and tp > self.interconnect_group:
            return self.pcie_bandwidth_bytes_per_s
        return self.interconnect_bandwidth_bytes_per_s

    @property
    def fp8_note(self) -> str:
        return "" if self.peak_fp8_flops is not None else (
            f"{self.name} has no FP8 tensor cores: FP8 weights are costed at the BF16 peak "
            "(they still halve the bytes read)"
        )

    def peak_flops(self, dtype: str) -> float:
        """Tensor-core peak for matmuls whose weights are ``dtype``."""
        if dtype == "fp8" and self.peak_fp8_flops is not None:
            return self.peak_fp8_flops
        return self.peak_bf16_flops


# nvidia-smi reports "81559MiB" total for the 80 GB H100 (SXM5 and PCIe), "143771MiB" for the
# H200 and "81920MiB" for the A100 80GB; the datasheets say "80GB" / "141GB" / "80GB".
GPUS: dict[str, GpuSpec] = {
    "h100-sxm": GpuSpec(
        name="h100-sxm",
        memory_bytes=81559 * MIB,
        hbm_bandwidth_bytes_per_s=3.35 * TB,
        peak_bf16_flops=989.4 * TFLOPS,
        peak_fp8_flops=1978.9 * TFLOPS,
        pcie_bandwidth_bytes_per_s=64 * GB,
        interconnect_bandwidth_bytes_per_s=450 * GB,
        source=(
            "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column): GPU memory 80GB, "
            "bandwidth 3.35TB/s, BF16 1,979 TFLOPS and FP8 3,958 TFLOPS with sparsity "
            "(dense = half), NVLink 900GB/s (bidirectional; 450GB/s per direction), "
            "PCIe Gen5 128GB/s (bidirectional; 64GB/s per direction)"
        ),
    ),
    "h100-pcie": GpuSpec(
        name="h100-pcie",
        memory_bytes=81559 * MIB,
        hbm_bandwidth_bytes_per_s=2.0 * TB,
        peak_bf16_flops=756.5 * TFLOPS,
        peak_fp8_flops=1513.0 * TFLOPS,
        pcie_bandwidth_bytes_per_s=64 * GB,
        interconnect_bandwidth_bytes_per_s=300 * GB,
        interconnect_group=2,
        source=(
            "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe column): GPU memory 80GB, "
            "bandwidth 2TB/s, BF16 1,513 TFLOPS and FP8 3,026 TFLOPS with sparsity "
            "(dense = half), NVLink bridge 600GB/s (bidirectional, pairs only), "
            "PCIe Gen5 128GB/s (bidirectional)"
        ),
    ),
    "h200": GpuSpec(
        name="h200",
        memory_bytes=143771 * MIB,
        hbm_bandwidth_bytes_per_s=4.8 * TB,
        peak_bf16_flops=989.4 * TFLOPS,
        peak_fp8_flops=1978.9 * TFLOPS,
        pcie_bandwidth_bytes_per_s=64 * GB,
        interconnect_bandwidth_bytes_per_s=450 * GB,
        source=(
            "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column): GPU memory 141GB, "
            "bandwidth 4.8TB/s, BF16 1,979 TFLOPS and FP8 3,958 TFLOPS with sparsity "
            "(dense = half), NVLink 900GB/s (bidirectional), PCIe Gen5 128GB/s (bidirectional)"
        ),
    ),
    "a100-80gb": GpuSpec(
        name="a100-80gb",
        memory_bytes=81920 * MIB,
        hbm_bandwidth_bytes_per_s=2.039 * TB,
        peak_bf16_flops=312.0 * TFLOPS,
        peak_fp8_flops=None,  # Ampere has no FP8 tensor cores
        pcie_bandwidth_bytes_per_s=32 * GB,
        interconnect_bandwidth_bytes_per_s=300 * GB,
        source=(
            "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column): GPU memory 80GB "
            "HBM2e, bandwidth 2,039GB/s, BF16 Tensor Core 312 TFLOPS (624 with sparsity), "
            "no FP8, NVLink 600GB/s (bidirectional), PCIe Gen4 64GB/s (bidirectional)"
        ),
    ),
}


class UnknownHardwareError(ValueError):
    """The name is neither in the catalog nor described by a profile."""


def known_gpus() -> tuple[str, ...]:
    return tuple(sorted(GPUS))


def gpu_hint(name: str) -> str:
    """`` (did you mean 'h100-pcie' or 'h100-sxm'?)`` for a GPU name not in the catalog, or
    ``""``: every catalog name the typed one begins (``h100``: both H100s, not the H200 one
    letter away), else the closest by spelling."""
    typed = name.lower()
    close = [g for g in known_gpus() if g.startswith(typed)] if typed else []
    if not close:
        close = difflib.get_close_matches(typed, known_gpus(), n=1, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(g) for g in close)}?)" if close else ""


def lookup_gpu(name: str) -> GpuSpec:
    """The catalog entry for ``name``; a clear error lists the known names."""
    try:
        return GPUS[name.lower()]
    except KeyError:
        raise UnknownHardwareError(
            f"unknown GPU {name!r}{gpu_hint(name)}"
            + f"; known GPUs: {', '.join(known_gpus())} "
            "(a --profile JSON may describe another device with all of memory_bytes, "
            "hbm_bandwidth_bytes_per_s, peak_bf16_flops)"
        ) from None
