"""Every number the reference engine produces is a prediction: simulated, served over HTTP or
printed by ``batchlab costmodel``. ``prediction_record`` says of which engine model, and how
accurate that kind of prediction has been measured to be against published real-hardware
figures; run folders, the served engine's ``/version`` and the command line carry it, and
``harness.prediction`` words it."""

from __future__ import annotations

from typing import Any

from adapters.reference.config import ReferenceConfig
from adapters.reference.cost_model import ProfileError, profile_accuracy

# What the catalog's datasheet coefficients (no engine profile) miss by: 167 published rows of
# TensorRT-LLM on H100-SXM and H200 and vLLM on H100-SXM, simulated with the catalog
# coefficients and each engine's scheduler defaults (docs/published.md, "Catalog coefficients").
CATALOG_ACCURACY = {
    "median_abs_error": 0.171, "worst_abs_error": 1.10, "num_rows": 167,
    "note": "catalog datasheet coefficients, no engine overheads",
    "source": "docs/published.md",
}


def prediction_record(config: ReferenceConfig) -> dict[str, Any]:
    """``kind`` (catalog | profile), ``profile`` (its name or path) and ``accuracy``: the
    catalog's measured accuracy, the profile's held-out accuracy (``profile_accuracy``), or
    None when it was never measured (a calibrated profile of one's own)."""
    if config.profile is None:
        return {"kind": "catalog", "profile": None, "accuracy": CATALOG_ACCURACY}
    try:
        accuracy = profile_accuracy(config.profile)
    except ProfileError:
        accuracy = None
    return {"kind": "profile", "profile": config.profile, "accuracy": accuracy}
