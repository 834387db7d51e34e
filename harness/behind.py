"""The warning a finished run gets when its engine fell behind its arrivals, worded the same
for ``simulate``, ``replay`` and a scenario's cells. Its own module, light to import: the
command line prints it after every run."""

from __future__ import annotations

from pathlib import Path

from harness.manifest import read_manifest
from harness.prediction import recorded_prediction
from harness.results import SUMMARY_FILE, read_json_object, run_pace


def fell_behind_warning(run_dir: Path) -> str:
    """What a finished run's engine did when it fell behind its arrivals, as ``simulate``
    warns of it ('' when it kept pace, or the check cannot be made); a predicted run's
    warning starts "predicted: " (its rates are predictions; what predicted them, and how
    accurately, the command prints beside its figures)."""
    manifest = read_manifest(run_dir)
    pace = run_pace(run_dir, read_json_object(run_dir / SUMMARY_FILE), manifest)
    warning = "" if pace is None else pace.behind_warning()
    found = recorded_prediction(manifest.get("engine"))
    if warning and found is not None:  # what predicted it the command says already
        warning = f"predicted: {warning}"
    return warning
