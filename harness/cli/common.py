"""What every subcommand shares: errors, trace options, the generated knob flags, SLOs, output.

Knob flags are generated from ``adapters.knobs`` (one definition): every subcommand that takes a
knob spells it the same way, and an unset knob stays unset (the engine's own default).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import re
import sys
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from adapters.knobs import REFERENCE, UNIFORM, KnobError, Knobs, KnobSpec, ReferenceKnobs

if TYPE_CHECKING:
    from pathlib import Path

    from adapters.reference.config import ReferenceConfig
    from harness.metrics import Slo
    from harness.traces import Trace, TraceOptions

EXIT_USAGE = 2
EXIT_FAILURE = 1


class UserError(Exception):
    """A problem with the user's input (file, field, knob): printed without a traceback."""


class HelpFormatter(argparse.HelpFormatter):
    """argparse's wrapping, without breaking a line at a hyphen: a path or flag in a help text
    or an example (``scenarios/batch-size.yaml``, ``--max-num-seqs``) stays whole, so that
    it can be copied."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width,
                             break_on_hyphens=False, break_long_words=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(self._whitespace_matcher.sub(" ", text).strip(), width,
                             initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False, break_long_words=False)


class RawDescriptionFormatter(HelpFormatter):
    """``HelpFormatter`` that keeps the description and epilog as written (their own line
    breaks: examples, lists), as argparse's RawDescriptionHelpFormatter does."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "".join(indent + line for line in text.splitlines(keepends=True))


class Parser(argparse.ArgumentParser):
    """No abbreviations (``--gpu`` must never be read as ``--gpu-memory-utilization``), and
    errors that never echo an option's value (it may be a secret)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {_without_values(message)}"
                  f"{self._did_you_mean(message)}\n")

    def _did_you_mean(self, message: str) -> str:
        """For an unrecognized option, the closest ones this parser and its commands know
        (abbreviations are refused, so a near miss is a likely typo)."""
        import difflib

        if not message.startswith("unrecognized arguments:"):
            return ""
        known = set(self._option_string_actions)
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    known.update(sub._option_string_actions)
        hints = []
        for arg in message.split(":", 1)[1].split():
            name = arg.split("=", 1)[0]
            if name.startswith("--"):
                close = difflib.get_close_matches(name, sorted(known), n=2, cutoff=0.8)
                if close:
                    hints.append(f"{name}: did you mean {' or '.join(close)}?")
        return "".join(f"\n{h}" for h in hints)


def _without_values(message: str) -> str:
    """argparse quotes offending values ("invalid int value: 'x'", "unrecognized arguments:
    a b"); keep the option names, drop the values."""
    if message.startswith("unrecognized arguments:"):
        extras = message.split(":", 1)[1].split()
        names = [a.split("=", 1)[0] for a in extras if a.startswith("-")]
        # a word right after an unknown flag is that flag's value; others stand alone
        alone = [a for i, a in enumerate(extras) if not a.startswith("-")
                 and not (i and extras[i - 1].startswith("-") and "=" not in extras[i - 1])]
        # a path to a file or folder is shown (no secret is one): a trace given without
        # --trace is the usual slip
        paths = [a for a in alone if os.path.exists(a)]
        values = len(alone) - len(paths)
        hidden = (f"{values} value{'s' if values != 1 else ''} not shown: a word where none "
                  "was expected (a flag that takes no value, such as --chunked-prefill or "
                  "--no-report, given one?)") if values else ""
        files = (f"{' '.join(paths)}: a path where none was expected (a trace is given as "
                 "--trace FILE)") if paths else ""
        return "unrecognized arguments: " + "; ".join(
            p for p in (" ".join(names), files, hidden) if p)
    message = re.sub(r"invalid (\S+) value: .*", r"invalid \1 value", message)
    return re.sub(r"invalid choice: .*? \(choose", "invalid choice (choose", message)


def add_subparser(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
                  **kwargs: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(name, allow_abbrev=False, **kwargs)
    return parser


# ---------------------------------------------------------------- knob flags (generated)

GPU_HELP = ("catalog GPU (h100-sxm, h100-pcie, h200, a100-80gb; default: the profile's device, "
            "else h100-sxm)")


def _add_knob(g: argparse._ArgumentGroup, spec: KnobSpec, existing: set[str]) -> None:
    if spec.flag in existing:  # e.g. --max-model-len, already a trace option with the same dest
        return
    flags = (spec.flag, *spec.aliases)
    help_text = f"{spec.help} (unset: the engine's own default)"
    if spec.kind == "bool":
        g.add_argument(*flags, dest=spec.name, action=argparse.BooleanOptionalAction,
                       default=None, help=help_text)
    elif spec.kind == "choice":
        g.add_argument(*flags, dest=spec.name, choices=spec.choices, default=None, help=help_text)
    elif spec.kind == "args":
        g.add_argument(*flags, dest=spec.name, action="append", default=[],
                       metavar=spec.metavar, help=spec.help)
    else:
        kind = {"int": int, "float": float, "path": str}[spec.kind]
        g.add_argument(*flags, dest=spec.name, type=kind, default=None, metavar=spec.metavar,
                       help=help_text)


def add_knob_flags(p: argparse.ArgumentParser, *, reference: bool = False,
                   launch_args: bool = True, only: Sequence[str] | None = None) -> None:
    """The uniform knobs as flags (and the reference-only section with ``reference``);
    ``only`` limits them to the knobs a command uses."""
    existing = set(p._option_string_actions)
    wanted = [spec for spec in UNIFORM
              if not (spec.kind == "args" and not launch_args)
              and (only is None or spec.name in only)]
    if any(spec.flag not in existing for spec in wanted):  # no empty second section
        g = p.add_argument_group(
            "uniform knobs", "the same flags for every engine; unset knobs keep the engine's "
            "own defaults (docs/engines.md)")
        for spec in wanted:
            _add_knob(g, spec, existing)
    if reference:
        r = p.add_argument_group("reference engine", "settings only the reference engine has")
        for spec in REFERENCE:
            _add_knob(r, spec, existing)


def knobs_from_args(args: argparse.Namespace) -> Knobs:
    """Uniform knobs from the flags that were given; the rest stay unset."""
    values: dict[str, object] = {}
    for spec in UNIFORM:
        value = getattr(args, spec.name, None)
        if value is not None and value != []:
            values[spec.name] = tuple(value) if isinstance(value, list) else value
    try:
        return Knobs.from_mapping(values, where=_CLI)
    except KnobError as exc:
        raise UserError(as_flags(str(exc))) from None


def reference_knobs_from_args(args: argparse.Namespace) -> ReferenceKnobs:
    values = {s.name: getattr(args, s.name, None) for s in REFERENCE}
    try:
        return ReferenceKnobs.from_mapping(values, where=_CLI)
    except KnobError as exc:
        raise UserError(as_flags(str(exc))) from None


_CLI = "command line"


def as_flags(message: str) -> str:
    """A knob error about the command line names the flag (``--max-num-seqs``), not the
    knob's field (``command line.max_num_seqs``)."""
    return re.sub(rf"{_CLI}\.(\w+)", lambda m: "--" + m.group(1).replace("_", "-"), message)


PROMPT_SALT_HELP = (
    "mix a salt into every prompt: auto = a fresh one for this run (recorded in the manifest), "
    "TEXT = that salt (to repeat a salted run), none = no salt (default: the same prompts run "
    "after run). A server that caches prompts (llama.cpp by default, vLLM with prefix caching) "
    "answers repeated prompts from its cache")


OVERWRITE_HELP = ("replace the run in --out when it is another run's (different kind, trace, "
                  "engine or target); without it such a folder is refused")


def add_gpu_option(g: argparse._ArgumentGroup | argparse.ArgumentParser,
                   help_text: str = GPU_HELP) -> None:
    g.add_argument("--gpu", metavar="NAME", default=None, help=help_text)


def command_line() -> list[str]:
    return ["batchlab", *sys.argv[1:]]


# ---------------------------------------------------------------- trace options


def add_trace_options(p: argparse.ArgumentParser) -> None:
    """Trace options shared by simulate, replay, validate and trace info (docs/traces.md)."""
    from harness.traces.names import ARRIVALS, FORMATS, ON_TOO_LONG

    g = p.add_argument_group(
        "trace", "which requests to send and when; see docs/traces.md for the order they apply in"
    )
    g.add_argument(
        "--trace", metavar="FILE",
        help="trace file: Azure 2023 CSV, Mooncake JSONL (or .jsonl.gz), BurstGPT CSV, Vidur "
        "CSV, length-only CSV (ShareGPT/arXiv stats); or 'synthetic' (also synthetic:poisson, "
        "synthetic:gamma, synthetic:constant) for generated requests",
    )
    g.add_argument("--format", choices=FORMATS,
                   help="trace format; default: detected from the extension and header")
    g.add_argument("--limit", type=int, metavar="N",
                   help="keep only the first N requests (after the window; after requests "
                   "over --max-model-len are dropped, before they are clipped or refused)")
    g.add_argument("--start-s", type=float, metavar="S",
                   help="window start in trace seconds; arrivals are then measured from S")
    g.add_argument("--end-s", type=float, metavar="S",
                   help="window end in trace seconds (requests arriving before S are kept)")
    g.add_argument("--time-scale", type=float, metavar="X",
                   help="multiply every trace arrival time by X (0.5 = twice as fast)")
    g.add_argument("--rate", type=float, metavar="R",
                   help="mean rate in requests/s: rescales trace times, or sets the rate of "
                   "synthetic arrivals (required for length-only and synthetic traces); "
                   "inf sends everything at 0 s")
    g.add_argument("--arrival", choices=ARRIVALS,
                   help="synthesize arrivals instead of using trace times (default for "
                   "length-only and synthetic traces: poisson)")
    g.add_argument("--burstiness", type=float, metavar="B",
                   help="gamma shape of synthetic inter-arrival gaps, as in vLLM bench: 1 = "
                   "Poisson, <1 burstier, >1 smoother, inf = constant; implies --arrival gamma")
    g.add_argument("--num-requests", type=int, metavar="N",
                   help="number of requests of a synthetic trace")
    g.add_argument("--lengths-from", metavar="FILE",
                   help="synthetic trace: sample (prompt, output) lengths from this trace file")
    g.add_argument("--prompt-tokens", type=int, metavar="N",
                   help="give every request N prompt tokens (overrides the trace)")
    g.add_argument("--output-tokens", type=int, metavar="N",
                   help="give every request N output tokens (overrides the trace)")
    g.add_argument("--max-model-len", type=int, metavar="N",
                   help="context length: prompt + output must fit in N tokens (also the engine's "
                   "max model length); see --on-too-long")
    g.add_argument("--on-too-long", choices=ON_TOO_LONG, default="error",
                   help="requests longer than --max-model-len: error (default), drop them, or "
                   "clip them (the prompt truncated from the left first); the count is "
                   "reported. drop and clip need --max-model-len, except on the simulated "
                   "reference engine (simulate, capacity), where its own max model length is "
                   "the default")
    g.add_argument("--priority-fraction", type=float, metavar="F",
                   help="a seeded random fraction F of requests gets priority 0 (high), the "
                   "rest 1; a 'priority' column in the trace wins")
    g.add_argument("--seed", type=int, default=0,
                   help="seed for synthetic arrivals, sampled lengths and priorities (0)")
    g.add_argument("--skip-bad-rows", action="store_true",
                   help="skip malformed trace rows (and report how many) instead of failing")


def trace_options(args: argparse.Namespace, *, engine_max_model_len: int | None = None
                  ) -> TraceOptions:
    """The trace options the flags give. ``engine_max_model_len``: the simulated engine's
    max model length, the one ``--on-too-long drop|clip`` applies when ``--max-model-len`` is
    not given (a live engine's is not known: the flag is then required)."""
    from harness.traces import TraceError, TraceOptions

    max_model_len = args.max_model_len
    if max_model_len is None and args.on_too_long != "error":
        max_model_len = engine_max_model_len
    try:
        return TraceOptions(
            format=args.format,
            limit=args.limit,
            start_s=args.start_s,
            end_s=args.end_s,
            time_scale=args.time_scale,
            rate=args.rate,
            arrival=args.arrival,
            burstiness=args.burstiness,
            num_requests=args.num_requests,
            lengths_from=args.lengths_from,
            prompt_tokens=args.prompt_tokens,
            output_tokens=args.output_tokens,
            max_model_len=max_model_len,
            on_too_long=args.on_too_long,
            priority_fraction=args.priority_fraction,
            seed=args.seed,
            skip_bad_rows=args.skip_bad_rows,
        )
    except TraceError as exc:
        raise UserError(str(exc)) from None


def load_trace(args: argparse.Namespace, *, engine_max_model_len: int | None = None) -> Trace:
    """The trace the flags name (``trace_options``)."""
    from harness.traces import TraceError, load_trace

    if not args.trace and args.format != "synthetic":
        raise UserError("--trace is required: a trace file, or 'synthetic'")
    options = trace_options(args, engine_max_model_len=engine_max_model_len)
    closed = getattr(args, "mode", None) == "closed"
    if closed:
        timing = [flag for flag, value in (("--rate", args.rate), ("--time-scale", args.time_scale))
                  if value is not None]
        if timing:
            print(f"note: {', '.join(timing)}: no effect with --mode closed (each user sends "
                  "its next request when its last one ends; arrival times are not used)",
                  file=sys.stderr)
    try:
        return load_trace(args.trace, options)
    except TraceError as exc:
        if closed and options.rate is None:
            # a trace without timestamps needs no rate for a closed loop: any will do
            with contextlib.suppress(TraceError):
                return load_trace(args.trace, dataclasses.replace(options, rate=math.inf))
        raise UserError(str(exc)) from None


# ---------------------------------------------------------------- SLOs and output


def parse_slo(text: str | None) -> Slo | None:
    from harness.metrics import Slo

    if not text:
        return None
    try:
        return Slo.parse(text)
    except ValueError as exc:
        raise UserError(str(exc)) from None


class Progress:
    """A tqdm bar on a terminal, silence elsewhere; ``update_to(done, total)``."""

    def __init__(self, total: int, desc: str) -> None:
        self._bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit="req", leave=False)

    def update_to(self, done: int, total: int) -> None:
        if self._bar is not None:
            self._bar.total = total
            self._bar.n = done
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def refuse_cell(out: Path) -> None:
    """``runfolder.refuse_cell_folder`` as a command-line error."""
    from harness.runfolder import RunDirError, refuse_cell_folder

    try:
        refuse_cell_folder(out)
    except RunDirError as exc:
        raise UserError(str(exc)) from None


def in_writing(folder: Path, who: str, what: str) -> str:
    """The refusal of ``what`` ("a report", "a summary") of ``folder`` while ``who`` (another
    batchlab process) writes it: there is nothing to do but wait, so it says to wait."""
    return (f"{folder}: is being written by {who}; {what} of it now would mix its old and "
            "new results: wait for it to end (it writes its own summary.json and report.md)")


def refuse_in_writing(folders: Sequence[Path], what: str) -> None:
    """UserError (``in_writing``) when another process writes one of ``folders`` now: its
    files would be read from different moments, or last night's beside tonight's."""
    from harness.runfolder import writer_of

    for folder in folders:
        who = writer_of(folder)
        if who is not None:
            raise UserError(in_writing(folder, who, what))


@contextlib.contextmanager
def holding_folder(folder: Path, what: str) -> Iterator[None]:
    """Refuse ``folder`` when another process writes it (``refuse_in_writing``), else hold it
    as a run does (``runfolder.holding_dir``) while the block rewrites files in it: no run or
    sweep starts writing it halfway. Only the taking is a UserError, never what the block
    raises."""
    from harness.runfolder import FolderHeldError, RunDirError, holding_dir

    refuse_in_writing([folder], what)
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(holding_dir(folder, what="folder"))
        except FolderHeldError as exc:  # taken since it was looked at: the same words
            raise UserError(in_writing(folder, exc.holder, what)) from None
        except RunDirError as exc:
            raise UserError(str(exc)) from None
        yield


def progress_bar(total: int, desc: str) -> Progress:
    return Progress(total, desc)


def fmt_s(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def print_headline(summary: dict[str, Any]) -> None:
    """The run's figures in one line, marked "predicted:" when they are (its summary's
    ``prediction``: a simulated run, or the reference engine served), so that the first line
    alone says so; then the SLO attainment."""
    from harness.metrics import sig  # as the report writes it

    tp = summary["throughput"]
    print(
        ("predicted: " if summary.get("prediction") else "")
        + f"{summary['num_completed']}/{summary['num_requests']} requests completed in "
        f"{summary['duration_s']:.1f} s; {sig(tp['output_tokens_per_s'])} output tok/s; "
        f"TTFT p50 {fmt_s(summary['ttft_s']['p50'])} p99 {fmt_s(summary['ttft_s']['p99'])}; "
        f"TPOT p50 {fmt_s(summary['tpot_s']['p50'])} p99 {fmt_s(summary['tpot_s']['p99'])}; "
        + (f"{summary['num_preemptions']} preemptions" if summary.get("num_preemptions")
           is not None else "preemptions "
           + str(summary.get("preemptions_from") or "not known").split(" (")[0])
    )
    goodput = summary.get("goodput") or {}
    if goodput.get("slo_attainment") is not None:
        from harness.metrics import attainment_text

        slo = ", ".join(f"{k.removesuffix('_s').upper()} <= {fmt_s(v)}"
                        for k, v in (summary.get("slo") or {}).items() if v is not None)
        print(f"SLO ({slo}): {attainment_text(goodput['slo_attainment'])} of requests met "
              f"it; goodput {goodput.get('requests_per_s') or 0:.3g} req/s")


def print_predicted(config: ReferenceConfig, *, names: Sequence[str] = (),
                    headline: bool = False) -> None:
    """Say that the figures printed are predictions, by which engine model, and how accurate
    that kind of prediction was measured to be (the report's "Predicted" row, in plain text).
    ``names``: the settings it applies to, when not all. ``headline``: under
    ``print_headline``'s figures, whose tails, preemptions and SLO attainment no published
    figure measured (``headline_caveat``)."""
    from adapters.reference.prediction import prediction_record
    from harness.prediction import SIMULATED

    whose = f"{', '.join(names)}: " if names else "figures above: "
    _print_prediction(whose, prediction_record(config), SIMULATED, headline=headline)


def _print_prediction(whose: str, record: object, by: str, *, headline: bool) -> None:
    from harness.prediction import headline_caveat, prediction_text

    caveat = headline_caveat(record) if headline else None
    lines = prediction_lines(whose + prediction_text(record, by=by))
    print("\n".join([*lines, *([f"  {caveat}"] if caveat is not None else [])]), flush=True)


BY_KIND = "by kind of figure: "


def prediction_lines(text: str) -> list[str]:
    """``prediction_text`` laid out for a terminal: the report's one sentence, a clause per
    line. The first line says what predicted the figures; each clause after a top-level "; "
    is indented under it, and the errors by kind of figure one per line::

        figures above: predicted by the reference engine with profile vllm-h100-sxm
          on 8 published figures its fit never saw, it missed by a median 23.4% (...)
          by kind of figure:
            throughput 16.4% (worst 404.6%) of 133 from 8 sources (116 of 133 predicted high)
            TTFT 31.9% (worst 58.0%) of 29 from 3 sources (28 of 29 predicted low)

    Nothing is reworded: joined back with "; " (and ", "), the lines are the sentence."""
    first, *rest = _top_level_split(text, "; ")
    lines = [first]
    for clause in rest:
        if clause.startswith(BY_KIND):
            lines.append("  " + BY_KIND.rstrip())
            lines.extend("    " + part
                         for part in _top_level_split(clause[len(BY_KIND):], ", "))
        else:
            lines.append("  " + clause)
    return lines


def _top_level_split(text: str, sep: str) -> list[str]:
    """``text`` split at each ``sep`` outside parentheses."""
    parts: list[str] = []
    depth = start = 0
    i = 0
    while i < len(text):
        char = text[i]
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(depth - 1, 0)
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            start = i + len(sep)
            i = start
            continue
        i += 1
    parts.append(text[start:])
    return parts


def print_failures(summary: dict[str, Any], run_dir: str | None = None) -> None:
    """The failures by kind, and the first failed request's own words (nothing if none)."""
    if summary.get("failures"):
        print("failures: " + ", ".join(f"{k} {v}" for k, v in summary["failures"].items()))
        first = first_error_line(run_dir) if run_dir is not None else None
        if first:
            print(f"first error: {first}")


def print_behind(run_dir: str) -> None:
    """Warn when the engine fell behind the run's arrivals (``harness.results.run_pace``), in
    the words a scenario cell's warning has (``fell_behind_warning``: a predicted run says
    what predicted it)."""
    from pathlib import Path

    from harness.behind import fell_behind_warning

    warning = fell_behind_warning(Path(run_dir))
    if warning:
        print(f"warning: {warning}", file=sys.stderr)


def print_live_headline(summary: dict[str, Any], run_dir: str | None = None) -> None:
    print_headline(summary)
    print_failures(summary, run_dir)
    completed = summary.get("num_completed") or 0
    fidelity = summary.get("output_length_fidelity") or {}
    reached = fidelity.get("num_reached_target")
    if completed and reached is not None and reached < completed:
        none = " (none returned a single token)" if not summary.get("num_output_tokens") else ""
        print(f"warning: {completed - reached} of {completed} completed requests returned fewer "
              f"output tokens than the trace asks{none}: the server stopped them early, so "
              "tokens/s and TPOT do not compare token for token", file=sys.stderr)
    # more tokens than asked, by the server's own count (it ignored max_tokens) or only as
    # the client counted them (which can count more than were generated)
    for key, counted, meaning in (
            ("num_over_target", "(by the server's own count)",
             "the server did not honour max_tokens, so tokens/s counts tokens the trace never "
             "asked for and does not compare token for token"),
            ("num_over_target_client_counted",
             "as the client counted them (the server gave no count: the --tokenizer on the "
             "text, or one token per event, which can count more than were generated)",
             "check that the server honours max_tokens")):
        over = fidelity.get(key) or 0
        if completed and over:
            print(f"warning: {over} of {completed} completed requests returned more output "
                  f"tokens than the trace asks {counted}: {meaning}", file=sys.stderr)
    lag = summary.get("send_lag_s") or {}
    if summary.get("client_limited"):
        print(f"warning: client-limited run: send-lag p99 {fmt_s(lag.get('p99'))} exceeds "
              f"{fmt_s(summary.get('client_lag_threshold_s'))}; the client, not the server, "
              "may have set these figures", file=sys.stderr)
    if run_dir is not None:
        print_behind(run_dir)
        print_run_prediction(run_dir)


def print_run_prediction(run_dir: str) -> None:
    """A run folder whose figures are predictions (simulated, or the reference engine served
    over HTTP: its ``/version`` answer, kept in the manifest, carries a prediction record),
    said as ``simulate`` says them; nothing for a run measured on a real engine."""
    from pathlib import Path

    from harness.manifest import read_manifest
    from harness.prediction import recorded_prediction

    found = recorded_prediction(read_manifest(Path(run_dir)).get("engine"))
    if found is not None:
        _print_prediction("figures above: ", found[0], found[1], headline=True)



def first_error_line(run_dir: str) -> str | None:
    """The earliest failed request of a run folder, with the engine's own words
    (``harness.results.first_error``)."""
    from pathlib import Path

    from harness.results import first_error

    return first_error(Path(run_dir))


def fraction(text: str) -> float:
    """An argparse type: a fraction in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {text!r}")
    return value


MAX_FAILED_HELP = ("exit with status 1 when more than this fraction of the requests sent "
                   "failed, e.g. 0.01 for a nightly job (default: only when none succeeded); "
                   "the results are kept either way")


def too_many_failed(summary: Mapping[str, Any], max_failed: float | None) -> str | None:
    """Why a run failed ``--max-failed`` (more than that fraction of the requests it sent
    failed), in words; None when it did not, or no limit was given."""
    sent = summary.get("num_requests") or 0
    failed = summary.get("num_failed") or 0
    if max_failed is None or not sent or failed / sent <= max_failed:
        return None
    return (f"{failed} of {sent} requests failed ({failed / sent:.1%}), more than "
            f"--max-failed {max_failed:g} (failures: {summary.get('failures') or {}})")
