"""Upper bounds on trace inputs, in one place, so that every loader and option agrees.

A value past these bounds is a typo, a unit mix-up or a sentinel (a uint32 ``-1`` written as
4294967295), not a workload. Refusing it here gives the usual one-line error naming the file,
line and field (or the option) instead of a MemoryError or OverflowError deep in a run.

Each ``check_*`` takes a value its caller has already parsed and checked from below (the lower
bounds' messages depend on the context: "at least 1 prompt token" in a file, "a positive
integer" for an option), and refuses what is too large or NaN. The error names ``where``: an
option (``"--num-requests"``) or a scenario key when ``path`` is None, else the field of
``path``:``line``. ``got`` is what the message quotes, by default the value itself (a loader
passes the text it read).
"""

from __future__ import annotations

import math

from harness.traces.records import TraceError

# 2**24 = 16,777,216 tokens: above every context window announced so far (the largest, 10M,
# is Llama 4 Scout's), and far below the 4,294,967,295 of a uint32 -1 sentinel. It bounds a
# prompt, an output and --max-model-len alike.
MAX_TOKENS_PER_REQUEST = 1 << 24

# 10 million requests (--num-requests, --limit): about 4 GB and a couple of minutes to build
# (some 400 bytes a request on the way to a Trace), a month of traffic at 4 req/s; 10**11 would
# exhaust memory before the first request ran. A file's rows are not counted against it: the
# file's own size already bounds them.
MAX_REQUESTS_PER_TRACE = 10_000_000

# Rates from one request a day (about 1.2e-5 req/s) to well past any single deployment are
# covered; a rate below 1e-6 req/s pushes arrivals out by years (and 1/rate overflows to inf
# for the smallest floats), one above 1e6 req/s puts requests microseconds apart, closer than
# any client can send them. ``--rate inf`` ("everything at 0 s") is allowed where it is meant.
MIN_RATE_PER_S = 1e-6
MAX_RATE_PER_S = 1e6

# --time-scale, by the same reasoning as the rate: a factor past a million stretches a second
# of trace to 12 days (and an hour to 114 years); one below a millionth puts a day's requests
# in 0.09 s, every arrival microseconds apart.
MIN_TIME_SCALE = 1e-6
MAX_TIME_SCALE = 1e6

# 65,536 closed-loop users: each holds its own connection to the one server address, and a
# client has fewer ephemeral ports than that towards one address (Linux's default
# ip_local_port_range, 32768-60999, gives 28,232).
MAX_CONCURRENCY = 1 << 16

# 1e10 s (317 years): a timestamp column may hold Unix-epoch seconds (1.7e9 today, 1e10 in the
# year 2286); beyond that it is a unit mix-up, and arrivals are replayed on a clock.
MAX_TIMESTAMP_S = 1e10


def check_tokens(
    value: float, where: str, *, path: str | None = None, line: int | None = None,
    got: object = None,
) -> int:
    """``value`` (an int) if it is at most ``MAX_TOKENS_PER_REQUEST``, else a TraceError."""
    if not value <= MAX_TOKENS_PER_REQUEST:
        raise _error(f"expected at most {MAX_TOKENS_PER_REQUEST} tokens", value, where, path,
                     line, got)
    return int(value)


def check_count(
    value: float, where: str, *, path: str | None = None, line: int | None = None,
    got: object = None,
) -> int:
    """``value`` (an int) if it is at most ``MAX_REQUESTS_PER_TRACE``, else a TraceError."""
    if not value <= MAX_REQUESTS_PER_TRACE:
        raise _error(f"expected at most {MAX_REQUESTS_PER_TRACE} requests", value, where, path,
                     line, got)
    return int(value)


def check_concurrency(
    value: float, where: str, *, path: str | None = None, line: int | None = None,
    got: object = None,
) -> int:
    """``value`` (an int) if it is at most ``MAX_CONCURRENCY`` users, else a TraceError."""
    if not value <= MAX_CONCURRENCY:
        raise _error(f"expected at most {MAX_CONCURRENCY} concurrent users", value, where, path,
                     line, got)
    return int(value)


def check_rate(
    value: float, where: str, *, allow_inf: bool = False, path: str | None = None,
    line: int | None = None, got: object = None,
) -> float:
    """``value`` if it lies in [MIN_RATE_PER_S, MAX_RATE_PER_S] requests per second (or is inf
    where ``allow_inf``), else a TraceError. NaN is refused."""
    if allow_inf and value == math.inf:
        return value
    if not MIN_RATE_PER_S <= value <= MAX_RATE_PER_S:
        expected = (
            f"expected a rate between {MIN_RATE_PER_S:g} and {MAX_RATE_PER_S:g} requests per "
            f"second{' (or inf)' if allow_inf else ''}"
        )
        raise _error(expected, value, where, path, line, got)
    return value


def check_time_scale(
    value: float, where: str, *, path: str | None = None, line: int | None = None,
    got: object = None,
) -> float:
    """``value`` if it lies in [MIN_TIME_SCALE, MAX_TIME_SCALE], else a TraceError. NaN is
    refused."""
    if not MIN_TIME_SCALE <= value <= MAX_TIME_SCALE:
        raise _error(f"expected a factor between {MIN_TIME_SCALE:g} and {MAX_TIME_SCALE:g}",
                     value, where, path, line, got)
    return value


def check_timestamp_s(
    value: float, where: str, *, path: str | None = None, line: int | None = None,
    got: object = None,
) -> float:
    """``value`` (seconds) if it is at most ``MAX_TIMESTAMP_S``, else a TraceError."""
    if not value <= MAX_TIMESTAMP_S:
        raise _error(f"expected at most {MAX_TIMESTAMP_S:g} seconds", value, where, path, line,
                     got)
    return value


def _error(
    expected: str, value: object, where: str, path: str | None, line: int | None, got: object
) -> TraceError:
    shown = value if got is None else got
    message = f"{expected}, got {shown!r}"
    if path is None:
        return TraceError(f"{where}: {message}")
    return TraceError(message, path=path, line=line, field=where)
