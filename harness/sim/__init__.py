"""Simulated runs: the reference engine on a virtual clock.

``simulate(requests, ReferenceConfig(...))`` runs a whole trace and returns a timeline per request
and a row per step (``driver``); ``run_simulation`` writes that as a run folder with the same
files as a live run, plus ``steps.parquet`` (``run``).
"""

from harness.sim.driver import SimulationResult, simulate
from harness.sim.run import read_steps, reference_engine_manifest, run_simulation

__all__ = [
    "SimulationResult",
    "read_steps",
    "reference_engine_manifest",
    "run_simulation",
    "simulate",
]
