"""Command-line entry points: ``check-published``, ``profiles``, ``fit-published``.

Each command is a pair ``*_add_arguments(parser)`` / ``*_run(args) -> int`` for harness/cli to
mount as a subcommand; nothing here parses ``sys.argv`` itself.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from adapters.reference.cost_model import ProfileError, shipped_profiles
from harness.published.check import (
    FIDELITY_MD,
    check_rows,
    render_fidelity,
    render_text,
)
from harness.published.profiles import read_profile
from harness.published.rows import PublishedRow, load_rows, select
from harness.published.sensitivity import length_sensitivity

CHECK_HELP = "replay every published measurement on the reference engine and compare"
CHECK_DESCRIPTION = """\
Simulate each row of harness/data/published/measurements.csv (a published throughput, TTFT or
ITL on real hardware) with the shipped profile of its engine and GPU, and print published vs
predicted, their ratio, and whether the row's source was used to fit the profile (train) or
never seen by it (held-out); then the median and worst |error| of each group.

examples:
  batchlab check-published
  batchlab check-published --profile vllm-h100-sxm
  batchlab check-published --write-docs      # regenerate docs/fidelity.md
  batchlab check-published --catalog --write-docs   # the catalog's accuracy, re-measured
"""
PROFILES_HELP = "list the shipped engine profiles with their fit and held-out errors"
FIT_HELP = "refit every shipped profile on the published rows (minutes) and rewrite the docs"


def check_add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = CHECK_DESCRIPTION
    parser.add_argument("--profile", metavar="NAME",
                        help="only the rows of this shipped profile (e.g. vllm-h100-sxm), or a "
                             "profile file: then the rows of its engine and GPU, simulated with it")
    parser.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="parallel simulations (default: one per CPU core)")
    parser.add_argument("--write-docs", action="store_true",
                        help=f"also write {FIDELITY_MD.relative_to(FIDELITY_MD.parents[1])} "
                             "(all rows only); with --catalog: the catalog's accuracy, "
                             "in adapters/reference/catalog_accuracy.json and docs/published.md")
    parser.add_argument("--catalog", action="store_true",
                        help="simulate with the catalog's datasheet coefficients instead of the "
                             "profiles' fitted ones (each engine's defaults kept): how accurate "
                             "a simulation without --profile is")


def check_run(args: argparse.Namespace) -> int:
    if args.catalog:
        return _check_catalog(args)
    rows = load_rows()
    profile = None
    if args.profile:
        try:
            profile = read_profile(args.profile)
        except ProfileError as exc:
            print(f"batchlab check-published: error: --profile: {exc}", file=sys.stderr)
            return 2
        rows = select(rows, profile=f"{profile.engine}-{profile.gpu}")
        if not rows:
            engines = sorted({r.engine for r in load_rows()})
            print(f"batchlab check-published: error: --profile {args.profile}: no published "
                  f"rows for engine {profile.engine!r} on {profile.gpu} (the published figures "
                  f"are of {', '.join(engines)}: a profile calibrated on another engine has "
                  "none to be checked against; `batchlab validate` checks it against its engine)",
                  file=sys.stderr)
            return 2
        if args.write_docs:
            print("batchlab check-published: error: --write-docs needs all rows (drop "
                  "--profile)", file=sys.stderr)
            return 2
    # A shipped name checks the rows with the shipped profiles (in parallel); a file is used
    # for every selected row.
    custom = profile if args.profile and args.profile not in shipped_profiles() else None
    _say_what_is_simulated(rows)
    checked = check_rows(rows, jobs=args.jobs, profile=custom)
    print(render_text(checked))
    if args.write_docs:
        from harness.published.coverage import write_coverage

        FIDELITY_MD.write_text(render_fidelity(
            checked, sensitivity=length_sensitivity(rows, jobs=args.jobs)))
        write_coverage(rows)
        print(f"\nwrote {FIDELITY_MD} and adapters/reference/published_coverage.json")
    return 0


def _check_catalog(args: argparse.Namespace) -> int:
    from harness.published.catalog import accuracy_record, render_table, write_catalog

    rows = load_rows()
    if args.profile:
        if args.profile not in shipped_profiles():
            print("batchlab check-published: error: --catalog --profile takes a shipped "
                  "profile's name (its rows)",
                  file=sys.stderr)
            return 2
        if args.write_docs:
            print("batchlab check-published: error: --write-docs needs all rows (drop "
                  "--profile)", file=sys.stderr)
            return 2
        rows = select(rows, profile=args.profile)
    _say_what_is_simulated(rows)
    checked = check_rows(rows, jobs=args.jobs, catalog=True)
    width = max(len(c.row.row_id) for c in checked)
    print(f"{'row':<{width}}  {'metric':<12} {'published':>10} {'catalog':>10} {'ratio':>6}")
    for c in checked:
        p = c.prediction
        print(f"{c.row.row_id:<{width}}  {c.row.metric:<12} {p.published:>10.4g} "
              f"{p.predicted:>10.4g} {p.ratio:>6.3f}")
    print()
    print("\n".join(render_table(accuracy_record(checked))))
    if args.write_docs:
        from harness.published.coverage import write_coverage

        write_catalog(checked)
        write_coverage(rows)
        print("\nwrote adapters/reference/catalog_accuracy.json, "
              "adapters/reference/published_coverage.json and the table in docs/published.md")
    return 0


def profiles_add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "The engine profiles shipped in adapters/reference/profiles: each engine's scheduling "
        "defaults on one GPU and the cost-model coefficients fitted on published rows. Use one "
        "with --profile NAME wherever the reference engine runs.")


def profiles_run(args: argparse.Namespace) -> int:
    del args
    print(f"{'profile':<18} {'fitted':<24} {'train rows':>10} {'train median':>12} "
          f"{'held-out rows':>13} {'held-out median':>15} {'held-out worst':>14} "
          f"{'published workload: n, median, worst':>37}  held-out figures by kind")
    for name in shipped_profiles():
        fit = read_profile(name).fit
        train, held = fit.get("train") or {}, fit.get("held_out") or {}
        pub = fit.get("held_out_workload_published") or {}
        how = "yes" if fit.get("fitted") else f"from {fit.get('coefficients_from', '-')}"
        pub_text = (f"{pub.get('num_rows', 0)}, {_pct(pub.get('median_abs_error'))}, "
                    f"{_pct(pub.get('worst_abs_error'))}" if pub else "0, -, -")
        print(f"{name:<18} {how:<24} {train.get('num_rows', 0):>10} "
              f"{_pct(train.get('median_abs_error')):>12} {held.get('num_rows', 0):>13} "
              f"{_pct(held.get('median_abs_error')):>15} "
              f"{_pct(held.get('worst_abs_error')):>14} {pub_text:>37}  "
              f"{_kinds_text(fit.get('held_out_by_kind'))}")
    print("\nheld-out: rows of sources the fit never saw; published workload: those of them whose"
          "\nworkload is fully published; by kind: how many held-out figures of each kind, and "
          "their\nmedian error (docs/fidelity.md)")
    return 0


def fit_add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Fit each shipped profile's coefficients on the rows of the training sources, hold the "
        "other sources out, write the profiles and docs/fidelity.md. Takes a few minutes.\n\n"
        "example:\n  batchlab fit-published")
    parser.add_argument("--rounds", type=int, default=3,
                        help="fit rounds, each on freshly simulated schedules (default 3)")
    parser.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="parallel simulations for the final check")


def fit_run(args: argparse.Namespace) -> int:
    from harness.published.check import stats_lines
    from harness.published.refit import refit_all

    checked = refit_all(load_rows(), rounds=args.rounds, jobs=args.jobs)
    print("\n".join(stats_lines(checked)))
    return 0


def _say_what_is_simulated(rows: Sequence[PublishedRow]) -> None:
    """One line on stderr before a check that may take minutes: how much it simulates."""
    num = sum(r.num_requests for r in rows)
    print(f"simulating {len(rows)} published row{'s' if len(rows) != 1 else ''}, each with "
          f"its whole published request count ({num:,} requests; all of the rows take about "
          "two minutes on two cores)", file=sys.stderr, flush=True)


def _kinds_text(by_kind: object) -> str:
    """"throughput 32 (8.9%), TTFT 6 (14.0%)": how many held-out figures of each kind."""
    if not isinstance(by_kind, dict) or not by_kind:
        return "-"
    return ", ".join(f"{kind} {s.get('num_rows')} ({_pct(s.get('median_abs_error'))})"
                     for kind, s in by_kind.items())


def _pct(x: object) -> str:
    return f"{100 * float(x):.1f}%" if isinstance(x, int | float) else "-"


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.published.cli {check-published,profiles,fit-published}``."""
    parser = argparse.ArgumentParser(prog="python -m harness.published.cli")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_, add, run in (
        ("check-published", CHECK_HELP, check_add_arguments, check_run),
        ("profiles", PROFILES_HELP, profiles_add_arguments, profiles_run),
        ("fit-published", FIT_HELP, fit_add_arguments, fit_run),
    ):
        p = sub.add_parser(name, help=help_)
        add(p)
        p.set_defaults(run=run)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
