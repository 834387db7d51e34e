"""Where the roofline says decode turns from memory-bound to compute-bound, for a run's manifest.

A decode step of ``b`` requests reads the weights once and each request's KV; its FLOPs grow
with ``b``. While the bytes dominate (``memory_s >= compute_s``) a larger batch costs little
more per step: output tokens/s grow almost in proportion. Past the turn every request adds its
full compute: tokens/s flatten. The report marks this batch beside the measured batch sizes
(it cannot import the cost model, so the simulated run records it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from adapters.reference import ReferenceConfig
from harness.traces import TraceRequest


def decode_context_len(requests: Sequence[TraceRequest]) -> int:
    """The mean context a decoding request holds: its prompt plus half its output."""
    if not requests:
        return 1
    total = sum(r.num_prompt_tokens + r.num_output_tokens / 2 for r in requests)
    return max(1, round(total / len(requests)))


def roofline_turn(config: ReferenceConfig, context_len: int) -> dict[str, Any]:
    """The smallest decode batch that is compute-bound at ``context_len`` tokens of context, if
    the engine runs it (the KV cache holds it, within ``max_num_seqs``); with the ridge point
    where the cost model's bound turns (its efficiencies applied; the datasheet's beside it)
    and the intensity at the largest batch the engine runs."""
    cost = config.cost_model()
    gpu = config.gpu_spec
    blocks_per_request = -(-(context_len + 1) // config.block_size)
    in_kv = config.resolved_num_gpu_blocks() // blocks_per_request
    max_batch = min(in_kv, config.max_num_seqs)
    out: dict[str, Any] = {
        "context_len": context_len,
        "ridge_flop_per_byte": cost.ridge_flop_per_byte,
        "datasheet_ridge_flop_per_byte": gpu.peak_flops(config.weights_dtype)
        / gpu.hbm_bandwidth_bytes_per_s,
        "max_batch_in_kv": in_kv,
        "max_num_seqs": config.max_num_seqs,
        "max_batch": max_batch,
        "turn_batch_size": None,
        "intensity_at_max_batch": None,
    }
    if max_batch < 1:
        return out
    top = cost.decode_step_cost(max_batch, context_len)
    out["intensity_at_max_batch"] = top.arithmetic_intensity
    if top.bound == "memory":
        return out  # decode stays memory-bound up to the KV limit
    lo, hi = 0, max_batch  # memory-bound at lo (or lo == 0), compute-bound at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if cost.decode_step_cost(mid, context_len).bound == "compute":
            hi = mid
        else:
            lo = mid
    out["turn_batch_size"] = hi
    return out
