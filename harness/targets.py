"""Which ``Target`` runs a ``TargetSpec``: the simulated reference, or a live engine."""

from __future__ import annotations

from harness.live.target import LiveTarget
from harness.sim.target import SimulatedTarget
from harness.target import TargetSpec

__all__ = ["LiveTarget", "SimulatedTarget", "make_target"]


def make_target(spec: TargetSpec) -> SimulatedTarget | LiveTarget:
    return SimulatedTarget(spec) if spec.simulated else LiveTarget(spec)
