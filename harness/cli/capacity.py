"""``batchlab capacity``: the highest load each engine × knob setting serves within the SLO."""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.cli.common import (
    RawDescriptionFormatter,
    UserError,
    add_knob_flags,
    add_subparser,
    add_trace_options,
    command_line,
    knobs_from_args,
    parse_slo,
    print_predicted,
    trace_options,
)
from harness.cli.live import add_engine_options, live_target_spec
from harness.cli.offline import (
    add_profile_option,
    print_trace_notes,
    reference_config,
    reference_spec,
)

if TYPE_CHECKING:
    from harness.capacity import SearchResult, SearchSpec, Setting, SettingResult


OVERWRITE_HELP = ("replace the search in --out when it is another search's (another scenario, "
                  "or other engine, knobs, trace, SLO or target); without it such a folder is "
                  "refused; not with --resume, which goes on with the same search")


def add_capacity(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subparser(
        sub, "capacity",
        help="find the highest request rate (or concurrency) each setting serves within SLO",
        description=textwrap.fill(  # the raw formatter keeps the examples' lines; not this
        "For each engine × knob setting, find the highest request rate (or number "
        "of closed-loop users) at which SLO attainment (requests meeting every SLO / requests "
        "sent) stays at or above --target. The search brackets the answer (doubling or halving "
        "the load), then bisects to --precision. Every probe is a recorded run folder; a probe "
        "stops early once the engine is clearly over-saturated (its waiting queue, or the "
        "client's send lag, grows at every check) and counts as failing (the lowest failing "
        "load, if it was stopped early, is run again to its end, so that a burst in the trace "
        "cannot set the answer); a rate probe also fails when the engine fell behind its "
        "arrivals, or when the trace is too short to "
        "show a steady state at that rate (docs/metrics.md, 'Capacity probes'). OUT/<setting>/"
        "search.json lists the probes, bracket, result and precision; OUT/report.md draws the "
        "throughput-latency curves and the capacity table. With a scenario file its engines × "
        "grid are searched (its load points are replaced by the search); without one, the "
        "simulated reference engine of the knob flags, or --engine NAME live.", width=79,
        break_on_hyphens=False),
        epilog="examples:\n"
        "  batchlab capacity scenarios/batch-size.yaml --search rate --slo tpot_s=0.02,"
        "ttft_s=1\n"
        "  batchlab capacity --trace harness/data/azure_conv_excerpt.csv --limit 300 \\\n"
        "      --max-num-seqs 64 --slo ttft_s=0.5,tpot_s=0.03 --out reports/capacity\n"
        "  batchlab capacity --trace synthetic --num-requests 400 --prompt-tokens 512 \\\n"
        "      --output-tokens 128 --search concurrency --start 8 --slo ttft_s=1,tpot_s=0.05\n"
        "  batchlab capacity scenarios/batch-size.yaml --resume     # after an interruption\n"
        "\n"
        "exit status: 0 when every setting's search ran to an answer: a capacity, or a bound\n"
        "  (the status column: at_least_max, max_probes, ... say why no load failed); 1 when\n"
        "  a setting's search could not run (its engine did not start, ...); 2 for bad input",
        formatter_class=RawDescriptionFormatter,
    )
    p.add_argument("scenario", nargs="?", metavar="SCENARIO.yaml",
                   help="search every engine × grid setting of this scenario (optional)")
    g = p.add_argument_group("search")
    g.add_argument("--search", choices=("rate", "concurrency"), default="rate",
                   help="the load to search: request rate in req/s (the trace rescaled to it; "
                   "default), or closed-loop users")
    g.add_argument("--target", type=float, default=0.99, metavar="F",
                   help="SLO attainment to keep, a fraction (0.99)")
    g.add_argument("--slo", help="SLOs a request must meet, e.g. ttft_s=0.5,tpot_s=0.05 "
                   "(default: the scenario's)")
    g.add_argument("--start", type=float, metavar="LOAD",
                   help="the first probe's load (rate 1 req/s, concurrency 4 users, or the "
                   "nearest load within --min-load/--max-load)")
    g.add_argument("--precision", type=float, metavar="P",
                   help="stop when the passing and failing loads are this close: rate, relative "
                   "(0.05 = 5%%); concurrency, users (1)")
    g.add_argument("--min-load", type=float, metavar="LOAD",
                   help="lowest load to try (rate 0.01, concurrency 1)")
    g.add_argument("--max-load", type=float, metavar="LOAD",
                   help="highest load to try (rate 10000, concurrency 4096)")
    g.add_argument("--max-probes", type=int, default=40, metavar="N",
                   help="at most N probes per setting (40)")
    g.add_argument("--think-time-s", type=float, default=0.0, metavar="S",
                   help="concurrency search, simulated: seconds a user waits after a finish (0)")
    g.add_argument("--no-early-stop", action="store_true",
                   help="run every probe to the end, even over-saturated ones")
    g.add_argument("--only", metavar="PATTERN",
                   help="scenario: only settings whose name or engine matches (comma-separated "
                   "shell patterns); what earlier searches of the others left in --out (same "
                   "engine, knobs, trace, SLO and target) stays in the table and report")
    g.add_argument("--out", metavar="DIR",
                   help="where the searches go (reports/<scenario>-capacity, or "
                   "reports/capacity)")
    g.add_argument("--resume", action="store_true",
                   help="reuse the probes already done in --out (same engine, knobs, trace, SLO "
                   "and target, the same bytes of the trace, lengths and profile files, and "
                   "the same batchlab version); run only the rest")
    g.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    add_trace_options(p)
    add_engine_options(p)
    r = p.add_argument_group("reference engine (without --engine)")
    r.add_argument("--model", default="llama-3.1-8b",
                   help="simulated: catalog model or config.json (llama-3.1-8b); live: the "
                   "model name requests carry")
    add_profile_option(r)
    add_knob_flags(p, reference=True)


def cmd_capacity(args: argparse.Namespace) -> int:
    from harness.runfolder import (
        RunDirError,
        ensure_creatable_dir,
        ensure_writable_dir,
        holding_dir,
    )

    if args.resume and args.overwrite:
        raise UserError("--resume and --overwrite contradict each other: --resume goes on with "
                        "the search in --out, --overwrite replaces another search there and "
                        "starts over; give one")
    spec = _search_spec(args)
    if not args.scenario:  # (a scenario refuses every trace flag but --trace)
        _refuse_arrival_options(args, spec)
    settings, name, out, baseline, every = _settings(args, spec)
    notes: dict[str, tuple[str, ...]] = {}  # each setting's trace notes, for the headline
    for setting in settings:  # trace errors before any probe runs
        try:
            notes[setting.name] = setting.plan.trace_at(spec.kind, spec.start).notes
        except ValueError as exc:
            raise UserError(str(exc)) from None
    if getattr(args, "dry_run", False):
        return _dry_run(args, settings, spec)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: a file is there, not a folder")
    try:
        ensure_creatable_dir(out)
    except RunDirError as exc:
        raise UserError(str(exc)) from None
    for setting in settings:  # each setting's search is a folder of its own
        if (out / setting.name).exists() and not (out / setting.name).is_dir():
            raise UserError(f"--out {out}: {setting.name} is a file there, where the search "
                            f"of setting {setting.name} goes; move it, or choose another --out")
    from harness.capacity.run import check_out_folders, check_resumable, check_same_search

    try:  # another run's folder, a scenario's: refused before anything is read or written
        check_out_folders(settings, out)
    except RunDirError as exc:
        raise UserError(str(exc)) from None
    if args.resume:
        try:
            check_resumable(settings, out, name=name)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    try:  # another search's, unless --overwrite (then its folders are checked removable)
        check_same_search(settings, out, name=name, overwrite=args.overwrite,
                          resume=args.resume)
    except RunDirError as exc:
        raise UserError(str(exc)) from None
    try:  # made now, and proved writable: what the checks above cannot tell (/proc as root)
        ensure_writable_dir(out)
    except RunDirError as exc:
        raise UserError(str(exc)) from None
    try:  # one search at a time in --out, its report included (a second is refused at once)
        with holding_dir(out):
            return _search_and_report(args, settings, spec, out, name, baseline, every,
                                      notes)
    except RunDirError as exc:
        raise UserError(str(exc)) from None


def _dry_run(args: argparse.Namespace, settings: list[Setting], spec: SearchSpec) -> int:
    """``--dry-run``: the engine's launch plan, as ``replay --engine --dry-run`` prints it for
    the first probe, and the search it would run; nothing is started or written."""
    from adapters.knobs import KnobError
    from harness.target import RunOptions
    from harness.targets import LiveTarget

    if not args.engine:
        raise UserError("--dry-run: only with --engine NAME (it prints the engine's launch "
                        "plan); the simulated reference engine starts nothing")
    setting = settings[0]
    try:
        LiveTarget(setting.plan.spec).run(setting.plan.trace_at(spec.kind, spec.start),
                                          Path(args.out), RunOptions(), dry_run=True)
    except KnobError as exc:
        raise UserError(str(exc)) from None
    print(f"would search the {spec.kind} of setting {setting.name} from {spec.start:g}, each "
          f"probe a run of the plan above ({spec.precision_text()}); nothing started or written")
    return 0


def _search_and_report(args: argparse.Namespace, settings: list[Setting], spec: SearchSpec,
                       out: Path, name: str, baseline: str | None,
                       every: list[Setting], notes: dict[str, tuple[str, ...]]) -> int:
    """The search of every setting, its table and its report; the exit status. ``notes``:
    each setting's trace notes (``Trace.notes``), printed under the headline."""
    from harness.capacity import run_capacity

    slo_text = ", ".join(f"{k.removesuffix('_s').upper()} <= {v:g} s"
                         for k, v in settings[0].plan.slo.as_dict().items() if v is not None)
    print(f"capacity search ({spec.kind}, SLO attainment >= {args.target:.1%} of requests "
          f"within {slo_text}, {spec.precision_text()}): {len(settings)} setting(s) into "
          f"{out}/", flush=True)
    _print_trace_notes(notes)
    try:
        results = run_capacity(settings, spec, out, name=name, resume=args.resume,
                               baseline=baseline, command=command_line(), log=_log,
                               every=every, write_report=False, overwrite=args.overwrite)
    except KeyboardInterrupt:  # what to do next, said by the command line's interrupt line
        raise KeyboardInterrupt(f"the finished probes are listed in {out / 'capacity.json'}; "
                                f"`batchlab report {out}` renders them, and the same command "
                                "with --resume goes on") from None
    try:  # every search is on disk: Ctrl-C from here on costs the report only
        _print_table(results, spec, out)
        _print_predicted(results, out)
        written = _render_report(out)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(f"the searches are complete and listed in "
                                f"{out / 'capacity.json'}, but report.md was not written; "
                                f"`batchlab report {out}` renders it") from None
    if not written:
        return 1
    print(f"report: {out / 'report.md'}")
    return 1 if any(r.result is None for r in results if not r.earlier) else 0


def _render_report(out: Path) -> bool:
    """``out``'s report.md; False, said, when it could not be written (a report that fails
    costs no result: every search is on disk)."""
    from harness.report import render_scenario_report

    try:
        render_scenario_report(out)
    except Exception as exc:
        print(f"batchlab capacity: error: the searches are recorded in "
              f"{out / 'capacity.json'}, but report.md could not be written: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return False
    return True


def _print_predicted(results: list[SettingResult], out: Path) -> None:
    """The capacities that are predictions, of which model, how accurate: as the probes
    recorded it (simulated, or the reference engine served over HTTP, launched or attached:
    ``capacity.json``'s ``prediction``, the words ``replay`` prints under its figures); a
    simulated setting whose probes say nothing (none ran), from its configuration. A setting
    whose search has no answer (it failed) predicts nothing: left out."""
    from harness.capacity.run import setting_prediction
    from harness.prediction import CAPACITY_CAVEAT
    from harness.sim.target import SimulatedTarget

    by_text: dict[str, list[str]] = {}
    by_config: dict[Any, list[str]] = {}
    for r in results:
        if r.result is None:
            continue
        found = setting_prediction(r, out)
        if found is not None:
            by_text.setdefault(str(found["text"]), []).append(r.setting.name)
        elif r.setting.plan.spec.simulated:
            config = SimulatedTarget(r.setting.plan.spec).config()
            by_config.setdefault(config, []).append(r.setting.name)
    for text, names in by_text.items():
        print(f"{', '.join(names)}: {text}", flush=True)
    for config, names in by_config.items():
        print_predicted(config, names=names)
    if by_text or by_config:
        print(CAPACITY_CAVEAT)


def _print_trace_notes(notes: dict[str, tuple[str, ...]]) -> None:
    """What loading did to each setting's trace (requests dropped, clipped, rows skipped), as
    ``simulate`` prints it; once when every setting's trace has the same notes, else under
    the names of the settings whose trace has them. Notes on arrival times are left out:
    each probe sets the arrivals itself, at its load."""
    by_notes: dict[tuple[str, ...], list[str]] = {}
    for setting, its_notes in notes.items():
        by_notes.setdefault(its_notes, []).append(setting)
    if len(by_notes) == 1:
        print_trace_notes(next(iter(by_notes)), arrivals=False)
        return
    for its_notes, names in by_notes.items():
        print_trace_notes(its_notes, arrivals=False, of=f"{', '.join(names)}: ")


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _warn(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr, flush=True)


def _refuse_arrival_options(args: argparse.Namespace, spec: SearchSpec) -> None:
    """--rate and --time-scale set the trace's arrivals: a rate search sets them itself, at
    each probe's load (refused, naming the flag); a concurrency search does not use them
    (said, as ``replay --mode closed`` says it)."""
    given = [flag for flag, value in (("--rate", args.rate), ("--time-scale", args.time_scale))
             if value is not None]
    if not given:
        return
    if spec.kind == "rate":
        raise UserError(f"{', '.join(given)}: a rate search sets the arrival rate of each "
                        "probe itself (the trace rescaled to the probe's load), so neither "
                        "--rate nor --time-scale can be given; a concurrency search "
                        "(--search concurrency) uses no arrival times")
    print(f"note: {', '.join(given)}: no effect on a concurrency search (each user sends its "
          "next request when its last one ends; arrival times are not used)", file=sys.stderr)


def _search_spec(args: argparse.Namespace) -> SearchSpec:
    from harness.capacity import SearchSpec

    rate = args.search == "rate"
    for flag, value in (("--start", args.start), ("--min-load", args.min_load),
                        ("--max-load", args.max_load)):
        if value is not None and not math.isfinite(value):  # inf, nan: no load to probe
            raise UserError(f"{flag}: expected a finite load, got {value:g}")
    start = args.start
    if (args.min_load is not None and args.max_load is not None
            and args.min_load > args.max_load):
        raise UserError(f"--min-load {args.min_load:g} is above --max-load {args.max_load:g}")
    _check_load_range(args)
    if start is None:  # the default start, within the range asked for
        default = SearchSpec(kind=args.search, min_load=args.min_load, max_load=args.max_load)
        start = min(max(1.0 if rate else 4.0, default.lowest), default.highest)
        if not rate:  # whole users, within the range
            start = float(max(1, min(math.ceil(start), math.floor(default.highest))))
    spec = SearchSpec(
        kind=args.search, target=args.target, start=start,
        precision=args.precision if args.precision is not None else (0.05 if rate else 1.0),
        min_load=args.min_load, max_load=args.max_load, max_probes=args.max_probes)
    try:
        spec.validate()
    except ValueError as exc:  # names the field: target, start, precision, min_load, ...
        said = re.sub(r"\b(target|start|precision|min_load|max_load|max_probes)\b",
                      lambda m: "--" + m.group(1).replace("_", "-"), str(exc))
        raise UserError(said) from None
    if args.think_time_s and rate:
        raise UserError("--think-time-s: only for --search concurrency")
    if not (math.isfinite(args.think_time_s) and args.think_time_s >= 0):
        raise UserError(f"--think-time-s: expected seconds >= 0, got {args.think_time_s:g}")
    return spec


def _check_load_range(args: argparse.Namespace) -> None:
    """--start within --min-load .. --max-load, each bound the flag's or its default: refused
    naming only the flags given, and saying which value is a default (``SearchSpec.lowest``,
    ``highest``)."""
    from harness.capacity import SearchSpec

    for flag, value in (("--start", args.start), ("--min-load", args.min_load),
                        ("--max-load", args.max_load)):
        if value is not None and not value > 0:  # (a default start would take its place)
            raise UserError(f"{flag}: must be a positive load, got {value:g}")
    defaults = SearchSpec(kind=args.search)

    def bound(flag: str, given: float | None, default: float, edge: str) -> str:
        if given is not None:
            return f"{flag} {given:g}"
        return f"the {edge} load ({flag}, default {default:g})"

    lowest = bound("--min-load", args.min_load, defaults.lowest, "lowest")
    highest = bound("--max-load", args.max_load, defaults.highest, "highest")
    low = args.min_load if args.min_load is not None else defaults.lowest
    high = args.max_load if args.max_load is not None else defaults.highest
    if args.max_load is not None and args.max_load < low:  # --min-load given: checked
        raise UserError(f"--max-load {args.max_load:g} is below {lowest}")
    if args.min_load is not None and args.min_load > high:
        raise UserError(f"--min-load {args.min_load:g} is above {highest}")
    if args.start is not None and args.start < low:
        raise UserError(f"--start {args.start:g} is below {lowest}")
    if args.start is not None and args.start > high:
        raise UserError(f"--start {args.start:g} is above {highest}")


def _settings(args: argparse.Namespace, spec: SearchSpec
              ) -> tuple[list[Setting], str, Path, str | None, list[Setting]]:
    """The settings to search, the search's name, its folder, its baseline setting, and
    every setting of the scenario (``--only`` chose the first among them)."""
    from harness.capacity import scenario_settings
    from harness.scenario import ScenarioError, load_scenario

    slo = parse_slo(args.slo)
    if args.only is not None and not args.only.strip(" ,"):
        raise UserError("--only: give a pattern (a setting or engine name, shell patterns "
                        "allowed); without --only every setting is searched")
    if args.scenario:
        _refuse_setting_options(args)
        try:
            scenario = load_scenario(args.scenario, trace_path=args.trace)
            options: dict[str, Any] = {
                "kind": spec.kind, "target": spec.target, "slo": slo,
                "think_time_s": args.think_time_s, "command": command_line(),
                "early_stop": not args.no_early_stop}
            settings = scenario_settings(scenario, only=args.only, warn=_warn, **options)
            every = settings
            if args.only:  # earlier searches of the others stay in the report
                with contextlib.suppress(ScenarioError):  # others this search cannot make
                    every = scenario_settings(scenario, **options)
        except ScenarioError as exc:
            raise UserError(str(exc)) from None
        if not settings:
            raise UserError(f"--only {args.only!r}: no setting of {args.scenario} matches")
        name = f"{scenario.name}-capacity"
        baseline = (_baseline_setting(scenario, settings) if scenario.baseline is not None
                    else None)
        return settings, name, Path(args.out or f"reports/{name}"), baseline, every
    if args.only:
        raise UserError("--only: only with a scenario file")
    if not args.trace and args.format != "synthetic":
        raise UserError("--trace is required without a scenario: a trace file, or 'synthetic'")
    if slo is None:
        raise UserError("--slo is required without a scenario, e.g. --slo ttft_s=0.5,tpot_s=0.05")
    setting = _single_setting(args, spec, slo)
    return ([setting], f"{setting.name}-capacity", Path(args.out or "reports/capacity"), None,
            [setting])


def _baseline_setting(scenario: Any, settings: list[Setting]) -> str | None:
    """The scenario's ``baseline`` (a cell or an engine name) as a searched setting's name;
    None when --only left it out."""
    names = [s.name for s in settings]
    if scenario.baseline in names:
        return str(scenario.baseline)
    return next((s.name for s in settings if s.plan.cell.get("engine", {}).get("name")
                 == scenario.baseline), None)


# With a scenario file, what the command line may still say: how to search, and the trace
# file (``--trace``, as ``batchlab run --trace``). The rest describes the one setting searched
# without a scenario.
_SCENARIO_FORM = {"command", "scenario", "search", "target", "slo", "start", "precision",
                  "min_load", "max_load", "max_probes", "think_time_s", "no_early_stop", "only",
                  "out", "resume", "overwrite", "trace"}


def _refuse_setting_options(args: argparse.Namespace) -> None:
    """Options that a scenario file overrides would be ignored: refused instead, by name."""
    from harness.cli import build_parser

    parser, _ = build_parser("capacity")
    for action in parser._actions:  # parse again with no defaults: only what was typed is set
        if isinstance(action, argparse._SubParsersAction):
            for sub_action in action.choices["capacity"]._actions:
                sub_action.default = argparse.SUPPRESS
    typed = vars(parser.parse_args(getattr(args, "argv", None) or ["capacity"]))
    given = [name for name in typed if name not in _SCENARIO_FORM]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in sorted(given))
        raise UserError(f"{flags}: not with a scenario file, whose engines, knobs, model, GPU "
                        "and trace options the search uses (edit a copy of the scenario); "
                        "without a scenario they describe the one setting searched")


def _reference_setting_name(profile: str | None) -> str:
    """The setting a search of the simulated reference engine is filed and reported under:
    ``reference`` on the catalog's coefficients, else the profile's name (a file's stem), so
    that the report's table says which engine the capacity predicts."""
    if not profile:
        return "reference"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(profile).stem).strip("-.") or "reference"


def _single_setting(args: argparse.Namespace, spec: SearchSpec, slo: Any) -> Setting:
    import dataclasses

    from harness.capacity import single_setting

    # --on-too-long drop|clip without --max-model-len: a simulated engine's own length, as
    # simulate applies it; a live engine's is not known (trace_options refuses)
    engine_len = None if args.engine else reference_config(args).resolved_max_model_len
    parsed = trace_options(args, engine_max_model_len=engine_len)
    options = {f.name: getattr(parsed, f.name) for f in dataclasses.fields(parsed)}
    if args.engine:
        if args.think_time_s:
            raise UserError("--think-time-s: simulated only (the live closed loop has none)")
        target = live_target_spec(args, url=args.url)
        knobs: dict[str, Any] = dict(knobs_from_args(args).as_dict())
        name = args.engine
    else:
        target = reference_spec(args)
        knobs = reference_config(args).effective_knobs()
        name = _reference_setting_name(args.profile)
    return single_setting(target, name=name, trace_path=args.trace or "synthetic",
                          trace_options=options, kind=spec.kind, target=spec.target, slo=slo,
                          knobs=knobs, think_time_s=args.think_time_s, command=command_line(),
                          early_stop=not args.no_early_stop)


def _print_table(results: list[SettingResult], spec: SearchSpec, out: Path) -> None:
    """A row per setting; one whose bound would mislead (no load meets the SLO, or the trace
    too short to tell) shows no capacity and says why, as its log line did
    (``result_answer``)."""
    from harness.capacity.run import result_answer
    from harness.capacity.search import LOAD_UNITS
    from harness.report.curves import status_bound
    from harness.results import failure_reason

    unit = LOAD_UNITS[spec.kind]
    width = max([len(r.setting.name) for r in results] + [7])
    head = f"capacity ({unit})"
    col = max(10, len(head))
    print(f"{'setting':<{width}}  {head:>{col}}  bracket (pass .. fail)     probes  status")
    for r in results:
        earlier = " (earlier search, not run now)" if r.earlier else ""
        if r.result is None:
            print(f"{r.setting.name:<{width}}  {'–':>{col}}  {'':<25} {'':>6}  failed: "
                  f"{failure_reason(r.error or '')}{earlier}")
            continue
        res = r.result
        answer = result_answer(res, r.setting.plan, spec.kind, out / r.setting.name)
        bound = status_bound(res.status)
        value = None if answer else res.failing if bound == "<" else res.capacity
        cap = "–" if value is None else ("" if bound == "=" else f"{bound} ") + f"{value:g}"
        cap = f"{cap:>{col}}"
        shown = [load for load in (res.passing, res.failing) if load is not None]
        bracket = (f"{'–' if res.passing is None else f'{res.passing:g}'} .. "
                   f"{'–' if res.failing is None else f'{res.failing:g}'} "
                   f"{'user' if spec.kind == 'concurrency' and shown == [1] else unit}")
        print(f"{r.setting.name:<{width}}  {cap}  {bracket:<25} {len(res.probes):>6}  "
              f"{res.status}{_stopped_by(res)}{earlier}" + (f": {answer}" if answer else ""))


def _stopped_by(result: SearchResult) -> str:
    """Why a search that no load failed stopped where it did, when --max-load did not stop
    it: the trace's length (``SearchResult.load_cap``)."""
    cap = result.load_cap
    if result.status != "at_least_max" or cap is None:
        return ""
    from harness.metrics import SHORTEST_STEADY_E2ES

    return (f": the trace's length caps users at {cap.max_load:g} (one user per "
            f"{SHORTEST_STEADY_E2ES} of its requests), not --max-load")
