"""Simulated runs: the reference engine on a virtual clock.

``simulate(requests, ReferenceConfig(...))`` runs a whole trace and returns a timeline per request
and a row per step (``driver``); ``run_simulation`` writes that as a run folder with the same
files as a live run, plus ``steps.parquet`` (``run``).

The names below are loaded when first used, not when the package is: ``batchlab simulate``
starts its report process (``harness.sim.report_process``, standard library only) before it
loads the engine, numpy and pyarrow, so that the report code loads beside them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.lazy import names_on_first_use

if TYPE_CHECKING:
    from harness.sim.driver import SimulationResult, simulate
    from harness.sim.run import read_steps, reference_engine_manifest, run_simulation

__all__ = [
    "SimulationResult",
    "read_steps",
    "reference_engine_manifest",
    "run_simulation",
    "simulate",
]

_HOME = {"SimulationResult": "driver", "simulate": "driver", "read_steps": "run",
         "reference_engine_manifest": "run", "run_simulation": "run"}


__getattr__ = names_on_first_use(__name__, globals(), _HOME)
