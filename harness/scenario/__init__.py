"""Scenarios: one experiment in a YAML file, expanded into cells and run as a sweep."""

from harness.scenario.cell import CellJob, CellRunner, ProgressFn, run_cell
from harness.scenario.expand import assign_priorities, load_cell_trace, select
from harness.scenario.load import load_scenario
from harness.scenario.runner import SweepProgress, SweepResult, run_scenario
from harness.scenario.schema import (
    Cell,
    EngineSpec,
    LoadPoint,
    PriorityClass,
    Scenario,
    ScenarioError,
    TraceSpec,
    expand,
)
from harness.scenario.status import CellOutcome, read_status

__all__ = [
    "Cell",
    "CellJob",
    "CellOutcome",
    "CellRunner",
    "EngineSpec",
    "LoadPoint",
    "PriorityClass",
    "ProgressFn",
    "Scenario",
    "ScenarioError",
    "SweepProgress",
    "SweepResult",
    "TraceSpec",
    "assign_priorities",
    "expand",
    "load_cell_trace",
    "load_scenario",
    "read_status",
    "run_cell",
    "run_scenario",
    "select",
]
