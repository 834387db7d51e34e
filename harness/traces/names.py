"""The trace formats, synthetic arrival processes and too-long policies by name: the command
line's choices, without loading the readers or numpy (``harness.traces``)."""

from __future__ import annotations

FORMATS = ("azure", "mooncake", "lengths", "vidur", "burstgpt", "synthetic")
ARRIVALS = ("poisson", "gamma", "constant")
ON_TOO_LONG = ("error", "drop", "clip")
