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
    resolve_profile,
    shipped_profiles,
)

# What the catalog's datasheet coefficients (no engine profile) miss by: every published row
# simulated with its engine's scheduler defaults and the catalog coefficients. Written by
# `batchlab check-published --catalog --write-docs` (harness.published.catalog), with the same
# table in docs/published.md; never edited by hand.
CATALOG_ACCURACY_FILE = Path(__file__).with_name("catalog_accuracy.json")
# The models and GPUs of the figures each accuracy was measured on: written by
# `batchlab check-published --write-docs` (harness.published.coverage); never edited by hand.
COVERAGE_FILE = Path(__file__).with_name("published_coverage.json")
_QUOTED = ("median_abs_error", "worst_abs_error", "num_rows", "note", "source", "measured",
           "by_kind")


@cache
def catalog_accuracy() -> dict[str, Any]:
    """The measured accuracy a run without a profile quotes (errors over all rows)."""
    record = json.loads(CATALOG_ACCURACY_FILE.read_text())
    return {key: record[key] for key in _QUOTED if key in record}


@cache
def coverage_record() -> dict[str, Any]:
    """``published_coverage.json``: {} when it is missing or unreadable (then no record
    says what its figures cover)."""
    try:
        record = json.loads(COVERAGE_FILE.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def prediction_record(config: ReferenceConfig) -> dict[str, Any]:
    """``kind`` (catalog | profile), ``profile`` (its name or path) and ``accuracy``: the
    catalog's measured accuracy, the profile's held-out accuracy (``profile_accuracy``), or
    None when it was never measured (a calibrated profile of one's own).

    With an accuracy: ``covers``, the models and GPUs of the figures it was measured on, and
    ``coverage_note`` when this configuration's model or GPU is none of them (its error is
    then not measured: the figures are of other hardware or another model), else
    ``coverage_by_kind`` when that is so of some kinds of figure only (``_with_coverage``)."""
    if config.profile is None:
        record: dict[str, Any] = {"kind": "catalog", "profile": None,
                                  "accuracy": catalog_accuracy()}
        return _with_coverage(record, config, coverage_record().get("catalog"))
    record = {"kind": "profile", "profile": config.profile}
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
    if record["accuracy"] is None:
        return record
    profiles = coverage_record().get("profiles")
    name = _shipped_name(config.profile)
    covers = profiles.get(name) if isinstance(profiles, dict) and name else None
    return _with_coverage(record, config, covers)


def _shipped_name(profile: str) -> str | None:
    """The shipped profile ``profile`` names, or is the file of; None for one's own."""
    if profile in shipped_profiles():
        return profile
    try:
        path = resolve_profile(profile).resolve()
    except (ProfileError, OSError):
        return None
    stem = path.stem
    shipped = resolve_profile(stem).resolve() if stem in shipped_profiles() else None
    return stem if shipped == path else None


def _with_coverage(record: dict[str, Any], config: ReferenceConfig,
                   covers: object) -> dict[str, Any]:
    """``covers`` and ``coverage_note`` (module doc); and ``coverage_by_kind``: {kind:
    {"note", "outside"}} for each kind of figure (throughput, TTFT, ...) whose own figures
    are none of this model or GPU while the others' are (each kind's error is quoted on its
    own); ``outside`` names what they are not of ("GPU a100-80gb")."""
    if not isinstance(covers, dict):
        return record
    models, gpus = _names(covers, "models"), _names(covers, "gpus")
    record["covers"] = {"models": models, "gpus": gpus}
    found = _outside(config, models, gpus)
    if found:
        record["coverage_note"] = _note("published figures its accuracy was measured on",
                                        found)
        return record  # every kind's figures are of others too: said once
    by_kind = covers.get("by_kind")
    notes = {}
    for kind, of in (by_kind.items() if isinstance(by_kind, dict) else ()):
        if not isinstance(of, dict):
            continue
        found = _outside(config, _names(of, "models"), _names(of, "gpus"))
        if found:
            notes[str(kind)] = {"note": _note(f"published {kind} figures its accuracy was "
                                              "measured on", found),
                                "outside": " nor of this ".join(short for short, _ in found)}
    if notes:
        record["coverage_by_kind"] = notes
    return record


def _names(covers: dict[str, Any], key: str) -> list[str]:
    return [str(n) for n in covers.get(key) or []]


def _outside(config: ReferenceConfig, models: list[str], gpus: list[str]
             ) -> list[tuple[str, str]]:
    """What published figures of ``models`` on ``gpus`` are not of: [("GPU h100-pcie",
    "they are on a100-80gb and h100-sxm")], [] when they include this model and GPU."""
    model, gpu = config.model_spec.name, config.gpu_spec.name
    return ([(f"model {model}", f"they are of {_listed(models)}")] if model not in models
            else []) + ([(f"GPU {gpu}", f"they are on {_listed(gpus)}")] if gpu not in gpus
                        else [])


def _note(figures: str, outside: list[tuple[str, str]]) -> str:
    """"none of the <figures> is of this GPU h100-pcie (they are on ...): its error here was
    never measured"."""
    return (f"none of the {figures} is of this "
            + " nor of this ".join(f"{short} ({said})" for short, said in outside)
            + ": its error here was never measured")


def _listed(names: list[str]) -> str:
    if len(names) <= 1:
        return names[0] if names else "none"
    return ", ".join(names[:-1]) + " and " + names[-1]
