"""Refit every shipped profile, record its errors, and regenerate docs/fidelity.md.

    for each profile with training rows:  fit.fit_profile  -> coefficients
    for each profile without:             the donor's coefficients (fit.DONORS)
    write the profiles -> check every row -> record train / held-out errors in each profile
    -> write docs/fidelity.md

``batchlab fit-published`` runs this (a few minutes on two cores); ``check-published`` only
re-checks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import date
from typing import Any

from adapters.reference.cost_model import CostModelParams
from harness.published.check import (
    FIDELITY_MD,
    CheckedRow,
    check_rows,
    error_stats,
    render_fidelity,
    stats_by_kind,
)
from harness.published.fit import (
    DONORS,
    HELD_OUT_SOURCES,
    LOSS_SCALE,
    PRIOR_WEIGHT,
    FitResult,
    fit_profile,
    split,
)
from harness.published.profiles import EngineProfile, all_profiles, write_profile
from harness.published.rows import PublishedRow, select, sources
from harness.published.sensitivity import length_sensitivity, workload_published

# An NVLink all-reduce costs the same whichever engine launches it: a profile without
# tensor-parallel training rows takes the value fitted for another engine on the same GPU.
SHARED_ACROSS_ENGINES = ("allreduce_latency_s",)
METHOD = (
    "soft-L1 (scale " f"{LOSS_SCALE}) of log(predicted / published), rows weighted 1/sqrt(rows "
    "of the same source and metric), log-normal priors around the built-in coefficients "
    f"(weight {PRIOR_WEIGHT}, widths in harness/published/fit.py COEFFICIENTS); "
    "Levenberg-Marquardt from five starts then Nelder-Mead; up to 3 rounds, each on schedules "
    "frozen from a fresh simulation"
)


def refit_all(rows: Sequence[PublishedRow], *, rounds: int = 3, jobs: int | None = None,
              log: Callable[[str], None] = print) -> list[CheckedRow]:
    """Fit, write and check every shipped profile; returns the final check."""
    train, _ = split(rows)
    profiles = {p.name: p for p in all_profiles()}
    results: dict[str, FitResult] = {}
    for name, profile in profiles.items():
        own_rows = select(train, profile=name)
        if not own_rows:
            continue
        log(f"fitting {name} on {len(own_rows)} rows")
        # From the built-in coefficients every time, so a refit does not depend on the last.
        start = profile.with_params(replace(CostModelParams(), device=profile.params.device))
        results[name] = fit_profile(start, own_rows, rounds=rounds, log=log)
    borrowed: dict[str, dict[str, str]] = {}
    for name, profile in profiles.items():
        if name in results:
            params = replace(results[name].params,
                             source=f"{name}: fitted on published measurements, {date.today()}")
            own = set(results[name].coefficients)
        elif name in DONORS and DONORS[name] in results:
            donor = results[DONORS[name]]
            params = replace(donor.params, device=profile.params.device,
                             source=f"{name}: coefficients of {DONORS[name]} (no training rows)")
            own = set(donor.coefficients)
        else:
            params = replace(CostModelParams(), device=profile.params.device,
                             source=f"{name}: built-in coefficients (no training rows)")
            own = set()
        params, borrowed[name] = _borrow_shared(profile, params, own, profiles, results)
        profiles[name] = profile.with_params(params)
        write_profile(profiles[name])

    log("checking every row")
    checked = check_rows(rows, jobs=jobs)
    for name, profile in profiles.items():
        fit = _fit_metadata(name, rows, checked, results.get(name))
        if borrowed[name]:
            fit["borrowed"] = borrowed[name]
        write_profile(EngineProfile(profile.name, profile.engine, profile.gpu, profile.params,
                                    profile.scheduler, profile.path, fit, profile.raw))
    FIDELITY_MD.write_text(render_fidelity(
        checked, sensitivity=length_sensitivity(rows, jobs=jobs)))
    log(f"wrote {FIDELITY_MD}")
    return checked


def _borrow_shared(profile: EngineProfile, params: CostModelParams, own: set[str],
                   profiles: dict[str, EngineProfile], results: dict[str, FitResult],
                   ) -> tuple[CostModelParams, dict[str, str]]:
    """Coefficients of the GPU rather than the engine, which this profile's rows could not
    determine, from another engine's fit on the same GPU (``SHARED_ACROSS_ENGINES``)."""
    taken: dict[str, str] = {}
    for coef in SHARED_ACROSS_ENGINES:
        if coef in own:
            continue
        for other, result in results.items():
            if profiles[other].gpu == profile.gpu and coef in result.coefficients:
                value: dict[str, Any] = {coef: getattr(result.params, coef)}
                params = replace(params, **value)
                taken[coef] = other
                break
    return params, taken


def _fit_metadata(name: str, rows: Sequence[PublishedRow], checked: Sequence[CheckedRow],
                  result: FitResult | None) -> dict[str, object]:
    mine = [c for c in checked if c.row.profile_name == name]
    train_stats = error_stats(c for c in mine if not c.held_out)
    held_stats = error_stats(c for c in mine if c.held_out)
    held_published = error_stats(c for c in mine if c.held_out and workload_published(c.row))
    fit: dict[str, object] = {
        "fitted": result is not None,
        "date": str(date.today()),
        "held_out_sources": list(HELD_OUT_SOURCES),
        "train_sources": [s for s in sources(rows) if s not in HELD_OUT_SOURCES],
        "train_row_ids": [c.row.row_id for c in mine if not c.held_out],
        "held_out_row_ids": [c.row.row_id for c in mine if c.held_out],
        "train": train_stats.as_dict() if train_stats else None,
        "held_out": held_stats.as_dict() if held_stats else None,
        # the held-out rows whose workload is fully published (harness.published.sensitivity)
        "held_out_workload_published": held_published.as_dict() if held_published else None,
        # the held-out error of each kind of figure (throughput, TTFT, ...) there are rows of
        "held_out_by_kind": {kind: stats.as_dict() for kind, stats in
                             stats_by_kind(c for c in mine if c.held_out).items()},
    }
    if result is not None:
        fit.update({"method": METHOD, "coefficients": list(result.coefficients),
                    "loss": round(result.loss, 6)})
    else:
        fit["coefficients_from"] = DONORS.get(name, "built-in defaults")
    return fit
