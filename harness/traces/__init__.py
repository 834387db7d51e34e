"""Traces: real or synthetic request arrivals, loaded into one record type.

``load_trace(path, TraceOptions(...)) -> Trace``. Whatever the source, the same steps run in
the same order (``docs/traces.md`` has the user-facing version):

    parse rows ─► sort by arrival (stable) ─► window [start_s, end_s), re-zeroed at start_s
      ─► length overrides ─► max_model_len: drop ─► limit   (or: limit ─► clip | error)
      ─► arrivals: keep trace times (x time_scale, or rescaled to rate), or synthesize them
      ─► priorities (trace column, else a seeded fraction) ─► Trace

Formats: ``azure`` (Azure LLM inference 2023 CSV), ``mooncake`` (JSONL, plain or .gz),
``lengths`` (length-only CSVs: ShareGPT / arXiv stats), ``vidur`` (Vidur's processed CSV),
``burstgpt`` (BurstGPT CSV) and ``synthetic`` (no file: fixed lengths, or lengths sampled from
any trace file). Every timed source is re-zeroed so that its earliest row arrives at 0 s.

A malformed row raises ``TraceError`` naming the file, the 1-based line and the field; nothing is
skipped unless ``skip_bad_rows`` is set, and then ``Trace.counts`` and ``Trace.notes`` say how
many. Everything random is drawn from ``numpy`` generators seeded with ``options.seed``, one
stream per purpose, so a trace plus its options always loads to the same requests.

Modules: ``records`` (``TraceRequest``, ``Trace``, ``TraceError``, the rows on their way),
``formats`` (each file format's reader and detection), ``synthetic`` (arrival processes and
lengths), ``options`` (``TraceOptions`` and the steps applying them), ``load`` (the pipeline),
``info`` (``describe``, ``arrivals_text``), ``data`` (bundled and shared trace folders),
``names`` (the formats, arrival processes and too-long policies by name),
``bounds`` (the upper bounds on token counts, request counts, rates, time scales and
timestamps that every loader and option checks, for the command line and scenario files to
reuse).

The names below are loaded when first used, not when the package is: the command line's
parser needs only the format, arrival and too-long choices (``names``), and ``batchlab
simulate`` starts its report process before it loads numpy and the readers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.lazy import names_on_first_use

if TYPE_CHECKING:
    from harness.traces.bounds import (
        MAX_RATE_PER_S,
        MAX_REQUESTS_PER_TRACE,
        MAX_TIME_SCALE,
        MAX_TIMESTAMP_S,
        MAX_TOKENS_PER_REQUEST,
        MIN_RATE_PER_S,
        MIN_TIME_SCALE,
        check_count,
        check_rate,
        check_time_scale,
        check_timestamp_s,
        check_tokens,
    )
    from harness.traces.data import (
        DATA_DIR,
        REPO_ROOT,
        TRACES_DIR_ENV,
        shared_traces_dir,
    )
    from harness.traces.formats import (
        MOONCAKE_BLOCK_TOKENS,
    )
    from harness.traces.info import (
        arrivals_text,
        describe,
    )
    from harness.traces.load import (
        load_trace,
    )
    from harness.traces.names import (
        ARRIVALS,
        FORMATS,
        ON_TOO_LONG,
    )
    from harness.traces.options import (
        CLASSES_NOT_DRAWN,
        PRIORITIES_FROM_TRACE,
        TraceOptions,
    )
    from harness.traces.records import (
        DIGEST_SCHEME,
        MixPart,
        Trace,
        TraceError,
        TraceRequest,
    )
    from harness.traces.synthetic import (
        synthetic_arrivals_s,
    )

__all__ = [
    "ARRIVALS",
    "CLASSES_NOT_DRAWN",
    "DATA_DIR",
    "DIGEST_SCHEME",
    "FORMATS",
    "MAX_RATE_PER_S",
    "MAX_REQUESTS_PER_TRACE",
    "MAX_TIMESTAMP_S",
    "MAX_TIME_SCALE",
    "MAX_TOKENS_PER_REQUEST",
    "MIN_RATE_PER_S",
    "MIN_TIME_SCALE",
    "MOONCAKE_BLOCK_TOKENS",
    "ON_TOO_LONG",
    "PRIORITIES_FROM_TRACE",
    "REPO_ROOT",
    "TRACES_DIR_ENV",
    "MixPart",
    "Trace",
    "TraceError",
    "TraceOptions",
    "TraceRequest",
    "arrivals_text",
    "check_count",
    "check_rate",
    "check_time_scale",
    "check_timestamp_s",
    "check_tokens",
    "describe",
    "load_trace",
    "shared_traces_dir",
    "synthetic_arrivals_s",
]

# where each name lives: a module of this package
_HOME = {name: module for module, names in {
    "bounds": (
        "MAX_RATE_PER_S", "MAX_REQUESTS_PER_TRACE", "MAX_TIMESTAMP_S", "MAX_TIME_SCALE",
        "MAX_TOKENS_PER_REQUEST", "MIN_RATE_PER_S", "MIN_TIME_SCALE", "check_count", "check_rate",
        "check_time_scale", "check_timestamp_s", "check_tokens",
    ),
    "data": ("DATA_DIR", "REPO_ROOT", "TRACES_DIR_ENV", "shared_traces_dir"),
    "formats": ("MOONCAKE_BLOCK_TOKENS",),
    "info": ("arrivals_text", "describe"),
    "load": ("load_trace",),
    "names": ("ARRIVALS", "FORMATS", "ON_TOO_LONG"),
    "options": ("CLASSES_NOT_DRAWN", "PRIORITIES_FROM_TRACE", "TraceOptions"),
    "records": ("DIGEST_SCHEME", "MixPart", "Trace", "TraceError", "TraceRequest"),
    "synthetic": ("synthetic_arrivals_s",),
}.items() for name in names}


__getattr__ = names_on_first_use(__name__, globals(), _HOME)
