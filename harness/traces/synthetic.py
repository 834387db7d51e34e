"""Synthetic requests: arrival processes (poisson, gamma, constant) and lengths, fixed or
sampled from another trace.

Everything random is drawn from ``numpy`` generators seeded with the options' seed, one stream
per purpose, so that e.g. changing the arrival process keeps the priorities.
"""

from __future__ import annotations

import math

import numpy as np

from harness.traces.records import Row

STREAM_ARRIVALS = 0
STREAM_LENGTHS = 1
STREAM_PRIORITY = 2


def seeded_rng(seed: int, stream: int) -> np.random.Generator:
    """The generator of one purpose (``STREAM_*``) for one seed."""
    return np.random.default_rng([seed, stream])


def synthetic_arrivals_s(
    num_requests: int, rate: float, arrival: str, burstiness: float, rng: np.random.Generator
) -> np.ndarray:
    """Arrival instants: the first at 0, then ``num_requests - 1`` gaps.

    Gaps follow vLLM's ``get_request``: gamma(shape=burstiness, scale=1/(rate*burstiness)), so
    burstiness 1 is Poisson and the gap CV is 1/sqrt(burstiness); "constant" gaps are 1/rate.
    Like vLLM, the gaps are rescaled so their sum is exactly (n-1)/rate: the mean rate is then
    exactly ``rate`` for every seed. ``rate`` inf puts every arrival at 0.
    """
    if num_requests <= 1 or math.isinf(rate):
        return np.zeros(num_requests)
    n_gaps = num_requests - 1
    if arrival == "constant" or math.isinf(burstiness):
        gaps = np.full(n_gaps, 1.0 / rate)
    else:
        shape = 1.0 if arrival == "poisson" else burstiness
        gaps = rng.gamma(shape=shape, scale=1.0 / (rate * shape), size=n_gaps)
        total = float(gaps.sum())
        if not (0 < total < math.inf):
            # so bursty that every gap underflowed to 0: no rescaling can give the rate
            raise ValueError(f"burstiness {burstiness:g} is too small to draw arrivals at "
                             f"{rate:g} req/s (every gap came out 0 s); use at least 0.01")
        gaps *= (n_gaps / rate) / total
    return np.concatenate(([0.0], np.cumsum(gaps)))


def fixed_length_rows(num_requests: int, num_prompt_tokens: int, num_output_tokens: int
                      ) -> list[Row]:
    """``num_requests`` rows of the same lengths, numbered 0 … N-1; arrivals come later."""
    return [Row(str(i), 0, 0.0, num_prompt_tokens, num_output_tokens, None, ())
            for i in range(num_requests)]


def sampled_length_rows(pool: list[Row], num_requests: int, seed: int) -> list[Row]:
    """``num_requests`` rows whose (prompt, output) lengths are drawn with replacement from
    ``pool``, numbered 0 … N-1; the pool's arrivals, priorities and prefix hashes are dropped:
    drawn with replacement and out of order, the hashes would repeat whole prompts and break
    the order of a conversation's turns, so prefix sharing would be the sampler's, not the
    trace's."""
    picks = seeded_rng(seed, STREAM_LENGTHS).integers(0, len(pool), size=num_requests)
    return [
        pool[int(k)]._replace(request_id=str(i), arrival_s=0.0, priority=None,
                              prefix_hash_ids=())
        for i, k in enumerate(picks)
    ]
