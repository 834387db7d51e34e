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
    profile_digest,
    profile_metadata,
    profile_scheduler_defaults,
    resolve_profile,
    shipped_profiles,
)

# What the catalog's datasheet coefficients (no engine profile) miss by: every published row
# simulated with its engine's scheduler defaults and the catalog coefficients. Written by
# `batchlab check-published --catalog --write-docs` (harness.published.catalog), with the same
# table in docs/published.md; never edited by hand.
CATALOG_ACCURACY_FILE = Path(__file__).with_name("catalog_accuracy.json")
# The models, GPUs and weights and KV-cache data types of the figures each accuracy was
# measured on: written by `batchlab check-published --write-docs` (harness.published.coverage);
# never edited by hand.
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

    With an accuracy: ``covers``, the models, GPUs and weights and KV-cache data types of the
    figures it was measured on, and ``coverage_note`` when this configuration's model, GPU,
    weights dtype or KV-cache dtype is none of them (its error is then not measured: the
    figures are of other hardware, another model or other data types), else
    ``coverage_by_kind`` when that is so of some kinds of figure only (``_with_coverage``).
    A profile given by path that is an unchanged copy of a shipped one has that one's
    coverage (``_shipped_name``)."""
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
    differ = _settings_not_defaults(config)
    if differ:
        record["settings_not_defaults"] = differ
    profiles = coverage_record().get("profiles")
    name = _shipped_name(config.profile)
    covers = profiles.get(name) if isinstance(profiles, dict) and name else None
    return _with_coverage(record, config, covers)


def _settings_not_defaults(config: ReferenceConfig) -> dict[str, dict[str, Any]]:
    """The engine settings this run has that are not its profile's defaults (a flag or a
    scenario knob that overrides them): {setting: {"value", "default"}}. The profile's
    accuracy was measured with those defaults, save where a published row set its own."""
    try:
        defaults = profile_scheduler_defaults(config.profile) if config.profile else {}
    except ProfileError:
        return {}
    differ = {}
    for key, default in defaults.items():
        # admission as it takes effect (derived from preemption when not given)
        value = getattr(config, f"resolved_{key}", getattr(config, key, default))
        if value != default:
            differ[key] = {"value": value, "default": default}
    return differ


def _shipped_name(profile: str) -> str | None:
    """The shipped profile ``profile`` names, or is a copy of wherever it lies: the one whose
    coefficients and engine defaults (``profile_digest``, the digest its accuracy was
    measured with) are the file's, and, should two shipped profiles share those, whose fit
    record is the file's too. None for one's own (an edited copy among them)."""
    if profile in shipped_profiles():
        return profile
    raw = _raw_profile(profile)
    if raw is None:
        return None
    digest = profile_digest(raw)
    same = [name for name in shipped_profiles()
            if (shipped := _raw_profile(name)) is not None and profile_digest(shipped) == digest]
    if len(same) > 1:
        fit = _fit(raw)
        same = [name for name in same if _fit(_raw_profile(name)) == fit]
    return same[0] if len(same) == 1 else None


def _raw_profile(profile: str) -> dict[str, Any] | None:
    """A profile file's JSON object; None when it cannot be read."""
    try:
        raw = json.loads(resolve_profile(profile).read_text())
    except (ProfileError, OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


def _fit(raw: dict[str, Any] | None) -> object:
    meta = raw.get("metadata") if isinstance(raw, dict) else None
    return meta.get("fit") if isinstance(meta, dict) else None


# What a published row records of the run it measured that a prediction's may be outside:
# the keys of ``covers`` listing those of the figures (harness.published.coverage).
_MODELS, _GPUS = "models", "gpus"
_WEIGHTS, _KV = "weights_dtypes", "kv_cache_dtypes"


def _with_coverage(record: dict[str, Any], config: ReferenceConfig,
                   covers: object) -> dict[str, Any]:
    """``covers`` (the models, GPUs, weights and KV-cache data types of the figures) and
    ``coverage_note`` (module doc); and ``coverage_by_kind``: {kind: {"note", "each",
    "outside"}} for each kind of figure (throughput, TTFT, ...) whose own figures are none of
    this model, GPU or data type while the others' are (each kind's error is quoted on its own);
    ``outside`` says what none of them is or has ("is of this GPU a100-80gb", "has fp8
    weights"), as ``coverage_outside`` does of the whole record's. ``coverage_each`` (and each
    kind's ``each``): the note once for each thing the
    figures are not of, alone, so that a report can say once what several runs share. A
    coverage file that lists no data types (written before they were) says
    nothing of them."""
    if not isinstance(covers, dict):
        return record
    record["covers"] = {key: _names(covers, key) for key in (_MODELS, _GPUS, _WEIGHTS, _KV)
                        if key in covers or key in (_MODELS, _GPUS)}
    found = _outside(config, covers)
    figures = "published figures its accuracy was measured on"
    if found:
        record["coverage_note"] = _note(figures, found)
        record["coverage_each"] = [_note(figures, [part]) for part in found]
        record["coverage_outside"] = _predicate([(verb, what) for verb, what, _ in found])
        return record  # every kind's figures are of others too: said once
    by_kind = covers.get("by_kind")
    notes = {}
    for kind, of in (by_kind.items() if isinstance(by_kind, dict) else ()):
        if not isinstance(of, dict):
            continue
        found = _outside(config, of)
        if found:
            of_kind = f"published {kind} figures its accuracy was measured on"
            notes[str(kind)] = {"note": _note(of_kind, found),
                                "each": [_note(of_kind, [part]) for part in found],
                                "outside": _predicate([(verb, what) for verb, what, _ in found])}
    if notes:
        record["coverage_by_kind"] = notes
    return record


def _names(covers: dict[str, Any], key: str) -> list[str]:
    return [str(n) for n in covers.get(key) or []]


def _outside(config: ReferenceConfig, covers: dict[str, Any]) -> list[tuple[str, str, str]]:
    """What the published figures ``covers`` lists are not of, or do not have, that this run
    is or has: [("is", "of this GPU h100-pcie", "they are on a100-80gb and h100-sxm"), ("has",
    "fp8 weights", "they are bf16")]; [] when they include its model, GPU and data types (a
    data type ``covers`` does not list at all is not checked)."""
    found = []
    model, gpu = config.model_spec.name, config.gpu_spec.name
    models, gpus = _names(covers, _MODELS), _names(covers, _GPUS)
    if model not in models:
        found.append(("is", f"of this model {model}", f"they are of {_listed(models)}"))
    if gpu not in gpus:
        found.append(("is", f"of this GPU {gpu}", f"they are on {_listed(gpus)}"))
    weights, kv = config.weights_dtype, config.kv_cache_dtype
    if _WEIGHTS in covers and weights not in (dtypes := _names(covers, _WEIGHTS)):
        found.append(("has", f"{weights} weights", f"they are {_listed(dtypes)}"))
    if _KV in covers and kv not in (dtypes := _names(covers, _KV)):
        found.append(("has", f"{_article(kv)} {kv} KV cache", f"theirs are {_listed(dtypes)}"))
    return found


def _predicate(parts: list[tuple[str, str]]) -> str:
    """"is of this model x nor of this GPU y nor has fp8 weights nor an fp8 KV cache": a verb
    is not said again after itself."""
    text, last = "", None
    for verb, what in parts:
        text += (" nor " if text else "") + (what if verb == last else f"{verb} {what}")
        last = verb
    return text


def _note(figures: str, outside: list[tuple[str, str, str]]) -> str:
    """"none of the <figures> is of this GPU h100-pcie (they are on ...) nor has fp8 weights
    (they are bf16): its error here was never measured"."""
    return (f"none of the {figures} "
            + _predicate([(verb, f"{what} ({said})") for verb, what, said in outside])
            + ": its error here was never measured")


def _article(dtype: str) -> str:
    """"an" before a data type whose name is said with a vowel sound ("an fp8", "a bf16")."""
    return "an" if dtype[:1].lower() in "aefhilmnorsx" else "a"


def _listed(names: list[str]) -> str:
    if len(names) <= 1:
        return names[0] if names else "none"
    return ", ".join(names[:-1]) + " and " + names[-1]
