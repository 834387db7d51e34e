"""``batchlab costmodel``: TPOT and throughput against batch size, straight from the cost model."""

from __future__ import annotations

from dataclasses import dataclass

from adapters.reference.config import GIB, ReferenceConfig

BATCH_SIZES = (1, 4, 16, 64, 256)


@dataclass(frozen=True, slots=True)
class CostRow:
    """One decode step of ``batch_size`` requests, each holding ``context_len`` tokens."""

    batch_size: int
    fits_in_kv: bool
    tpot_s: float  # the step's duration: every request gets one token per step
    output_tokens_per_s: float
    arithmetic_intensity: float  # FLOPs per byte moved
    bound: str  # "memory" or "compute"
    memory_s: float
    compute_s: float


def _config(model: str, gpu: str | None, weights_dtype: str, kv_cache_dtype: str, tp: int,
            profile: str | None, gpu_memory_utilization: float) -> ReferenceConfig:
    return ReferenceConfig(model=model, gpu=gpu, tp=tp, weights_dtype=weights_dtype,
                           kv_cache_dtype=kv_cache_dtype, profile=profile,
                           gpu_memory_utilization=gpu_memory_utilization)


def costmodel_table(
    model: str,
    gpu: str | None,
    weights_dtype: str = "bf16",
    kv_cache_dtype: str = "bf16",
    tp: int = 1,
    context_len: int = 1024,
    *,
    profile: str | None = None,
    gpu_memory_utilization: float = 0.9,
) -> list[CostRow]:
    """Rows for batch sizes 1, 4, 16, 64, 256 and the largest batch the KV cache holds."""
    config = _config(model, gpu, weights_dtype, kv_cache_dtype, tp, profile,
                     gpu_memory_utilization)
    return _rows(config, context_len)


def _rows(config: ReferenceConfig, context_len: int) -> list[CostRow]:
    cost = config.cost_model()
    max_batch = _max_batch(config, context_len)
    sizes = sorted({*BATCH_SIZES, max_batch} - {0})
    rows = []
    for b in sizes:
        step = cost.decode_step_cost(b, context_len)
        rows.append(CostRow(
            batch_size=b, fits_in_kv=b <= max_batch, tpot_s=step.total_s,
            output_tokens_per_s=b / step.total_s, arithmetic_intensity=step.arithmetic_intensity,
            bound=step.bound, memory_s=step.memory_s, compute_s=step.compute_s,
        ))
    return rows


def _max_batch(config: ReferenceConfig, context_len: int) -> int:
    blocks_per_request = -(-(context_len + 1) // config.block_size)
    return config.resolved_num_gpu_blocks() // blocks_per_request


def costmodel_report(
    model: str,
    gpu: str | None,
    weights_dtype: str = "bf16",
    kv_cache_dtype: str = "bf16",
    tp: int = 1,
    context_len: int = 1024,
    *,
    profile: str | None = None,
    gpu_memory_utilization: float = 0.9,
) -> str:
    """The table with a header that shows where its numbers come from."""
    config = _config(model, gpu, weights_dtype, kv_cache_dtype, tp, profile,
                     gpu_memory_utilization)
    cost, m, g, p = config.cost_model(), config.model_spec, config.gpu_spec, config.params
    budget = config.kv_budget()
    ridge = g.peak_flops(weights_dtype) / g.hbm_bandwidth_bytes_per_s
    lines = [
        f"{m.name} on {g.name} x{tp}: weights {weights_dtype}, KV cache {kv_cache_dtype}, "
        f"decode with {context_len} tokens of context per request",
        f"  parameters {m.num_params / 1e9:.2f} B; weights {cost.weight_bytes * tp / 1e9:.2f} GB "
        f"({cost.weight_bytes_read / 1e9:.2f} GB read per step per GPU)",
        f"  KV {cost.kv_bytes_per_token / 1024:.0f} KiB per token per GPU; "
        f"{budget.num_blocks:,} blocks of {config.block_size} tokens "
        f"= {budget.num_blocks * config.block_size:,} tokens "
        f"({budget.kv_bytes / GIB:.1f} GiB of {budget.usable_bytes / GIB:.1f} GiB usable)",
        f"  {g.hbm_bandwidth_bytes_per_s / 1e12:.2f} TB/s x {p.memory_efficiency}, "
        f"{g.peak_flops(weights_dtype) / 1e12:.0f} TFLOP/s x {p.compute_efficiency}, "
        f"ridge {ridge:.0f} FLOP/byte; overhead {p.step_overhead_s * 1e3:.2f} ms/step "
        f"+ {p.per_seq_overhead_s * 1e6:.0f} us/request; coefficients: {p.source}",
    ]
    if weights_dtype == "fp8" and g.fp8_note:
        lines.append(f"  note: {g.fp8_note}")
    lines.append("")
    header = f"{'batch':>6} {'fits':>5} {'TPOT ms':>9} {'output tok/s':>13} " \
             f"{'FLOP/byte':>10} {'bound':>8} {'mem ms':>8} {'compute ms':>11}"
    lines.append(header)
    lines.append("-" * len(header))
    for r in _rows(config, context_len):
        lines.append(
            f"{r.batch_size:>6} {'yes' if r.fits_in_kv else 'no':>5} {r.tpot_s * 1e3:>9.2f} "
            f"{r.output_tokens_per_s:>13,.0f} {r.arithmetic_intensity:>10.1f} {r.bound:>8} "
            f"{r.memory_s * 1e3:>8.2f} {r.compute_s * 1e3:>11.2f}")
    return "\n".join(lines)
