"""What a predicted number says about itself, in words: the one wording of a prediction record
(``adapters.reference.prediction_record``) for the report and the command line.

    predicted by the reference engine with profile NAME; on N published figures its fit never
    saw, it missed by a median M% (worst W%, docs/fidelity.md)

A profile that borrows another's coefficients (no training figures of its own engine and GPU)
says whose, after its name.

Reads records only (run folders, a served engine's ``/version``): nothing here imports an
engine, so the report can use it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

SIMULATED = "by the reference engine"
# a live run against ``batchlab serve reference``: the server sleeps each step's predicted time
SERVED = ("by the reference engine served over HTTP (step times from its cost model; HTTP and "
          "client time measured)")


def prediction_text(prediction: object, *, by: str = SIMULATED,
                    mark: Callable[[str], str] = str, code: Callable[[str], str] = str) -> str:
    """``prediction``: a prediction record, or None for a run that recorded none. ``mark``
    sets off the word "predicted" and ``code`` a profile's name (the report's bold and code
    spans; plain text by default)."""
    head = f"{mark('predicted')} {by}"
    if not isinstance(prediction, Mapping):
        return head + " (accuracy not recorded in this run)"
    accuracy = prediction.get("accuracy")
    acc: Mapping[str, Any] = accuracy if isinstance(accuracy, Mapping) else {}
    if prediction.get("profile"):
        head += f" with profile {code(str(prediction['profile']))}"
        donor = acc.get("coefficients_from")
        if donor:
            head += (f" (coefficients borrowed from {code(str(donor))}: no training figures of "
                     "its own)")
        median, worst = acc.get("held_out_median_abs_error"), acc.get("held_out_worst_abs_error")
        if median is None:
            return head + "; its accuracy was not measured against published figures"
        num = acc.get("held_out_num_rows")
        figures = f"{num} published figures" if num else "published figures"
        text = (head + f"; on {figures} its fit never saw, it missed by a median "
                f"{_pct(median)} (worst {_pct(worst)}")
        pub_n = acc.get("held_out_published_num_rows")
        if pub_n and pub_n != acc.get("held_out_num_rows"):
            text += (f"; {_pct(acc.get('held_out_published_median_abs_error'))} "
                     f"(worst {_pct(acc.get('held_out_published_worst_abs_error'))}) on the "
                     f"{pub_n} whose workload is fully published")
        return text + ", docs/fidelity.md)"
    head += " with the catalog's datasheet coefficients"
    median, worst = acc.get("median_abs_error"), acc.get("worst_abs_error")
    if median is None:
        return head
    return (head + f"; on {acc.get('num_rows')} published figures it missed by a median "
            f"{_pct(median)} (worst {_pct(worst)}, docs/published.md)")


def _pct(fraction: object) -> str:
    """An error as a percentage, as the report writes percentages (``fmt_pct``)."""
    if not isinstance(fraction, int | float) or isinstance(fraction, bool) or not math.isfinite(
            fraction):
        return "–"
    pct = fraction * 100
    return f"{pct:.0f}%" if pct in (0, 100) else f"{pct:.1f}%"
