"""Summary figures of a loaded trace, for the report header and ``batchlab trace info``."""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.traces.records import Trace


def describe(trace: Trace) -> dict[str, Any]:
    """Summary figures of a trace (report header, ``batchlab trace info``).

    ``mean_rate_per_s`` is (N - 1) / (last - first arrival), None when undefined;
    ``interarrival_cv`` is std/mean of the gaps (1 is Poisson-like). Percentiles are numpy's
    linear interpolation.
    """
    n = len(trace.requests)
    arrivals = np.array([r.arrival_s for r in trace.requests], dtype=float)
    prompts = np.array([r.num_prompt_tokens for r in trace.requests], dtype=float)
    outputs = np.array([r.num_output_tokens for r in trace.requests], dtype=float)
    span = float(arrivals[-1] - arrivals[0]) if n else 0.0
    gaps = np.diff(arrivals)
    cv = float(gaps.std() / gaps.mean()) if len(gaps) and gaps.mean() > 0 else None

    def stats(name: str, values: np.ndarray) -> dict[str, float | None]:
        if not len(values):
            return {f"{name}_mean": None, f"{name}_p50": None, f"{name}_p99": None,
                    f"{name}_max": None}
        return {
            f"{name}_mean": float(values.mean()),
            f"{name}_p50": float(np.percentile(values, 50)),
            f"{name}_p99": float(np.percentile(values, 99)),
            f"{name}_max": float(values.max()),
        }

    return {
        "source": trace.source,
        "format": trace.format,
        "digest": trace.digest,
        "num_requests": n,
        "span_s": span,
        "mean_rate_per_s": (n - 1) / span if n > 1 and span > 0 else None,
        "interarrival_cv": cv,
        **stats("prompt_tokens", prompts),
        **stats("output_tokens", outputs),
        "num_with_priority": sum(1 for r in trace.requests if r.priority is not None),
        "num_high_priority": sum(1 for r in trace.requests if r.priority == 0),
        "num_with_prefix_hashes": sum(1 for r in trace.requests if r.prefix_hash_ids),
        "counts": dict(trace.counts),
        "notes": list(trace.notes),
    }


def arrivals_text(trace: Trace) -> str:
    """When the requests arrive, for ``batchlab trace info`` after their number: "over 424.3
    s; mean rate 4.71 req/s; inter-arrival CV 1.14", or, with no span to take a rate over,
    what there is instead: "at 0 s (one request: no rate)", "all at 0 s (...)"."""
    n = len(trace.requests)
    if not n:
        return "(none)"
    first, last = trace.requests[0].arrival_s, trace.requests[-1].arrival_s
    if n == 1:
        return f"at {first:,.6g} s (one request: no rate or inter-arrival CV)"
    if last == first:
        return f"all at {first:,.6g} s (at one instant: no rate or inter-arrival CV)"
    d = describe(trace)
    cv = d["interarrival_cv"]  # defined: some gap is longer than 0
    return (f"over {d['span_s']:,.1f} s; mean rate {d['mean_rate_per_s']:,.2f} req/s; "
            f"inter-arrival CV {cv:,.2f}")
