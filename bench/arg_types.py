"""argparse types shared by the bench scripts (not a benchmark itself).

Each turns a bad value into ``argparse.ArgumentTypeError``, which argparse answers with one
line naming the option and exit status 2, before a script starts a server or makes a folder.
"""

from __future__ import annotations

import argparse
import itertools
import math


def positive_int(text: str) -> int:
    """An integer of at least 1."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An integer of at least 0 (0 usually skips a part of the run)."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def positive_float(text: str) -> float:
    """A finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text!r}")
    return value


def ascending_rates(text: str) -> list[float]:
    """Comma-separated request rates (req/s), each a finite number above 0, strictly rising:
    ``25,50,100``."""
    rates = []
    for part in text.split(","):
        try:
            rates.append(positive_float(part.strip()))
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"in {text!r}: {exc}") from None
    for low, high in itertools.pairwise(rates):
        if high <= low:
            raise argparse.ArgumentTypeError(
                f"rates must rise from one to the next, got {low:g} then {high:g}")
    return rates


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
