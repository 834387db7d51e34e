"""Commands over scenarios and saved results: ``run`` and ``report``."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from harness.cli.common import (
    EXIT_FAILURE,
    UserError,
    add_subparser,
    fmt_s,
    fraction,
    holding_folder,
    refuse_in_writing,
    too_many_failed,
)
from harness.results import SUMMARY_FILE, read_summary

if TYPE_CHECKING:
    from harness.scenario.status import CellOutcome


def add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subparser(
        sub, "run",
        help="run a scenario: every engine x grid x load cell, then the comparative report",
        description="Expand a scenario file (scenarios/*.yaml) into cells, run each one "
        "(simulated or live) into OUT/<scenario>/<cell>/, then write OUT/<scenario>/report.md "
        "comparing them. A cell that fails is recorded with its reason and the sweep goes on.",
        epilog="examples: batchlab run scenarios/quickstart.yaml; "
        "batchlab run scenarios/engines-h100.yaml --only 'reference*'; "
        "batchlab run scenarios/batch-size.yaml --resume",
    )
    p.add_argument("scenario", metavar="SCENARIO.yaml", help="the scenario file")
    p.add_argument("--out", default="reports", metavar="DIR",
                   help="where the scenario's folder goes (default: reports)")
    p.add_argument("--only", metavar="PATTERN",
                   help="run only cells whose name (or engine name) matches a shell pattern; "
                   "several patterns separated by commas")
    p.add_argument("--resume", action="store_true",
                   help="skip cells that finished earlier; redo missing, failed or "
                   "interrupted ones")
    p.add_argument("--trace", metavar="FILE",
                   help="use this trace file instead of the scenario's (its options still apply), "
                   "e.g. a full trace from $BATCHLAB_TRACES_DIR")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run cells as Ray tasks (live cells ask for their tensor_parallel_size "
                   "GPUs); without ADDRESS, start or join a local Ray")
    p.add_argument("--list", action="store_true", help="print the cells and exit")
    p.add_argument("--max-failed", type=fraction, default=None, metavar="F",
                   help="exit with status 1 when, in any cell, more than this fraction of the "
                   "requests sent failed, e.g. 0.01 for a nightly job (default: only when a "
                   "cell failed or served nothing); every cell runs and is kept either way")


def cmd_run(args: argparse.Namespace) -> int:
    from harness.runfolder import RunDirError, ensure_creatable_dir
    from harness.scenario import ScenarioError, load_scenario, run_scenario, select

    try:
        scenario = load_scenario(args.scenario, trace_path=args.trace)
        if not args.list:
            ensure_creatable_dir(Path(args.out) / scenario.name)
        if args.list:
            for cell in select(scenario.cells(), args.only):
                print(f"{cell.name}\t{cell.engine.engine} ({cell.engine.mode})\t"
                      f"{cell.load.describe()}")
            return 0
        try:
            result = run_scenario(scenario, args.out, only=args.only, resume=args.resume,
                                  use_ray=args.ray is not None, ray_address=args.ray or None)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the cells that finished are on disk
            folder = Path(args.out) / scenario.name
            raise KeyboardInterrupt(
                f"the cells that finished are in {folder}/: `batchlab report {folder}` renders "
                "them, and the same command with --resume runs the others") from None
    except (ScenarioError, RunDirError) as exc:
        raise UserError(str(exc)) from None
    _print_cells(result.outcomes)
    too_many = []
    for outcome in result.outcomes:
        if outcome.state == "failed":
            print(f"cell {outcome.name} failed: {outcome.reason}", file=sys.stderr)
        elif outcome.state in ("done", "skipped") and outcome.run_dir is not None:
            why = too_many_failed(read_summary(outcome.run_dir / SUMMARY_FILE),
                                  args.max_failed)
            if why:
                too_many.append(outcome.name)
                print(f"cell {outcome.name}: {why}", file=sys.stderr)
    print(f"report: {result.report}")
    return EXIT_FAILURE if result.num_failed or too_many else 0


def _print_cells(outcomes: Sequence[CellOutcome]) -> None:
    """Each cell's answer in a few figures, on stdout before the report's path, so that a
    terminal or a nightly job's log shows them: output tok/s, TTFT and TPOT p90, SLO
    attainment, and whether the engine kept pace with its arrivals; the cells whose figures
    are predicted are named once under the table. The report says the rest."""
    from harness.manifest import read_manifest
    from harness.metrics import attainment_text
    from harness.results import run_pace

    rows, predicted = [], []
    for o in outcomes:
        if o.state not in ("done", "skipped") or o.run_dir is None:
            rows.append([o.name, o.state.replace("_", " "), "", "", "", "", ""])
            continue
        summary = read_summary(o.run_dir / SUMMARY_FILE)
        manifest = read_manifest(o.run_dir)
        good = (summary.get("goodput") or {}).get("slo_attainment")
        pace = run_pace(o.run_dir, summary, manifest)
        kept = ("–" if pace is None else "yes" if pace.kept
                else "fell behind" if pace.fell_behind else "not known")
        tp = (summary.get("throughput") or {}).get("output_tokens_per_s")
        rows.append([o.name, "done" if o.state == "done" else "earlier run",
                     f"{tp:,.0f}" if isinstance(tp, (int, float)) else "–",
                     fmt_s((summary.get("ttft_s") or {}).get("p90")),
                     fmt_s((summary.get("tpot_s") or {}).get("p90")),
                     attainment_text(good) if good is not None else "–", kept])
        if summary.get("prediction"):
            predicted.append(o.name)
    if not rows:
        return
    head = ["cell", "state", "output tok/s", "TTFT p90", "TPOT p90", "SLO met", "kept pace"]
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(str(v).ljust(w) if i < 2 else str(v).rjust(w)
                        for i, (v, w) in enumerate(zip(r, widths, strict=True))).rstrip())
    if predicted:
        whose = "every cell" if len(predicted) == len(rows) else ", ".join(predicted)
        print(f"predicted: {whose} (by the reference engine; how accurate such predictions "
              "were measured to be: the report's \"How accurate the predictions are\")")


def add_report(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subparser(
        sub, "report",
        help="re-render a report from saved results, or compare run folders",
        description="Render report.md from run folders on disk without re-running anything. "
        "One scenario folder re-renders its report; one run folder its single-run report; "
        "several folders (scenario cells, simulate or replay runs, made at any time) are "
        "compared in one report.",
        epilog="examples: batchlab report reports/quickstart; batchlab report reports/sim "
        "reports/vllm-live --baseline sim -o reports/sim-vs-vllm/report.md",
    )
    p.add_argument("dirs", nargs="+", metavar="DIR", help="scenario or run folders")
    p.add_argument("--baseline", metavar="CELL",
                   help="the cell the others are compared with (default: the scenario's, "
                   "else the first)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="report file, not in a run's, a scenario's or a capacity search's "
                   "folder (the report and its figures would replace that folder's own), "
                   "except the one folder's own report (default: DIR/report.md for one "
                   "folder, reports/comparison/report.md for several)")


def cmd_report(args: argparse.Namespace) -> int:
    dirs = [Path(d) for d in args.dirs]
    for d in dirs:
        if not d.is_dir():
            raise UserError(f"{d}: no such folder")
    refuse_in_writing(dirs, "a report")
    _check_report_output(args, dirs)
    # a report written into the folder holds it as a run does: no run or sweep starts
    # writing it halfway through the report
    into = len(dirs) == 1 and (not args.output or _own_run_report(args, dirs))
    with holding_folder(dirs[0], "a report") if into else contextlib.nullcontext():
        return _render_report(args, dirs)


def _render_report(args: argparse.Namespace, dirs: list[Path]) -> int:
    from harness import report

    try:
        if len(dirs) == 1 and (dirs[0] / report.SCENARIO_FILE).exists():
            out = report.render_scenario_report(
                dirs[0], out_file=Path(args.output) if args.output else None,
                baseline=args.baseline)
        elif len(dirs) == 1 and (not args.output or _own_run_report(args, dirs)) \
                and not args.baseline:
            marks = ("summary.json", report.STATUS_FILE, "manifest.json")
            if not any((dirs[0] / name).exists() for name in marks):
                raise UserError(f"{dirs[0]}: not a run folder or scenario folder (no "
                                f"{', '.join(marks)} or {report.SCENARIO_FILE})")
            out = report.render_run_report(dirs[0])
        else:
            out = report.render_comparison(
                dirs, Path(args.output or "reports/comparison/report.md"),
                baseline=args.baseline)
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from None
    print(f"report: {out}")
    return 0


def _check_report_output(args: argparse.Namespace, dirs: list[Path]) -> None:
    """The report's file must be writable, and not land in a run's folder, or under one: its
    figures (latency_cdf.png, ...) would replace that run's own, and a later run into the
    folder would refuse the report as a file batchlab did not write there. Nor in a
    scenario's or a capacity search's folder, whose report.md and figures ``batchlab run`` or
    ``batchlab capacity`` wrote, nor in or under a cell's or a setting's search folder. The
    exceptions are a run folder's own report (``batchlab report RUN_DIR -o
    RUN_DIR/report.md``), written as ``batchlab report RUN_DIR`` writes it, and a report of
    the one scenario or capacity folder given, written in it."""
    from harness.runfolder import RunDirError, ensure_writable_dir, ensure_writable_file

    try:
        if args.output:
            out = Path(args.output)
            if not _own_run_report(args, dirs):
                _refuse_run_folder(out, dirs)  # before anything is made under it
                _refuse_sweep_folder(out, dirs)
            ensure_writable_file(out)
        elif len(dirs) == 1:
            ensure_writable_dir(dirs[0], what="report folder")
        else:
            ensure_writable_dir(Path("reports/comparison"), what="report folder")
    except RunDirError as exc:
        raise UserError(str(exc)) from None


def _own_run_report(args: argparse.Namespace, dirs: list[Path]) -> bool:
    """``-o`` names the one run folder's own report.md, where ``batchlab report RUN_DIR``
    writes it."""
    from harness.report import REPORT_FILE
    from harness.runfolder import run_marker

    return (len(dirs) == 1 and bool(args.output) and not args.baseline
            and run_marker(dirs[0]) is not None
            and Path(args.output).resolve() == (dirs[0] / REPORT_FILE).resolve())


def _refuse_run_folder(out: Path, dirs: list[Path]) -> None:
    """RunDirError when ``out`` is in a run folder, or under one (``runfolder.folder_above``,
    as ``compare --json`` is kept out of one)."""
    from harness.runfolder import RunDirError, folder_above, run_marker, shown

    found = folder_above(out, run_marker)
    if found is None:
        return
    folder, marker = found
    parent = out.resolve().parent
    whose = ("a run folder this report compares" if folder in {d.resolve() for d in dirs}
             else "another run's folder")
    if folder == parent:
        what = (f"{out.parent} is {whose} (its {marker}): the report's figures "
                "(latency_cdf.png, engine_state.png, throughput.png) would replace that run's "
                "own")
    else:
        what = (f"{out.parent} is inside {shown(folder)}, {whose} (its {marker}): the "
                "report would leave files batchlab did not write in that run's folder, which "
                "a later run into it refuses")
    raise RunDirError(f"-o {out}: {what}; write the report to a folder of its own, e.g. "
                      "-o reports/comparison/report.md")


# The command that writes a sweep's or search's own report.md and figures
_FOLDER_REPORT_BY = {"scenario": "batchlab run", "capacity": "batchlab capacity"}


def _refuse_sweep_folder(out: Path, dirs: list[Path]) -> None:
    """RunDirError when ``out`` is in a scenario's or a capacity search's folder (its
    report.md and figures would be replaced), other than the one such folder this report is
    of, or in or under a cell's or a setting's search folder (the sweep or search that runs
    it again refuses files batchlab did not write there): what the folder is, as
    ``runfolder.results_folder`` tells. Run folders: ``_refuse_run_folder``."""
    from harness.runfolder import RunDirError, folder_above, results_folder, shown

    found = folder_above(out, results_folder)
    if found is None:
        return
    folder, made_for = found
    parent = out.resolve().parent
    writer = _FOLDER_REPORT_BY.get(made_for.kind)
    if writer is not None and folder != parent:
        return  # a folder of its own inside it: nothing of the sweep's is replaced
    if writer is not None and len(dirs) == 1 and folder == dirs[0].resolve():
        return  # its own report, as ``batchlab report DIR`` writes it
    where = (f"{out.parent} is {made_for.describe()}" if folder == parent
             else f"{out.parent} is inside {shown(folder)}, {made_for.describe()}")
    why = (f"its report.md and figures are written by `{writer}`" if writer is not None
           else "the report would leave files batchlab did not write in it, which the sweep "
           "or search that runs it again refuses")
    raise RunDirError(f"-o {out}: {where}: {why}; choose another -o, e.g. "
                      "-o reports/comparison/report.md")
