"""Every number the reference engine produces is a prediction: simulated, served over HTTP or
printed by ``batchlab costmodel``. ``prediction_record`` says of which engine model, and how
accurate that kind of prediction has been measured to be against published real-hardware
figures; run folders, the served engine's ``/version`` and the command line carry it, and
``harness.prediction`` words it."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from adapters.reference.config import ReferenceConfig
from adapters.reference.cost_model import (
    ProfileError,
    profile_accuracy,
    profile_changed_since_measured,
    profile_metadata,
)

# What the catalog's datasheet coefficients (no engine profile) miss by: every published row
# simulated with its engine's scheduler defaults and the catalog coefficients. Written by
# `batchlab check-published --catalog --write-docs` (harness.published.catalog), with the same
# table in docs/published.md; never edited by hand.
CATALOG_ACCURACY_FILE = Path(__file__).with_name("catalog_accuracy.json")
_QUOTED = ("median_abs_error", "worst_abs_error", "num_rows", "note", "source", "measured",
           "by_kind")


@cache
def catalog_accuracy() -> dict[str, Any]:
    """The measured accuracy a run without a profile quotes (errors over all rows)."""
    record = json.loads(CATALOG_ACCURACY_FILE.read_text())
    return {key: record[key] for key in _QUOTED if key in record}


def prediction_record(config: ReferenceConfig) -> dict[str, Any]:
    """``kind`` (catalog | profile), ``profile`` (its name or path) and ``accuracy``: the
    catalog's measured accuracy, the profile's held-out accuracy (``profile_accuracy``), or
    None when it was never measured (a calibrated profile of one's own)."""
    if config.profile is None:
        return {"kind": "catalog", "profile": None, "accuracy": catalog_accuracy()}
    record: dict[str, Any] = {"kind": "profile", "profile": config.profile}
    try:
        record["accuracy"] = profile_accuracy(config.profile)
        if profile_changed_since_measured(config.profile):
            fit = profile_metadata(config.profile).get("fit") or {}
            record["accuracy_note"] = (
                "its coefficients or engine defaults differ from those its accuracy was "
                "measured with" if fit.get("measured_digest") else
                "its fit record does not say which coefficients its accuracy was measured with")
    except ProfileError:
        record["accuracy"] = None
    return record
