"""SLO capacity planning: the highest load each engine × knob setting serves within its SLO.

``search`` brackets then bisects the load (request rate, or closed-loop users) with a probe
function; ``probe`` runs one probe as a recorded run on any target (simulated or live), stopped
early by ``saturation`` once the engine is clearly over-saturated; ``run`` searches several
settings and records ``search.json`` per setting (resumable); ``settings`` builds them from a
scenario or from one target.
"""

from harness.capacity.probe import ProbePlan, run_probe, trace_file_at
from harness.capacity.run import (
    CAPACITY_FILE,
    SEARCH_FILE,
    Setting,
    SettingResult,
    known_probes,
    run_capacity,
    run_search,
)
from harness.capacity.saturation import SaturationMonitor
from harness.capacity.search import ProbeOutcome, SearchResult, SearchSpec, search
from harness.capacity.settings import scenario_settings, single_setting

__all__ = [
    "CAPACITY_FILE",
    "SEARCH_FILE",
    "ProbeOutcome",
    "ProbePlan",
    "SaturationMonitor",
    "SearchResult",
    "SearchSpec",
    "Setting",
    "SettingResult",
    "known_probes",
    "run_capacity",
    "run_probe",
    "run_search",
    "scenario_settings",
    "search",
    "single_setting",
    "trace_file_at",
]
