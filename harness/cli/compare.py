"""``batchlab compare``: two runs of a scenario, cell against cell, as a regression test."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from harness.cli.common import EXIT_FAILURE, RawDescriptionFormatter, UserError, add_subparser

EXIT_OK = 0

# The epilog lists harness.compare.METRICS by hand: importing it here would load the report
# modules for every `batchlab --help` (a test keeps the two in step).
EPILOG = """\
exit status:
  0  every --fail-if check passed (or none was given)
  1  a --fail-if check failed: a paired cell's metric got worse by more than allowed, lost
     its value, or the AFTER cell did not finish; or the metric is goodput computed under
     different SLOs on the two sides (`batchlab summarize --slo` changed one)
  2  bad input: a folder that is not a run or scenario folder, nothing to pair, an unknown
     metric, a malformed --fail-if, or a --json FILE in a run's, scenario's or capacity
     search's folder, or over a file that is not an earlier comparison

metrics (summary.json fields, docs/metrics.md; lower is better unless marked +):
  ttft_s.p50 ttft_s.p90 ttft_s.p99 tpot_s.p50 tpot_s.p90 itl_s.p50 itl_s.p90
  e2e_s.p50 e2e_s.p90 throughput.output_tokens_per_s+ throughput.requests_per_s+
  goodput.requests_per_s+ goodput.slo_attainment+ num_failed (alias: failures)

examples:
  batchlab compare nights/2026-11-29/quickstart nights/2026-11-30/quickstart
  batchlab compare nights/2026-11-29/quickstart nights/2026-11-30/quickstart \\
      --fail-if ttft_s.p90=10 --fail-if throughput.output_tokens_per_s=5 \\
      --fail-if failures=0 --json nights/2026-11-30/compare.json
  batchlab compare reports/sim reports/sim-new --only 'continuous*'

docs/compare.md describes the table, the JSON file and a nightly CI job."""


def add_compare(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subparser(
        sub, "compare",
        help="compare two runs of a scenario cell by cell; fail on regressions (nightly CI)",
        description=textwrap.fill(
        "Pair the cells of BEFORE and AFTER by name and print, for each pair, the "
        "headline metrics before and after with their change and whether it is worse, better "
        "or the same, judged by the metric's direction. Each side is a scenario folder "
        "(OUT/<scenario>, from `batchlab run`) or one run folder (two run folders pair with "
        "each other). Cells on one side only are listed as added or removed; a cell that "
        "failed, was interrupted or has no summary is listed with its state. A warning says "
        "when the two sides are not a like-for-like test (trace, engine, knobs, model, GPU, "
        "batchlab version, SLO, load, predicted vs measured).", width=88,
        break_on_hyphens=False),
        epilog=EPILOG,
        formatter_class=RawDescriptionFormatter,
    )
    p.add_argument("before", metavar="BEFORE", help="scenario or run folder: the reference")
    p.add_argument("after", metavar="AFTER", help="scenario or run folder: the one checked")
    p.add_argument("--fail-if", action="append", default=[], metavar="METRIC=PCT",
                   help="exit 1 when any paired cell's METRIC got worse by more than PCT "
                   "percent, by its direction (e.g. ttft_s.p90=10, "
                   "throughput.output_tokens_per_s=5; failures=0: any increase); repeatable")
    p.add_argument("--json", metavar="FILE",
                   help="also write the comparison as JSON (format batchlab-compare, "
                   "version 2; SI units, as summary.json); a file of its own, outside any "
                   "run or scenario folder, or an earlier comparison it replaces")
    p.add_argument("--only", metavar="PATTERN",
                   help="compare only cells whose name (or engine name) matches a shell "
                   "pattern; several patterns separated by commas")
    p.add_argument("--same-within", type=float, default=None, metavar="PCT",
                   help="a change within PCT percent is judged the same (default: 1; counts "
                   "are the same only when equal)")


def parse_check(text: str) -> tuple[str, float]:
    """``"ttft_s.p90=10"`` -> ("ttft_s.p90", 10.0); UserError on anything else."""
    name, sep, pct = text.partition("=")
    try:
        limit = float(pct)
    except ValueError:
        limit = -1.0
    if not sep or not name.strip() or not limit >= 0:  # NaN fails too
        raise UserError(f"--fail-if {text!r}: expected METRIC=PCT with PCT a percentage "
                        ">= 0, e.g. ttft_s.p90=10")
    return name.strip(), limit


def cmd_compare(args: argparse.Namespace) -> int:
    from harness.compare import (
        DEFAULT_SAME_WITHIN_PCT,
        Check,
        CompareError,
        compare,
        header_lines,
        metric_named,
        render_body,
        warning_lines,
    )
    from harness.results import write_json_atomic

    same = DEFAULT_SAME_WITHIN_PCT if args.same_within is None else args.same_within
    if not same >= 0:
        raise UserError("--same-within: expected a percentage >= 0")
    only = [p for p in (s.strip() for s in (args.only or "").split(",")) if p]
    if args.json:
        _check_json_output(Path(args.json))
    try:
        checks = [Check(metric_named(name), limit)
                  for name, limit in map(parse_check, args.fail_if)]
        result = compare(Path(args.before), Path(args.after), checks=checks,
                         same_within_pct=same, only=only)
    except CompareError as exc:
        raise UserError(str(exc)) from None
    # why a regression may not be one comes before the table and the verdict it qualifies;
    # flushed, so that a log of both streams (CI) keeps this order
    print("\n".join(header_lines(result)), flush=True)
    for line in warning_lines(result):
        print(f"warning: {line}", file=sys.stderr, flush=True)
    print(render_body(result))
    if args.json:
        out = Path(args.json)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(result.as_json(), out)
        except OSError as exc:  # exit 2, not 1: 1 says a check failed
            raise UserError(f"--json {out}: {exc.strerror or exc}") from None
        print(f"json: {out}")
    return EXIT_FAILURE if result.failed_checks else EXIT_OK


def _check_json_output(out: Path) -> None:
    """``--json`` is a file of its own: UserError when it is a folder, lands in a run's,
    cell's, scenario's or capacity search's folder or under one (``runfolder.folder_above``,
    the rule that keeps ``report -o`` out of a run's folder), or is a file there already that
    is not a comparison batchlab wrote (a run's summary.json, its records, the user's own): a
    comparison written again replaces only an earlier comparison."""
    from harness.compare import FORMAT
    from harness.results import read_json_object
    from harness.runfolder import folder_above, results_folder, shown

    if out.is_dir():
        raise UserError(f"--json {out}: a folder; give a file name")
    instead = "write the comparison to a file of its own, e.g. --json reports/compare.json"
    found = folder_above(out, results_folder)
    if found is not None:
        folder, what = found
        where = "is" if folder == out.resolve().parent else f"is inside {shown(folder)},"
        raise UserError(f"--json {out}: {out.parent} {where} {what.describe()}: {instead}")
    if (out.exists() or out.is_symlink()) and read_json_object(out).get("format") != FORMAT:
        raise UserError(f"--json {out}: a file is there that is not a comparison batchlab "
                        f"wrote (format {FORMAT}); remove it, or choose another file name")
