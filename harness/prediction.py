"""What a predicted number says about itself, in words: the one wording of a prediction record
(``adapters.reference.prediction_record``) for the report and the command line.

    predicted by the reference engine with profile NAME; on N published figures its fit never
    saw, it missed by a median M% (worst W%, docs/fidelity.md); by kind of figure: throughput
    M1% (worst W1%) of N1, TTFT ...; no held-out E2E figure

A profile that borrows another's coefficients (no training figures of its own engine and GPU)
says whose, after its name.

Reads records only (run folders, a served engine's ``/version``): nothing here imports an
engine, so the report can use it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

# The kinds of figure a prediction's accuracy is stated for, in this order: what a report shows
# (harness.published.rows.METRIC_KINDS says which published metric is which).
KINDS = ("throughput", "TTFT", "TPOT/ITL", "E2E")

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
        return text + ", docs/fidelity.md)" + _by_kind(acc.get("held_out_by_kind"), held=True)
    head += " with the catalog's datasheet coefficients"
    median, worst = acc.get("median_abs_error"), acc.get("worst_abs_error")
    if median is None:
        return head
    return (head + f"; on {acc.get('num_rows')} published figures it missed by a median "
            f"{_pct(median)} (worst {_pct(worst)}, docs/published.md)"
            + _by_kind(acc.get("by_kind"), held=False))


def _by_kind(by_kind: object, *, held: bool) -> str:
    """"; by kind of figure: throughput 5.9% (worst 21.4%) of 26, TTFT ...": the median error
    of each kind (``KINDS``) a record has; with ``held``, the kinds no held-out figure was of.
    '' for a record without (written before kinds were recorded)."""
    if not isinstance(by_kind, Mapping) or not by_kind:
        return ""
    kinds = [kind for kind in KINDS if isinstance(by_kind.get(kind), Mapping)]
    missing = _or([kind for kind in KINDS if kind not in kinds])
    gap = f"no held-out {missing} figure" if held and missing else ""
    if len(kinds) == 1:  # its figures are the ones above
        return f"; all of them {kinds[0]} figures" + (f": {gap}" if gap else "")
    parts = [f"{kind} {_pct(by_kind[kind].get('median_abs_error'))} (worst "
             f"{_pct(by_kind[kind].get('worst_abs_error'))}) of {by_kind[kind].get('num_rows')}"
             for kind in kinds]
    return "; by kind of figure: " + ", ".join(parts) + (f"; {gap}" if gap else "")


def _or(words: list[str]) -> str:
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else "".join(words)


def _pct(fraction: object) -> str:
    """An error as a percentage, as the report writes percentages (``fmt_pct``)."""
    if not isinstance(fraction, int | float) or isinstance(fraction, bool) or not math.isfinite(
            fraction):
        return "–"
    pct = fraction * 100
    return f"{pct:.0f}%" if pct in (0, 100) else f"{pct:.1f}%"
