"""Published real-hardware measurements, and engine profiles fitted on them.

    rows      harness/data/published/measurements.csv, one published figure per row
    replay    a row's workload through the reference engine under a profile -> predicted value
    frozen    a simulated row's schedule, re-timed quickly for new coefficients (the fit)
    fit       per-profile coefficients from training sources; whole sources held out
    check     every row, predicted vs published; docs/fidelity.md
    refit     fit + write every shipped profile + check
    cli       ``check-published``, ``profiles``, ``fit-published``

docs/published.md explains the method; docs/fidelity.md has the results.
"""

from harness.published.check import CheckedRow, check_rows, render_fidelity
from harness.published.profiles import EngineProfile, all_profiles, read_profile
from harness.published.replay import RowPrediction, predict_row
from harness.published.rows import PublishedRow, load_rows

__all__ = [
    "CheckedRow",
    "EngineProfile",
    "PublishedRow",
    "RowPrediction",
    "all_profiles",
    "check_rows",
    "load_rows",
    "predict_row",
    "read_profile",
    "render_fidelity",
]
