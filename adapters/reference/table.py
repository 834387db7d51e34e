"""``batchlab costmodel``: TPOT and throughput against batch size, straight from the cost model.

The table models decode steps only: ``batch_size`` requests, each scheduling one token and
reading ``context_len + 1`` tokens of KV. Such a step schedules ``batch_size`` tokens, so the
token budget never binds before ``max_num_seqs`` does (``max_num_batched_tokens >=
max_num_seqs`` is a configuration rule): the largest batch the engine runs is the smaller of
what the KV cache holds and ``max_num_seqs``.
"""

from __future__ import annotations

from dataclasses import dataclass

from adapters.reference.config import GIB, ReferenceConfig
from adapters.reference.cost_model import (
    CostModel,
    ProfileError,
    profile_changed_since_measured,
    profile_metadata,
)

BATCH_SIZES = (1, 4, 16, 64, 256)


@dataclass(frozen=True, slots=True)
class CostRow:
    """One decode step of ``batch_size`` requests, each holding ``context_len`` tokens."""

    batch_size: int
    fits_in_kv: bool  # the KV cache holds batch_size requests of context_len + 1 tokens
    within_max_num_seqs: bool  # the scheduler runs batch_size requests at once
    tpot_s: float  # the step's duration: every request gets one token per step
    output_tokens_per_s: float
    arithmetic_intensity: float  # FLOPs per byte moved
    bound: str  # "memory" or "compute"
    memory_s: float
    compute_s: float

    @property
    def runs(self) -> bool:
        """The engine runs a batch this large: the KV cache holds it, the scheduler admits it."""
        return self.fits_in_kv and self.within_max_num_seqs


def costmodel_table(config: ReferenceConfig, context_len: int = 1024) -> list[CostRow]:
    """Rows for batch sizes 1, 4, 16, 64, 256 and the largest batch the engine runs
    (``largest_batch``), with the configuration ``simulate`` would use."""
    cost = config.cost_model()
    max_batch = largest_batch(config, context_len)
    sizes = sorted({*BATCH_SIZES, max_batch} - {0})
    max_in_kv = max_batch_in_kv(config, context_len)
    rows = []
    for b in sizes:
        step = cost.decode_step_cost(b, context_len)
        rows.append(CostRow(
            batch_size=b, fits_in_kv=b <= max_in_kv,
            within_max_num_seqs=b <= config.max_num_seqs, tpot_s=step.total_s,
            output_tokens_per_s=b / step.total_s, arithmetic_intensity=step.arithmetic_intensity,
            bound=step.bound, memory_s=step.memory_s, compute_s=step.compute_s,
        ))
    return rows


def max_batch_in_kv(config: ReferenceConfig, context_len: int) -> int:
    """How many requests of ``context_len + 1`` tokens the KV cache holds at once."""
    blocks_per_request = -(-(context_len + 1) // config.block_size)
    return config.resolved_num_gpu_blocks() // blocks_per_request


def largest_batch(config: ReferenceConfig, context_len: int) -> int:
    """The largest decode batch the engine runs: what the KV cache holds, within
    ``max_num_seqs`` and the step's token budget (one token per request)."""
    return min(max_batch_in_kv(config, context_len), config.max_num_seqs,
               config.max_num_batched_tokens)


def costmodel_report(config: ReferenceConfig, context_len: int = 1024) -> str:
    """The table with a header that shows where its numbers come from."""
    cost, m, g, p = config.cost_model(), config.model_spec, config.gpu_spec, config.params
    budget = config.kv_budget()
    num_blocks = config.resolved_num_gpu_blocks()
    blocks_from = (" (num_gpu_blocks)" if config.num_gpu_blocks is not None else
                   f" ({budget.kv_bytes / GIB:.1f} GiB of {budget.usable_bytes / GIB:.1f} GiB "
                   "usable)")
    in_kv, max_batch = max_batch_in_kv(config, context_len), largest_batch(config, context_len)
    weights_peak = g.peak_flops(config.weights_dtype)
    lines = [
        f"{m.name} on {g.name} x{config.tp}: weights {config.weights_dtype}, KV cache "
        f"{config.kv_cache_dtype}, decode with {context_len} tokens of context per request",
        f"  parameters {m.num_params / 1e9:.2f} B; weights "
        f"{cost.weight_bytes * config.tp / 1e9:.2f} GB ({cost.weight_bytes_read / 1e9:.2f} GB "
        "read per step per GPU)",
        f"  KV {cost.kv_bytes_per_token / 1024:.0f} KiB per token per GPU; "
        f"{num_blocks:,} blocks of {config.block_size} tokens "
        f"= {num_blocks * config.block_size:,} tokens{blocks_from}",
        f"  scheduler: max_num_seqs {config.max_num_seqs:,}, max_num_batched_tokens "
        f"{config.max_num_batched_tokens:,}; the KV cache holds {in_kv:,} requests of "
        f"{context_len + 1:,} tokens, so the largest batch that runs is {max_batch:,}",
        f"  {g.hbm_bandwidth_bytes_per_s / 1e12:.2f} TB/s x {p.memory_efficiency}, "
        f"{weights_peak / 1e12:.0f} TFLOP/s x {p.compute_efficiency}: ridge "
        f"{cost.ridge_flop_per_byte:.0f} FLOP/byte at these efficiencies, where the bound "
        f"turns (datasheet peaks: {weights_peak / g.hbm_bandwidth_bytes_per_s:.0f})",
        f"  overhead {_overhead(config, cost)}",
        f"  coefficients: {_coefficients(config)}",
    ]
    if config.weights_dtype == "fp8" and g.fp8_note:
        lines.append(f"  note: {g.fp8_note}")
    lines.append("")
    header = f"{'batch':>6} {'runs':>7} {'TPOT ms':>9} {'output tok/s':>13} " \
             f"{'FLOP/byte':>10} {'bound':>8} {'mem ms':>8} {'compute ms':>11}"
    lines.append(header)
    lines.append("-" * len(header))
    rows = costmodel_table(config, context_len)
    for r in rows:
        lines.append(
            f"{r.batch_size:>6} {_runs(r):>7} {r.tpot_s * 1e3:>9.2f} "
            f"{r.output_tokens_per_s:>13,.0f} {r.arithmetic_intensity:>10.1f} {r.bound:>8} "
            f"{r.memory_s * 1e3:>8.2f} {r.compute_s * 1e3:>11.2f}")
    if not all(r.runs for r in rows):
        lines.append("")
        lines.append(f"runs: no-kv = the KV cache does not hold that many requests; no-seqs = "
                     f"beyond max_num_seqs ({config.max_num_seqs:,}): the engine never runs that "
                     "many at once (the row is the cost model's what-if)")
    return "\n".join(lines)


def _runs(row: CostRow) -> str:
    if not row.fits_in_kv:
        return "no-kv"
    return "yes" if row.within_max_num_seqs else "no-seqs"


def _overhead(config: ReferenceConfig, cost: CostModel) -> str:
    """Every term a step adds beyond max(memory, compute) that is not zero here."""
    p = config.params
    terms = [f"{p.step_overhead_s * 1e3:.2f} ms/step",
             f"{p.per_seq_overhead_s * 1e6:.0f} us/request"]
    if p.per_token_overhead_s:
        terms.append(f"{p.per_token_overhead_s * 1e6:.3g} us/token")
    if p.per_kv_token_overhead_s:
        terms.append(f"{p.per_kv_token_overhead_s * 1e9:.3g} ns per KV token read")
    if cost.fp8_kv_token_overhead_s:
        terms.append(f"{cost.fp8_kv_token_overhead_s * 1e9:.3g} ns per KV token read (FP8 KV "
                     "dequantisation)")
    if p.per_attention_pair_overhead_s:
        terms.append(f"{p.per_attention_pair_overhead_s * 1e9:.3g} ns per attention pair")
    if config.tp > 1:
        num_allreduces = 2 * config.model_spec.num_layers
        terms.append(
            f"all-reduce {cost.allreduce_fixed_s * 1e3:.2f} ms/step ({num_allreduces} x "
            f"{p.allreduce_latency_s * 1e6:.3g} us: 2 per layer at tp {config.tp}) "
            f"+ {cost.allreduce_per_token_s * 1e6:.3g} us/token")
    return " + ".join(terms)


def _coefficients(config: ReferenceConfig) -> str:
    """Where the coefficients come from; a profile whose fit record was measured with other
    coefficients or engine defaults than the file has now says so (the accuracy footer's
    check), since its ``source`` still names the fit it was copied from."""
    source = config.params.source
    if config.profile is None:
        return source
    try:
        changed = profile_changed_since_measured(config.profile)
        fit = profile_metadata(config.profile).get("fit")
    except ProfileError:
        return source
    if not changed:
        return source
    if isinstance(fit, dict) and fit.get("measured_digest"):
        return (f"{source}, but {config.profile} is an edited copy: its coefficients or engine "
                "defaults differ from the fitted ones")
    return (f"{source}, but {config.profile}'s fit record does not say which coefficients "
            "were fitted: these may differ from them")
