"""Text formatting for the report: numbers, durations, deltas, paths and markdown tables."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.metrics import attainment_text, sig

REPO_ROOT = Path(__file__).resolve().parents[2]


def missing(value: Any) -> bool:
    """None, NaN or infinite: shown as "–" and never compared."""
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def fmt_seconds(value: float | None, digits: int = 3) -> str:
    """Latencies for humans: µs and ms below a second, s above; ``digits`` significant
    digits."""
    if missing(value):
        return "–"
    assert value is not None
    a = abs(value)
    if a == 0:
        return "0 ms"
    if a < 1e-3 and round(a * 1e6, digits - 1 - math.floor(math.log10(a * 1e6))) < 1000:
        return f"{sig(value * 1e6, digits)} µs"
    if a < 1 and float(sig(a * 1e3, digits).replace(",", "")) < 1000:
        return f"{sig(value * 1e3, digits)} ms"
    return f"{sig(value, digits)} s"


def fmt_seconds_against(value: float, limit: float) -> str:
    """``value`` as ``fmt_seconds`` writes it, with as many more significant digits (up to 6)
    as it takes not to read the same as ``limit`` when it differs from it: a TPOT p90 of
    12.02 ms beside a 12 ms SLO reads 12.02 ms, not 12 ms."""
    text = fmt_seconds(value)
    if value == limit:
        return text
    for digits in range(4, 7):
        if text != fmt_seconds(limit):
            break
        text = _seconds_with(value, digits)
    return text


def _seconds_with(value: float, digits: int) -> str:
    a = abs(value)
    if a < 1e-3:
        return f"{sig(value * 1e6, digits)} µs"
    if a < 1:
        return f"{sig(value * 1e3, digits)} ms"
    return f"{sig(value, digits)} s"


def fmt_number(value: float | None, unit: str = "", digits: int = 3) -> str:
    """``value`` with ``digits`` significant digits (``sig``), then ``unit``; "–" when missing."""
    if missing(value):
        return "–"
    assert value is not None
    text = sig(value, digits) if abs(value) < 1e15 else f"{value:.{digits}g}"
    return f"{text} {unit}".rstrip()


MAX_PAIR_DIGITS = 6  # the most significant digits ``fmt_pair`` writes


def fmt_pair(a: float, b: float, write: Callable[[float, int], str] | None = None,
             change: Callable[[float], str] | None = None) -> tuple[str, str]:
    """``a`` and ``b``, to be set side by side in a sentence, as ``write(value, digits)``
    writes them (``fmt_number``'s figure, no unit, by default): with 3 significant digits,
    or as many more (up to ``MAX_PAIR_DIGITS``) as it takes for the figures as written to
    agree with what the sentence says of them. Two values that differ read differently, and
    ``change`` (the sentence's words for the change between them, from the ratio ``a / b``)
    comes out the same from the figures as written as from the values: "2,515 vs 2,516.4
    tok/s, -0.1%", not "2,510 vs 2,520 tok/s, -0.1%", which a reader works out to be -0.4%."""
    digits = 3
    while digits < MAX_PAIR_DIGITS and not _pair_agrees(a, b, digits, change):
        digits += 1
    pair = ((fmt_number(a, digits=digits), fmt_number(b, digits=digits)) if write is None
            else (write(a, digits), write(b, digits)))
    # digits added to tell them apart: both to as many decimals ("2,515.0 vs 2,516.4")
    return _same_decimals(*pair) if digits > 3 else pair


_FIGURE = re.compile(r"^(-?[\d,]+)(?:\.(\d+))?(.*)$")


def _same_decimals(x: str, y: str) -> tuple[str, str]:
    """Two figures of one unit written with more digits than 3 to tell them apart, with as many
    decimals each ("2,003.60 vs 2,003.58", not "2,003.6 vs 2,003.58": the trailing zero
    ``sig`` drops reads as a coarser figure); figures of two units ("1.2 s", "900 ms") or
    that are not numbers are left as written."""
    mx, my = _FIGURE.match(x), _FIGURE.match(y)
    if mx is None or my is None or mx.group(3) != my.group(3):
        return x, y
    places = max(len(mx.group(2) or ""), len(my.group(2) or ""))
    if not places:
        return x, y

    def padded(m: re.Match[str]) -> str:
        return f"{m.group(1)}.{(m.group(2) or '').ljust(places, '0')}{m.group(3)}"

    return padded(mx), padded(my)


def _pair_agrees(a: float, b: float, digits: int,
                 change: Callable[[float], str] | None) -> bool:
    """Whether ``a`` and ``b`` rounded to ``digits`` significant digits differ when they do,
    and give the same ``change`` as the values."""
    shown_a, shown_b = _round_sig(a, digits), _round_sig(b, digits)
    if (shown_a == shown_b) != (a == b):
        return False
    if change is None or b == 0 or shown_b == 0:
        return True
    return change(shown_a / shown_b) == change(a / b)


def _round_sig(value: float, digits: int) -> float:
    """``value`` rounded to ``digits`` significant digits, as ``sig`` writes it."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


def fmt_int(value: Any) -> str:
    return "–" if missing(value) else f"{int(value):,}"


def fmt_pct(fraction: float | None) -> str:
    if missing(fraction):
        return "–"
    assert fraction is not None
    pct = fraction * 100
    if pct in (0, 100):
        return f"{pct:.0f}%"
    # never rounded onto 0% or 100%, which say "none" and "all": 99.97%, 0.04%
    if 99.95 <= pct < 100 or 0 < pct < 0.05:
        return f"{pct:.2g}%" if pct < 0.05 else f"{math.floor(pct * 100) / 100:.2f}%"
    return f"{pct:.1f}%"


def fmt_attainment(fraction: float | None) -> str:
    """An SLO attainment, cut rather than rounded (``harness.metrics.attainment_text``)."""
    return "–" if missing(fraction) or fraction is None else attainment_text(fraction)


def fmt_ratio(ratio: float) -> str:
    return f"{sig(ratio, 2)}×" if ratio < 10 else f"{ratio:,.0f}×"


def fmt_delta(value: float | None, base: float | None) -> str:
    """``+12%``, ``-94%``, ``2.8×`` (two-fold and more), ``1/280`` (a fall of 95% and more:
    "-100%" would hide how large it was), or ``""`` when not comparable."""
    if missing(value) or missing(base) or base == 0:
        return ""
    assert value is not None and base is not None
    ratio = value / base
    if ratio >= 2:
        return fmt_ratio(ratio)
    if 0 < ratio <= 0.05:
        return f"1/{fmt_number(1 / ratio)}"
    change = (ratio - 1) * 100
    if abs(change) < 0.5:
        return "±0%"
    return f"{change:+.0f}%"


def with_delta(text: str, value: float | None, base: float | None, is_base: bool) -> str:
    """``text`` followed by its change against the baseline in brackets, when there is one."""
    if is_base or text == "–":
        return text
    delta = fmt_delta(value, base)
    return f"{text} ({delta})" if delta else text


def and_codes(names: Sequence[str]) -> str:
    """"`a`", "`a` and `b`", "`a`, `b` and `c`"."""
    coded = [code(n) for n in names]
    return coded[0] if len(coded) == 1 else f"{', '.join(coded[:-1])} and {coded[-1]}"


def at_least(text: str, bound: bool) -> str:
    """A figure as written, ``≥ 2.01 s`` when it is only a lower bound (``bound``: a latency
    of a run stopped early that cut requests off); "–" stays "–"."""
    return f"≥ {text}" if bound and text != "–" else text


def short(text: str, limit: int = 200) -> str:
    """A reason on one line, cut at ``limit`` characters (the cell's error.txt has it all)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def code(text: Any) -> str:
    return f"`{text}`"


def value_text(value: Any) -> str:
    """A knob's value as the scenario file would spell it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value)) if value else "[]"
    return str(value)


def load_text(load: Mapping[str, Any]) -> str:
    """A scenario cell's load: trace timing, a rate, a time scale or a number of users."""
    kind, value = load.get("kind"), load.get("value")
    if kind == "rate" and value in (None, "inf", math.inf):
        # "inf" is how a record spells an infinite rate (JSON has no inf); older folders
        # wrote it as null, the one rate that the JSON writers (results.finite_json) null
        return "every request at 0 s"
    if kind in (None, "trace") or value is None:
        return "trace timing"
    if kind == "rate":
        # as probed, to 4 significant digits (a capacity search's probe 10.37 is not "10.4",
        # above the capacity it found: ``curves.capacity_text``)
        return f"{sig(float(value), 4)} req/s"
    if kind == "time_scale":  # a larger scale is a lighter load: say which way it goes
        return f"time × {sig(value)} (rate × {sig(1 / float(value))})"
    think = load.get("think_time_s")
    users = f"{int(value)} user" + ("" if int(value) == 1 else "s")
    return users + (f", {sig(think)} s think time" if think else "")


def display_path(text: str | None) -> str:
    """A path as the report shows it: relative to the repository when it lies inside."""
    if not text:
        return "–"
    path = Path(text)
    if path.is_absolute():
        try:
            return str(path.resolve().relative_to(REPO_ROOT))
        except (ValueError, OSError):
            return text
    return text


def _cell_text(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]],
          align: Sequence[str] | None = None) -> str:
    """A GitHub markdown table; ``align`` is "l" or "r" per column (default: l then r)."""
    align = align or ["l"] + ["r"] * (len(headers) - 1)
    lines = ["| " + " | ".join(_cell_text(h) for h in headers) + " |",
             "|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell_text(c) for c in row) + " |")
    return "\n".join(lines)


def slo_text(slo: Mapping[str, float]) -> str:
    """``TTFT ≤ 1 s, TPOT ≤ 50 ms``: SLOs as the report writes them."""
    labels = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}
    return ", ".join(f"{labels.get(k, k)} ≤ {fmt_seconds(v)}" for k, v in slo.items())
