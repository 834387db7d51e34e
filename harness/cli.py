"""The ``batchlab`` command line: every subcommand is parsed here, and only here.

Each subcommand has an ``_add_<name>`` (arguments) and a ``_cmd_<name>`` (action) function;
actions turn arguments into the frozen configuration records of the module that does the work.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from adapters.reference import ReferenceConfig
    from harness.metrics import Slo
    from harness.traces import Trace, TraceOptions

EXIT_USAGE = 2
EXIT_FAILURE = 1


class UserError(Exception):
    """A problem with the user's input (file, field, knob): printed without a traceback."""


# ---------------------------------------------------------------- trace options (shared)


def _add_trace_options(p: argparse.ArgumentParser) -> None:
    """Trace options shared by simulate, replay, validate and trace info (docs/traces.md)."""
    from harness.traces import ARRIVALS, FORMATS, ON_TOO_LONG

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
                   help="keep only the first N requests (after the window and --max-model-len)")
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
                   "clip them (prompt truncated first); the count is reported")
    g.add_argument("--priority-fraction", type=float, metavar="F",
                   help="a seeded random fraction F of requests gets priority 0 (high), the "
                   "rest 1; a 'priority' column in the trace wins")
    g.add_argument("--seed", type=int, default=0,
                   help="seed for synthetic arrivals, sampled lengths and priorities (0)")
    g.add_argument("--skip-bad-rows", action="store_true",
                   help="skip malformed trace rows (and report how many) instead of failing")


def _trace_options(args: argparse.Namespace) -> TraceOptions:
    from harness.traces import TraceError, TraceOptions

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
            max_model_len=args.max_model_len,
            on_too_long=args.on_too_long,
            priority_fraction=args.priority_fraction,
            seed=args.seed,
            skip_bad_rows=args.skip_bad_rows,
        )
    except TraceError as exc:
        raise UserError(str(exc)) from None


def _load_trace(args: argparse.Namespace) -> Trace:
    from harness.traces import TraceError, load_trace

    if not args.trace and args.format != "synthetic":
        raise UserError("--trace is required: a trace file, or 'synthetic'")
    options = _trace_options(args)
    try:
        return load_trace(args.trace, options)
    except TraceError as exc:
        raise UserError(str(exc)) from None


# ---------------------------------------------------------------- trace info


def _add_trace(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "trace",
        help="inspect a trace (batchlab trace info)",
        description="Inspect traces.",
    )
    trace_sub = p.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
    info = trace_sub.add_parser(
        "info",
        help="load a trace with the given options and print its summary",
        description="Load a trace exactly as simulate/replay would (same options) and print its\n"
        "request count, span, mean rate, prompt/output length statistics and what the\n"
        "options dropped, clipped or skipped.",
        epilog="examples:\n"
        "  batchlab trace info --trace harness/data/azure_conv_excerpt.csv\n"
        "  batchlab trace info --trace harness/data/sharegpt_lengths_excerpt.csv --rate 4\n"
        "  batchlab trace info --trace synthetic --num-requests 1000 --rate 2 "
        "--burstiness 0.5 --prompt-tokens 512 --output-tokens 128",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_trace_options(info)
    info.add_argument("--json", action="store_true", help="print the summary as JSON")


def _cmd_trace(args: argparse.Namespace) -> int:
    import json

    from harness.traces import describe

    d = describe(_load_trace(args))
    if args.json:
        print(json.dumps(d, indent=2, sort_keys=True))
        return 0

    def num(value: float | None, digits: int = 0) -> str:
        return "n/a" if value is None else f"{value:,.{digits}f}"

    print(f"trace     {d['source']} ({d['format']})")
    print(f"digest    {d['digest']}")
    print(f"requests  {d['num_requests']:,} over {num(d['span_s'], 1)} s; mean rate "
          f"{num(d['mean_rate_per_s'], 2)} req/s; inter-arrival CV {num(d['interarrival_cv'], 2)}")
    for label, name in (("prompt", "prompt_tokens"), ("output", "output_tokens")):
        print(f"{label:<10}tokens mean {num(d[name + '_mean'], 1)}, p50 {num(d[name + '_p50'])}, "
              f"p99 {num(d[name + '_p99'])}, max {num(d[name + '_max'])}")
    if d["num_with_priority"]:
        print(f"priority  {d['num_high_priority']:,} of {d['num_with_priority']:,} at 0 (high)")
    if d["num_with_prefix_hashes"]:
        print(f"prefixes  {d['num_with_prefix_hashes']:,} requests carry prefix-block hashes")
    counts = ", ".join(f"{k} {v:,}" for k, v in d["counts"].items() if v)
    print(f"counts    {counts}")
    for note in d["notes"]:
        print(f"note      {note}")
    return 0


# ---------------------------------------------------------------- simulate


def _add_engine_config_options(p: argparse.ArgumentParser) -> None:
    """The reference engine's options, shared by simulate and serve reference."""
    g = p.add_argument_group("reference engine")
    g.add_argument("--model", default="llama-3.1-8b",
                   help="catalog model name or a local HF config.json path (default llama-3.1-8b)")
    g.add_argument("--gpu", default="h100-sxm", help="catalog GPU (default h100-sxm)")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    g.add_argument("--profile", help="cost-model profile JSON (from `batchlab calibrate`)")
    g.add_argument("--policy", choices=("fcfs", "priority", "static"), default="fcfs",
                   help="scheduling policy (default fcfs)")
    g.add_argument("--admission", choices=("optimistic", "reserve"), default="optimistic",
                   help="optimistic: allocate KV as tokens grow, preempt when full (vLLM); "
                        "reserve: reserve prompt+max output at admission, never preempt "
                        "(TGI, TRT-LLM GUARANTEED_NO_EVICT)")
    g.add_argument("--preemption", choices=("recompute", "swap"), default="recompute",
                   help="what optimistic admission does when KV runs out (default recompute)")
    g.add_argument("--max-num-seqs", type=int, default=256, help="max running requests (256)")
    g.add_argument("--max-num-batched-tokens", type=int, default=8192,
                   help="max tokens scheduled in one step (8192)")
    g.add_argument("--chunked-prefill", action=argparse.BooleanOptionalAction, default=True,
                   help="cut prefills into chunks that fill the step's token budget (default on)")
    g.add_argument("--weights-dtype", choices=("bf16", "fp8"), default="bf16")
    g.add_argument("--kv-cache-dtype", choices=("bf16", "fp8"), default="bf16")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of GPU memory the engine may use (0.9)")
    g.add_argument("--num-gpu-blocks", type=int, help="override the number of KV blocks")
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV block (16)")
    g.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=False,
                   help="reuse KV blocks of shared prompt prefixes (default off)")


def _reference_config(args: argparse.Namespace) -> ReferenceConfig:
    from adapters.reference import ReferenceConfig

    try:
        return ReferenceConfig(
            model=args.model,
            gpu=args.gpu,
            tp=args.tp,
            policy=args.policy,
            admission=args.admission,
            preemption=args.preemption,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            chunked_prefill=args.chunked_prefill,
            block_size=args.block_size,
            num_gpu_blocks=args.num_gpu_blocks,
            gpu_memory_utilization=args.gpu_memory_utilization,
            weights_dtype=args.weights_dtype,
            kv_cache_dtype=args.kv_cache_dtype,
            max_model_len=args.max_model_len,
            prefix_caching=args.prefix_caching,
            profile=args.profile,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _parse_slo(text: str | None) -> Slo | None:
    from harness.metrics import Slo

    if not text:
        return None
    try:
        return Slo.parse(text)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _add_simulate(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "simulate",
        help="run a trace through the reference engine on a virtual clock",
        description="Simulate a trace on the reference continuous-batching engine (cost model of "
        "a catalog GPU) and write requests.parquet, steps.parquet, summary.json and report.md.",
        epilog="example: batchlab simulate --trace harness/data/azure_conv_excerpt.csv "
        "--model llama-3.1-8b --gpu h100-sxm --policy fcfs --out reports/sim",
    )
    _add_trace_options(p)
    _add_engine_config_options(p)
    p.add_argument("--slo", help="SLOs for goodput, e.g. ttft_s=0.5,tpot_s=0.05,e2e_s=20")
    p.add_argument("--out", default="reports/simulate", help="run folder (reports/simulate)")


def _cmd_simulate(args: argparse.Namespace) -> int:
    from harness.simulate import run_simulation

    trace = _load_trace(args)
    config = _reference_config(args)
    slo = _parse_slo(args.slo)
    out = Path(args.out)
    bar = _progress_bar(len(trace.requests), "simulate")
    try:
        summary = run_simulation(trace, config, out, slo=slo, progress=bar.update_to,
                                 command=["batchlab", *sys.argv[1:]])
    except ValueError as exc:
        raise UserError(str(exc)) from None
    finally:
        bar.close()
    _print_headline(summary)
    print(f"results: {out}/ (report: {out / 'report.md'})")
    return 0


class _Progress:
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


def _progress_bar(total: int, desc: str) -> _Progress:
    return _Progress(total, desc)


def _fmt_s(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _print_headline(summary: dict) -> None:  # type: ignore[type-arg]
    tp = summary["throughput"]
    print(
        f"{summary['num_completed']}/{summary['num_requests']} requests completed in "
        f"{summary['duration_s']:.1f} s; {tp['output_tokens_per_s']:.0f} output tok/s; "
        f"TTFT p50 {_fmt_s(summary['ttft_s']['p50'])} p99 {_fmt_s(summary['ttft_s']['p99'])}; "
        f"TPOT p50 {_fmt_s(summary['tpot_s']['p50'])} p99 {_fmt_s(summary['tpot_s']['p99'])}; "
        f"{summary['num_preemptions']} preemptions"
    )


# ---------------------------------------------------------------- run (scenarios) and report


def _add_run(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "run",
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
                   help="skip cells that finished earlier; redo missing, failed or interrupted ones")
    p.add_argument("--trace", metavar="FILE",
                   help="use this trace file instead of the scenario's (its options still apply), "
                   "e.g. a full trace from $BATCHLAB_TRACES_DIR")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run cells as Ray tasks (live cells ask for their tensor_parallel_size "
                   "GPUs); without ADDRESS, start or join a local Ray")
    p.add_argument("--list", action="store_true", help="print the cells and exit")


def _cmd_run(args: argparse.Namespace) -> int:
    from harness.scenario import ScenarioError, load_scenario, run_scenario, select

    try:
        scenario = load_scenario(args.scenario, trace_path=args.trace)
        if args.list:
            for cell in select(scenario.cells(), args.only):
                print(f"{cell.name}\t{cell.engine.engine} ({cell.engine.mode})\t"
                      f"{cell.load.describe()}")
            return 0
        result = run_scenario(scenario, args.out, only=args.only, resume=args.resume,
                              use_ray=args.ray is not None, ray_address=args.ray or None)
    except ScenarioError as exc:
        raise UserError(str(exc)) from None
    for outcome in result.outcomes:
        if outcome.state == "failed":
            print(f"cell {outcome.name} failed: {outcome.reason}", file=sys.stderr)
    print(f"report: {result.report}")
    return EXIT_FAILURE if result.num_failed else 0


def _add_report(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "report",
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
                   help="report file (default: DIR/report.md for one folder, "
                   "reports/comparison/report.md for several)")


def _cmd_report(args: argparse.Namespace) -> int:
    from harness import report

    dirs = [Path(d) for d in args.dirs]
    for d in dirs:
        if not d.is_dir():
            raise UserError(f"{d}: no such folder")
    try:
        if len(dirs) == 1 and (dirs[0] / report.SCENARIO_FILE).exists():
            out = report.render_scenario_report(
                dirs[0], out_file=Path(args.output) if args.output else None,
                baseline=args.baseline)
        elif len(dirs) == 1 and not args.output and not args.baseline:
            out = report.render_run_report(dirs[0])
        else:
            out = report.render_comparison(
                dirs, Path(args.output or "reports/comparison/report.md"),
                baseline=args.baseline)
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from None
    print(f"report: {out}")
    return 0


# ---------------------------------------------------------------- main


Command = Callable[[argparse.Namespace], int]


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Command]]:
    parser = argparse.ArgumentParser(
        prog="batchlab",
        description="Replay real LLM traffic against continuous-batching engines and compare them.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands: dict[str, Command] = {}
    _add_simulate(sub)
    commands["simulate"] = _cmd_simulate
    _add_trace(sub)
    commands["trace"] = _cmd_trace
    _add_run(sub)
    commands["run"] = _cmd_run
    _add_report(sub)
    commands["report"] = _cmd_report
    return parser, commands


def main(argv: Sequence[str] | None = None) -> int:
    parser, commands = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return EXIT_USAGE
    try:
        return commands[args.command](args)
    except UserError as exc:
        print(f"batchlab {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"batchlab {args.command}: interrupted; results measured so far are on disk",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
