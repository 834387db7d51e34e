"""Trace options: ``TraceOptions``, validated once, and the steps that apply them to rows.

The steps run in this order (``load.load_trace`` calls them; ``docs/traces.md`` has the
user-facing version)::

    window [start_s, end_s), re-zeroed at start_s ─► length overrides
      ─► max_model_len: drop | clip | error ─► limit
      ─► arrivals: keep trace times (x time_scale, or rescaled to rate), or synthesize them
      ─► priorities (trace column, else a seeded fraction)

Each step takes the rows and returns the rows it keeps, adding to the ``Report`` what it changed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from harness.traces.bounds import (
    MAX_TIMESTAMP_S,
    check_count,
    check_rate,
    check_time_scale,
    check_tokens,
)
from harness.traces.names import ARRIVALS, FORMATS, ON_TOO_LONG
from harness.traces.records import MOONCAKE_BLOCK_TOKENS, Report, Row, TraceError, is_int
from harness.traces.synthetic import (
    STREAM_ARRIVALS,
    STREAM_PRIORITY,
    seeded_rng,
    synthetic_arrivals_s,
)

# An infinite rate (every request at 0 s) or burstiness (constant gaps) as a record spells it:
# JSON has no infinity, and the writers' null (``results.finite_json``) would read as unset.
INF = "inf"


def recorded(value: float) -> float | str:
    """``value`` as a record (``TraceOptions.as_record``, ``Trace.timing``) keeps it: infinity
    as ``INF``, any other value as it is."""
    return INF if value == math.inf else value


@dataclass(frozen=True, slots=True)
class TraceOptions:
    """Every knob of trace loading; validated on construction (errors name the CLI flag).

    Counts, lengths, the rate and the time scale are also bounded (``bounds``), so that a
    stray exponent fails here rather than in memory or in a run.

    ``None`` means "not set". See ``docs/traces.md`` for the order in which they apply.
    ``rate`` and ``burstiness`` also take ``INF`` ("inf"), as ``as_record`` writes infinity, so
    that ``TraceOptions(**trace.options)`` loads the same requests again.
    """

    format: str | None = None  # one of FORMATS; None detects from the extension and header
    limit: int | None = None  # the first N requests (after the window; docs/traces.md)
    start_s: float | None = None  # window on trace time, [start_s, end_s); re-zeroed at start_s
    end_s: float | None = None
    time_scale: float | None = None  # multiply every trace arrival time by this
    rate: float | None = None  # requests/s: rescale trace times, or rate of synthetic arrivals
    arrival: str | None = None  # synthesize arrivals (ARRIVALS); None keeps trace timestamps
    burstiness: float | None = None  # gamma shape, as vLLM's: 1 = Poisson, inf = constant
    num_requests: int | None = None  # synthetic traces only
    lengths_from: str | None = None  # synthetic traces: sample (prompt, output) pairs from a file
    prompt_tokens: int | None = None  # override every request's prompt length
    output_tokens: int | None = None  # override every request's output length
    max_model_len: int | None = None  # prompt + output must fit; see on_too_long
    on_too_long: str = "error"  # one of ON_TOO_LONG
    priority_fraction: float | None = None  # this seeded fraction gets priority 0, the rest 1
    seed: int = 0
    skip_bad_rows: bool = False  # skip malformed rows (counted) instead of failing

    def __post_init__(self) -> None:
        def flag(name: str) -> str:
            return f"--{name.replace('_', '-')}"

        def bad(name: str, expected: str, value: object) -> TraceError:
            return TraceError(f"{flag(name)}: expected {expected}, got {value!r}")

        for name in ("rate", "burstiness"):
            if getattr(self, name) == INF:  # a record's infinity (as_record)
                object.__setattr__(self, name, math.inf)
        if self.format is not None and self.format not in FORMATS:
            raise bad("format", f"one of {', '.join(FORMATS)}", self.format)
        if self.arrival is not None and self.arrival not in ARRIVALS:
            raise bad("arrival", f"one of {', '.join(ARRIVALS)}", self.arrival)
        if self.on_too_long not in ON_TOO_LONG:
            raise bad("on_too_long", f"one of {', '.join(ON_TOO_LONG)}", self.on_too_long)
        if self.on_too_long != "error" and self.max_model_len is None:
            # it was ignored: nothing dropped or clipped, every long request failed in the run
            raise TraceError(f"{flag('on_too_long')}: {self.on_too_long} needs "
                             f"{flag('max_model_len')} N, the length (prompt + output) beyond "
                             f"which requests are {self.on_too_long}ped: the engine's max "
                             "model length")
        for name in ("limit", "num_requests", "prompt_tokens", "output_tokens"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value < 1):
                raise bad(name, "a positive integer", value)
            if value is not None:
                check = check_count if name in ("limit", "num_requests") else check_tokens
                check(value, flag(name))
        if self.max_model_len is not None and (
            not is_int(self.max_model_len) or self.max_model_len < 2
        ):
            raise bad("max_model_len", "an integer of at least 2", self.max_model_len)
        if self.max_model_len is not None:
            check_tokens(self.max_model_len, flag("max_model_len"))
        if not is_int(self.seed) or not 0 <= self.seed < 2**63:
            raise bad("seed", "a non-negative integer", self.seed)
        for name in ("start_s", "end_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise bad(name, "a non-negative number of seconds", value)
        if self.start_s is not None and self.end_s is not None and self.end_s <= self.start_s:
            raise bad("end_s", f"a time after --start-s {self.start_s}", self.end_s)
        if self.time_scale is not None and not self.time_scale > 0:  # NaN too
            raise bad("time_scale", "a positive number", self.time_scale)
        if self.time_scale is not None:
            check_time_scale(self.time_scale, flag("time_scale"))
        if self.rate is not None and not (self.rate > 0):  # inf allowed: everything at t=0
            raise bad("rate", "a positive number of requests per second (or inf)", self.rate)
        if self.rate is not None:
            check_rate(self.rate, flag("rate"), allow_inf=True)
        if self.time_scale is not None and self.rate is not None:
            raise TraceError("--time-scale and --rate both rescale time: give one of them")
        if self.burstiness is not None and not (self.burstiness > 0):
            raise bad("burstiness", "a positive number (1 = Poisson, inf = constant)",
                      self.burstiness)
        if self.burstiness is not None and self.arrival in ("poisson", "constant") and (
            self.burstiness != (1.0 if self.arrival == "poisson" else math.inf)
        ):
            raise TraceError(
                f"--burstiness {self.burstiness} contradicts --arrival {self.arrival}; "
                "use --arrival gamma"
            )
        if self.priority_fraction is not None and not (0.0 <= self.priority_fraction <= 1.0):
            raise bad("priority_fraction", "a fraction between 0 and 1", self.priority_fraction)

    @property
    def resolved_arrival(self) -> str | None:
        """The arrival process implied by ``arrival`` and ``burstiness`` (None: trace times)."""
        if self.arrival is None and self.burstiness is None:
            return None
        return arrival_process(self.arrival or "gamma", self.burstiness)

    def as_record(self, *, seeded: bool = True) -> dict[str, object]:
        """The options that were set, as a manifest records them: those left unset and their
        defaults are left out, and the seed when nothing was drawn with it (``seeded``);
        infinity is ``INF``."""
        defaults = TraceOptions()
        record: dict[str, object] = {
            f.name: recorded(getattr(self, f.name)) for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(defaults, f.name)
        }
        if seeded:
            record["seed"] = self.seed
        else:
            record.pop("seed", None)
        return record


def arrival_process(arrival: str, burstiness: float | None) -> str:
    """``arrival`` as it draws: gamma gaps of infinite shape (``--burstiness inf``) are
    constant."""
    return "constant" if arrival == "gamma" and burstiness == math.inf else arrival


def draws_arrivals(arrival: str | None, rate: float | None, num_requests: int) -> bool:
    """Whether synthesizing ``arrival`` arrivals for ``num_requests`` at ``rate`` draws from
    the seed: constant gaps, a lone request and every request at 0 s (rate inf) draw nothing
    (``synthetic.synthetic_arrivals_s``)."""
    return arrival in ("poisson", "gamma") and rate != math.inf and num_requests > 1


# ---------------------------------------------------------------- the steps, in order


def apply_window(
    rows: list[Row], options: TraceOptions, label: str, report: Report
) -> list[Row]:
    if options.start_s is None and options.end_s is None:
        return rows
    start = options.start_s or 0.0
    end = math.inf if options.end_s is None else options.end_s
    kept = [r._replace(arrival_s=r.arrival_s - start) for r in rows if start <= r.arrival_s < end]
    report.counts["outside_window"] = len(rows) - len(kept)
    if not kept:
        span = rows[-1].arrival_s if rows else 0.0
        raise TraceError(
            f"no requests in the window [{start:g} s, {end:g} s); the trace spans 0 to "
            f"{span:.1f} s",
            path=label,
        )
    report.notes.append(
        f"window [{start:g} s, {end:g} s) kept {len(kept)} of {len(rows)} requests; "
        f"arrivals measured from {start:g} s"
    )
    return kept


def apply_length_overrides(
    rows: list[Row], options: TraceOptions, report: Report
) -> list[Row]:
    if options.prompt_tokens is not None:
        if any(r.prefix_hash_ids for r in rows):
            report.notes.append("prefix hashes dropped: --prompt-tokens replaced the prompts")
        rows = [r._replace(num_prompt_tokens=options.prompt_tokens, prefix_hash_ids=())
                for r in rows]
        report.notes.append(f"every prompt set to {options.prompt_tokens} tokens")
    if options.output_tokens is not None:
        rows = [r._replace(num_output_tokens=options.output_tokens) for r in rows]
        report.notes.append(f"every output set to {options.output_tokens} tokens")
    return rows


def apply_max_model_len(
    rows: list[Row], options: TraceOptions, label: str, report: Report
) -> list[Row]:
    """A request fits when prompt + output <= max_model_len (what vLLM's server accepts)."""
    max_len = options.max_model_len
    if max_len is None:
        return rows
    too_long = [r for r in rows if r.num_prompt_tokens + r.num_output_tokens > max_len]
    if not too_long:
        return rows
    if options.on_too_long == "error":
        first = too_long[0]
        where = f"{label}:{first.line}" if first.line else label
        raise TraceError(
            f"{len(too_long)} of {len(rows)} requests need more than --max-model-len {max_len} "
            f"tokens (first: {where}, {first.num_prompt_tokens} prompt + "
            f"{first.num_output_tokens} output); --on-too-long drop|clip handles them"
        )
    if options.on_too_long == "drop":
        report.counts["dropped_too_long"] = len(too_long)
        report.notes.append(
            f"dropped {len(too_long)} requests longer than max_model_len {max_len}"
        )
        return [r for r in rows if r.num_prompt_tokens + r.num_output_tokens <= max_len]
    # clip: keep the output (it is what is measured) and truncate the prompt from the left,
    # as a chat client drops its oldest context; only an output that alone does not fit is cut.
    # A prompt cut from the left starts with other tokens than any prompt of the trace: its
    # prefix hashes (which name its lost leading blocks) are replaced by ids of its own, which
    # no other request shares; its blocks can still be found again after a preemption.
    clipped: list[Row] = []
    renamed = 0
    for r in rows:
        if r.num_prompt_tokens + r.num_output_tokens > max_len:
            output = min(r.num_output_tokens, max_len - 1)
            prompt = min(r.num_prompt_tokens, max_len - output)
            hashes = r.prefix_hash_ids
            if hashes:
                renamed += 1
                hashes = own_prefix_ids(r.line, -(-prompt // MOONCAKE_BLOCK_TOKENS))
            r = r._replace(num_prompt_tokens=prompt, num_output_tokens=output,
                           prefix_hash_ids=hashes)
        clipped.append(r)
    report.counts["clipped_too_long"] = len(too_long)
    own = (f"; the prefix hashes of the {renamed} with some replaced by ids no other "
           "request shares: a prompt cut from the left starts with other tokens"
           if renamed else "")
    report.notes.append(
        f"clipped {len(too_long)} requests to max_model_len {max_len} (the prompt truncated "
        f"from the left first){own}"
    )
    return clipped


_OWN_IDS_PER_ROW = 1 << 20  # more blocks than any prompt within the token bound has


def own_prefix_ids(line: int, num_blocks: int) -> tuple[int, ...]:
    """Prefix ids that only the request of source line ``line`` has: negative, where trace
    ids are never negative, and apart for every line of the file. Another file's line has
    the same ids: a mix renumbers each trace's ids apart (``scenario.expand.merge_traces``)."""
    base = -(line + 1) * _OWN_IDS_PER_ROW
    return tuple(base - k for k in range(num_blocks))


def apply_limit(rows: list[Row], options: TraceOptions, report: Report) -> list[Row]:
    if options.limit is None or len(rows) <= options.limit:
        return rows
    report.counts["beyond_limit"] = len(rows) - options.limit
    report.notes.append(f"kept the first {options.limit} of {len(rows)} requests (--limit)")
    return rows[: options.limit]


def _check_scaled_span(rows: list[Row], time_scale: float, label: str) -> None:
    """Refuse a --time-scale that stretches the trace's arrivals (0 to the last, sorted) past
    ``MAX_TIMESTAMP_S``, the bound of a trace's own timestamps and span: each factor is bounded
    alone, but a day of trace times a million is 2,700 years of arrivals."""
    span = rows[-1].arrival_s if rows else 0.0
    scaled = span * time_scale
    if scaled > MAX_TIMESTAMP_S:
        raise TraceError(
            f"--time-scale {time_scale:g} stretches the trace's span of {span:.6g} s to "
            f"{scaled:.3g} s; expected a span of at most {MAX_TIMESTAMP_S:g} seconds, the "
            "bound on a trace's timestamps (a smaller --time-scale, or --end-s, shortens it)",
            path=label)


def apply_arrivals(
    rows: list[Row],
    options: TraceOptions,
    arrival: str | None,
    timed: bool,
    label: str,
    report: Report,
) -> list[Row]:
    if arrival is None and options.time_scale is None and options.rate is None:
        return rows  # the trace's own timestamps, as they are
    times = np.array([r.arrival_s for r in rows], dtype=float)
    if arrival is None:  # the trace's own timestamps, rescaled
        if options.time_scale is not None and options.time_scale != 1.0:
            _check_scaled_span(rows, options.time_scale, label)
            times = times * options.time_scale
            report.notes.append(f"arrival times multiplied by {options.time_scale:g}")
            report.timing = {"kind": "time_scale", "value": options.time_scale}
        elif options.time_scale is not None:  # 1: the trace's times, but the load said so
            report.timing = {"kind": "time_scale", "value": options.time_scale}
        elif options.rate is not None:
            if math.isinf(options.rate):
                times = np.zeros_like(times)
                report.notes.append("rate inf: every request arrives at 0 s")
                report.timing = {"kind": "rate", "value": INF}
            else:
                span = float(times[-1] - times[0]) if len(times) else 0.0
                if len(times) < 2 or span <= 0:
                    raise TraceError(
                        "--rate needs at least two distinct arrival times to rescale",
                        path=label,
                    )
                factor = (len(times) - 1) / (options.rate * span)
                times = times * factor
                report.notes.append(
                    f"arrival times multiplied by {factor:.6g} for a mean rate of "
                    f"{options.rate:g} req/s"
                )
                report.timing = {"kind": "rate", "value": options.rate}
    else:
        if options.time_scale is not None:
            raise TraceError(
                f"--time-scale rescales trace timestamps, but arrivals of {label} are "
                "synthesized; --rate sets their rate"
            )
        rate = options.rate
        if rate is None:
            span = rows[-1].arrival_s - rows[0].arrival_s
            if not timed or len(rows) < 2 or span <= 0:
                why = "has no timestamps" if not timed else "has no mean rate to keep"
                raise TraceError(
                    f"{label} {why}: --rate R (requests per second) sets the rate of its "
                    f"synthetic {arrival} arrivals"
                )
            rate = (len(rows) - 1) / span
        burstiness = 1.0 if options.burstiness is None else options.burstiness
        try:
            times = synthetic_arrivals_s(
                len(rows), rate, arrival, burstiness, seeded_rng(options.seed, STREAM_ARRIVALS)
            )
        except ValueError as exc:
            raise TraceError(f"--burstiness: {exc}") from None
        drawn = draws_arrivals(arrival, rate, len(rows))
        if math.isinf(rate):
            report.notes.append("rate inf: every request arrives at 0 s")
        else:
            shape = f", burstiness {burstiness:g}" if arrival == "gamma" else ""
            seed = f", seed {options.seed}" if drawn else ""
            report.notes.append(f"arrivals synthesized: {arrival} at {rate:g} req/s{shape}{seed}")
        report.timing = {"kind": "rate", "value": recorded(rate), "arrival": arrival,
                         **({"burstiness": recorded(burstiness)} if arrival == "gamma" else {}),
                         **({"seed": options.seed} if drawn else {})}
    last = float(times.max()) if len(times) else 0.0
    if options.rate is not None and last > MAX_TIMESTAMP_S:  # --time-scale: checked above
        what = "synthetic arrivals" if arrival is not None else "the trace's arrivals"
        raise TraceError(
            f"--rate {options.rate:g} spreads {what} ({len(rows):,} requests) over "
            f"{last:.3g} s; expected a span of at most {MAX_TIMESTAMP_S:g} seconds, the bound "
            "on a trace's timestamps (a higher --rate, or --limit, shortens it)", path=label)
    return [r._replace(arrival_s=float(t)) for r, t in zip(rows, times, strict=True)]


# How a trace note that keeps the trace's own priorities over --priority-fraction begins.
PRIORITIES_FROM_TRACE = "priorities taken from the trace"
# How the note of a scenario whose requests had priorities before its priority_classes could
# be drawn begins (then where they came from); the report reads it from the run's manifest.
CLASSES_NOT_DRAWN = "the scenario's priority_classes were not drawn"

def apply_priorities(
    rows: list[Row], options: TraceOptions, report: Report
) -> list[Row]:
    has_column = any(r.priority is not None for r in rows)
    if has_column:
        if options.priority_fraction is not None:
            report.notes.append(f"{PRIORITIES_FROM_TRACE}; --priority-fraction ignored")
        return rows
    if options.priority_fraction is None:
        return rows
    num_high = round_half_up(options.priority_fraction, len(rows))
    high = set(
        seeded_rng(options.seed, STREAM_PRIORITY).permutation(len(rows))[:num_high].tolist()
    )
    report.notes.append(
        f"{num_high} of {len(rows)} requests given priority 0 (high), the rest 1; "
        f"seed {options.seed}"
    )
    return [r._replace(priority=0 if i in high else 1) for i, r in enumerate(rows)]


def round_half_up(fraction: float, n: int) -> int:
    """floor(F·N + 1/2), with F the decimal it was written as: round() takes halves to even
    (0.5 of 5 would give 2, 0.1 of 5 none), and the float product misses halves that the
    decimals make (0.29 × 50 is 14.5, in floats 14.499...)."""
    return math.floor(Fraction(str(float(fraction))) * n + Fraction(1, 2))
