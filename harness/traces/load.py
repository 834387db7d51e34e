"""``load_trace``: a source (a file, or a synthetic specification) through the options to a Trace.

    parse rows ─► sort by arrival (stable) ─► window ─► length overrides ─► max_model_len
      ─► limit ─► arrivals ─► priorities ─► Trace

The source comes from ``formats`` or ``synthetic``, the steps from ``options``. The digest is
the source bytes, then the resolved format and every option.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from harness.traces.formats import load_file
from harness.traces.names import ARRIVALS
from harness.traces.options import (
    TraceOptions,
    apply_arrivals,
    apply_length_overrides,
    apply_limit,
    apply_max_model_len,
    apply_priorities,
    apply_window,
    arrival_process,
    draws_arrivals,
)
from harness.traces.records import (
    Parsed,
    Report,
    Trace,
    TraceError,
    TraceRequest,
    requests_digest,
)
from harness.traces.synthetic import fixed_length_rows, sampled_length_rows


def load_trace(path: str | Path | None, options: TraceOptions | None = None) -> Trace:
    """Load a trace file (or ``None`` / ``"synthetic"`` / ``"synthetic:gamma"``) into a Trace.

    Raises TraceError for unreadable files, malformed rows, bad option combinations and traces
    left empty by the options.
    """
    options = options or TraceOptions()
    report = Report(
        counts={
            "num_source_rows": 0,
            "skipped_bad_rows": 0,
            "dropped_failed": 0,
            "num_reordered": 0,
            "outside_window": 0,
            "dropped_too_long": 0,
            "clipped_too_long": 0,
            "beyond_limit": 0,
        },
        notes=[],
    )
    arrival: str | None
    if _is_synthetic_spec(path) and options.format not in (None, "synthetic"):
        raise TraceError(f"--format {options.format} needs a trace file, not {path or 'none'}")
    if _is_synthetic_spec(path) or options.format == "synthetic":
        parsed, source, fmt, arrival, data = _synthetic_source(path, options, report)
    else:
        assert path is not None
        source = str(path)
        if options.lengths_from is not None:
            raise TraceError("--lengths-from applies to synthetic traces (--trace synthetic)")
        if options.num_requests is not None:
            raise TraceError(
                "--num-requests applies to synthetic traces; --limit N keeps the first N "
                f"requests of {source}"
            )
        parsed, fmt, data = _load_file(Path(path), options.format, options)
        arrival = options.resolved_arrival
    label = source

    _report_parse(parsed, report)
    rows = parsed.rows
    if not parsed.timed and (options.start_s is not None or options.end_s is not None):
        raise TraceError(f"--start-s/--end-s need a timed trace; {label} has no timestamps")
    if not parsed.timed and arrival is None:
        arrival = "poisson"
    rows = apply_window(rows, options, label, report)
    rows = apply_length_overrides(rows, options, report)
    if options.on_too_long == "drop":  # dropping first: --limit N keeps the first N that fit
        rows = apply_max_model_len(rows, options, label, report)
        rows = apply_limit(rows, options, report)
    else:  # clipped, or refused, among the requests kept only
        rows = apply_limit(rows, options, report)
        rows = apply_max_model_len(rows, options, label, report)
    if not rows:
        # what removed them: the notes of each step that did (malformed rows skipped, failed
        # requests dropped, outside the window, too long)
        why = "; ".join(report.notes) or "the file has no request rows"
        raise TraceError(f"no requests left after applying the options, of "
                         f"{report.counts['num_source_rows']} rows: {why}", path=label)
    rows = apply_arrivals(rows, options, arrival, parsed.timed, label, report)
    priority_column = any(r.priority is not None for r in rows)
    rows = apply_priorities(rows, options, report)
    # the seed matters where something was drawn: arrivals (not constant ones, nor all at
    # 0 s), sampled lengths, priorities (not when the trace's own column gave them)
    seeded = (draws_arrivals(arrival, options.rate, len(rows))
              or options.lengths_from is not None
              or (not priority_column and options.priority_fraction is not None))

    requests = tuple(
        TraceRequest(r.request_id, r.arrival_s, r.num_prompt_tokens, r.num_output_tokens,
                     r.priority, r.prefix_hash_ids)
        for r in rows
    )
    return Trace(
        requests=requests,
        source=source,
        format=fmt,
        digest=requests_digest(requests),
        notes=tuple(report.notes),
        counts=report.counts,
        timing=report.timing,
        options=options.as_record(seeded=seeded),
        file_sha256=hashlib.sha256(data).hexdigest() if data else None,
    )


def _is_synthetic_spec(path: str | Path | None) -> bool:
    return path is None or (isinstance(path, str) and path.split(":")[0] == "synthetic")


def _load_file(path: Path, fmt: str | None, options: TraceOptions) -> tuple[Parsed, str, bytes]:
    """``formats.load_file`` with the options it reads: zero lengths are accepted where an
    override replaces them."""
    return load_file(
        path,
        fmt,
        min_prompt=0 if options.prompt_tokens is not None else 1,
        min_output=0 if options.output_tokens is not None else 1,
        skip_bad_rows=options.skip_bad_rows,
    )


def _synthetic_source(
    path: str | Path | None, options: TraceOptions, report: Report
) -> tuple[Parsed, str, str, str, bytes]:
    """Rows for a synthetic trace: fixed lengths, or pairs sampled from ``lengths_from``.

    Returns (rows, source, format, arrival process, the bytes of the lengths file or b"").
    """
    arrival = options.resolved_arrival
    if isinstance(path, str) and ":" in path:
        named = path.split(":", 1)[1]
        if named not in ARRIVALS:
            raise TraceError(
                f"--trace {path!r}: expected synthetic or synthetic:<{'|'.join(ARRIVALS)}>"
            )
        named = arrival_process(named, options.burstiness)  # synthetic:gamma, burstiness inf
        if arrival is not None and arrival != named:
            raise TraceError(f"--trace {path!r} contradicts --arrival {arrival}")
        arrival = named
    elif path is not None and not _is_synthetic_spec(path):
        raise TraceError(
            f"--format synthetic reads no trace file ({path}); --lengths-from {path} samples "
            "its lengths"
        )
    arrival = arrival or "poisson"
    n = options.num_requests
    if n is None:
        raise TraceError("a synthetic trace needs --num-requests N")
    if options.rate is None:
        raise TraceError("a synthetic trace needs --rate R (requests per second)")
    data = b""
    if options.lengths_from is None:
        if options.prompt_tokens is None or options.output_tokens is None:
            raise TraceError(
                "a synthetic trace needs its lengths: --prompt-tokens and --output-tokens, "
                "or --lengths-from FILE"
            )
        rows = fixed_length_rows(n, options.prompt_tokens, options.output_tokens)
        parsed = Parsed(rows, False, n, [])
    else:
        # Lengths come from any trace file; its arrivals are ignored. Sampled with replacement.
        pool, pool_fmt, data = _load_file(Path(options.lengths_from), None, options)
        if not pool.rows:
            raise TraceError("no usable rows to sample lengths from", path=options.lengths_from)
        rows = sampled_length_rows(pool.rows, n, options.seed)
        parsed = dataclasses.replace(pool, rows=rows, timed=False)
        report.notes.append(
            f"lengths sampled with replacement from {options.lengths_from} ({pool_fmt}, "
            f"{len(pool.rows)} rows), seed {options.seed}"
        )
    return parsed, f"synthetic:{arrival}", "synthetic", arrival, data


def _report_parse(parsed: Parsed, report: Report) -> None:
    report.counts["num_source_rows"] = parsed.num_source_rows
    report.counts["skipped_bad_rows"] = len(parsed.skipped)
    report.counts["dropped_failed"] = parsed.num_failed
    report.counts["num_reordered"] = parsed.num_reordered
    if parsed.skipped:
        report.notes.append(_skipped_note(parsed.skipped))
    if parsed.num_failed:
        report.notes.append(
            f"dropped {parsed.num_failed} failed requests (0 response tokens in the trace)"
        )
    if parsed.num_reordered:
        report.notes.append(
            f"{parsed.num_reordered} rows arrived before the row above them; requests were "
            "sorted by arrival (ties keep file order)"
        )
    if len(parsed.models) > 1:
        mix = ", ".join(f"{m or '(empty)'} {c}" for m, c in parsed.models.most_common())
        report.notes.append(f"models in the trace: {mix}")


SKIPPED_ROWS_LISTED = 10  # the skipped rows a note names; the rest are counted


def _skipped_note(skipped: list[TraceError]) -> str:
    """One line naming each skipped row (the first ``SKIPPED_ROWS_LISTED``), its field and why:
    "skipped 5 malformed rows of t.csv (--skip-bad-rows): line 5, field 'ContextTokens':
    expected a non-negative integer, got 'abc'; line 19, ...". They all come from one file."""
    n = len(skipped)
    paths = {e.path for e in skipped}
    of = f" of {paths.pop()}" if len(paths) == 1 and None not in paths else ""
    listed = []
    for e in skipped[:SKIPPED_ROWS_LISTED]:
        place = f"line {e.line}" + (f", field {e.field!r}" if e.field is not None else "")
        listed.append(f"{place}: {e.reason}" if of else str(e))
    more = f"; and {n - SKIPPED_ROWS_LISTED} more" if n > SKIPPED_ROWS_LISTED else ""
    return (f"skipped {n} malformed row{'s' if n != 1 else ''}{of} (--skip-bad-rows): "
            + "; ".join(listed) + more)
