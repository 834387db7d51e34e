"""Commands that need no live engine: ``trace info``, ``simulate``, ``costmodel``, ``serve``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from harness.cli.common import (
    EXIT_FAILURE,
    MAX_FAILED_HELP,
    OVERWRITE_HELP,
    Parser,
    RawDescriptionFormatter,
    UserError,
    add_gpu_option,
    add_knob_flags,
    add_subparser,
    add_trace_options,
    command_line,
    fraction,
    knobs_from_args,
    load_trace,
    parse_slo,
    print_behind,
    print_failures,
    print_headline,
    print_predicted,
    progress_bar,
    reference_knobs_from_args,
    refuse_cell,
    too_many_failed,
)

# The engine, numpy and pyarrow are loaded by the commands that need them, not with this
# module: `simulate` starts its report process first, so that the report code loads beside
# them (cmd_simulate).
if TYPE_CHECKING:
    from adapters.reference import ReferenceConfig
    from harness.sim.report_process import ReportProcess
    from harness.target import ClosedLoop, TargetSpec

COSTMODEL_KNOBS = ("tensor_parallel_size", "weights_dtype", "kv_cache_dtype",
                   "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens")


def add_profile_option(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--profile", metavar="NAME_OR_PATH",
                   help="cost-model profile: a shipped engine profile name (batchlab profiles) "
                   "or a profile JSON from `batchlab calibrate`")


def add_reference_options(p: argparse.ArgumentParser) -> None:
    """The simulated reference engine: model, GPU, profile, knobs and its own section."""
    g = p.add_argument_group("reference engine")
    g.add_argument("--model", default="llama-3.1-8b",
                   help="catalog model name or a local HF config.json path (default llama-3.1-8b)")
    add_gpu_option(g)
    add_profile_option(g)
    add_knob_flags(p, reference=True, launch_args=False)


def reference_spec(args: argparse.Namespace) -> TargetSpec:
    from harness.target import TargetSpec

    return TargetSpec("reference", "simulate", knobs=knobs_from_args(args),
                      reference=reference_knobs_from_args(args), model=args.model, gpu=args.gpu,
                      profile=getattr(args, "profile", None))


def reference_config(args: argparse.Namespace) -> ReferenceConfig:
    """The one route from command-line knobs to the reference (``SimulatedTarget.config``)."""
    from harness.sim.target import SimulatedTarget  # not harness.targets: no live client

    try:
        return SimulatedTarget(reference_spec(args)).config()
    except ValueError as exc:
        raise UserError(str(exc)) from None


# How the notes that describe a trace's arrivals begin (``harness.traces.options``): where a
# run sets the arrivals itself (a closed loop, a capacity probe's load), they do not apply.
ARRIVAL_NOTES = ("arrival times multiplied by", "arrivals synthesized:", "rate inf:")


def print_trace_notes(notes: Sequence[str], *, arrivals: bool = True, of: str = "") -> None:
    """What loading did to the trace (``Trace.notes``: requests dropped, clipped, rows skipped),
    one ``note:`` line each on stdout, next to the figures they qualify, as ``trace info``
    prints them. ``arrivals=False``: without the notes on arrival times (``ARRIVAL_NOTES``).
    ``of``: what each line names before its note (the settings whose trace it is)."""
    for note in notes:
        if arrivals or not note.startswith(ARRIVAL_NOTES):
            print(f"note: {of}{note}", flush=True)


# ---------------------------------------------------------------- trace info


def add_trace(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subparser(
        sub, "trace",
        help="inspect a trace (batchlab trace info)",
        description="Inspect traces.",
    )
    trace_sub = p.add_subparsers(dest="trace_command", metavar="ACTION", required=True,
                                 parser_class=Parser)
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
        formatter_class=RawDescriptionFormatter,
    )
    add_trace_options(info)
    info.add_argument("--json", action="store_true", help="print the summary as JSON")


def cmd_trace(args: argparse.Namespace) -> int:
    import json

    from harness.traces import arrivals_text, describe

    untimed = False
    try:
        trace = load_trace(args)
    except UserError as exc:
        if args.rate is not None or "has no timestamps" not in str(exc):
            raise
        # lengths only (ShareGPT, arXiv excerpts): describe them; arrivals need --rate
        untimed = True
        trace = load_trace(argparse.Namespace(**{**vars(args), "rate": 1.0}))
    d = describe(trace)
    if untimed:
        d.update(span_s=None, mean_rate_per_s=None, interarrival_cv=None, digest=None,
                 notes=[n for n in d["notes"] if not n.startswith("arrivals synthesized")]
                 + ["no timestamps: lengths only (--rate R gives it poisson arrivals)"])
    if args.json:
        print(json.dumps(d, indent=2, sort_keys=True))
        return 0

    def num(value: float | None, digits: int = 0) -> str:
        return "n/a" if value is None else f"{value:,.{digits}f}"

    print(f"trace     {d['source']} ({d['format']})")
    print(f"digest    {d['digest'] or '– (of the trace with its arrivals: give --rate)'}")
    if untimed:
        print(f"requests  {d['num_requests']:,} (no timestamps)")
    else:
        print(f"requests  {d['num_requests']:,} {arrivals_text(trace)}")
    for label, name in (("prompt", "prompt_tokens"), ("output", "output_tokens")):
        print(f"{label:<10}tokens mean {num(d[name + '_mean'], 1)}, p50 {num(d[name + '_p50'])}, "
              f"p99 {num(d[name + '_p99'])}, max {num(d[name + '_max'])}")
    if d["num_with_priority"]:
        unset = d["num_requests"] - d["num_with_priority"]
        line = f"{d['num_high_priority']:,} of {d['num_with_priority']:,} set to 0 (high)"
        if unset:  # a run puts them in class 0 (docs/metrics.md): say so, and the class's size
            line += (f"; {unset:,} set none and run as class 0, which holds "
                     f"{d['num_high_priority'] + unset:,} in all")
        print(f"priority  {line}")
    if d["num_with_prefix_hashes"]:
        print(f"prefixes  {d['num_with_prefix_hashes']:,} requests carry prefix-block hashes")
    counts = ", ".join(f"{k} {v:,}" for k, v in d["counts"].items() if v)
    print(f"counts    {counts}")
    for note in d["notes"]:
        print(f"note      {note}")
    return 0


# ---------------------------------------------------------------- simulate


def add_simulate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subparser(
        sub, "simulate",
        help="run a trace through the reference engine on a virtual clock",
        description="Simulate a trace on the reference continuous-batching engine (cost model of "
        "a catalog GPU) and write requests.parquet, steps.parquet, summary.json and report.md.",
        epilog="example: batchlab simulate --trace harness/data/azure_conv_excerpt.csv "
        "--model llama-3.1-8b --gpu h100-sxm --policy fcfs --out reports/sim",
    )
    add_trace_options(p)
    add_reference_options(p)
    p.add_argument("--slo", help="SLOs for goodput, e.g. ttft_s=0.5,tpot_s=0.05,e2e_s=20")
    add_load_mode_options(p)
    p.add_argument("--out", default="reports/simulate", help="run folder (reports/simulate)")
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    p.add_argument("--max-failed", type=fraction, default=None, metavar="F",
                   help=MAX_FAILED_HELP)
    p.add_argument("--no-report", action="store_true",
                   help="skip report.md and its plots (about a second; `batchlab report DIR` "
                   "writes them later from the folder)")


def add_load_mode_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("load")
    g.add_argument("--mode", choices=("open", "closed"), default="open",
                   help="open: requests arrive at the trace's times (default); closed: "
                   "--concurrency users, each sending the trace's next request when its last "
                   "one ends (as replay --mode closed)")
    g.add_argument("--concurrency", type=int, metavar="N", help="closed loop: number of users")
    g.add_argument("--think-time-s", type=float, default=0.0, metavar="S",
                   help="closed loop: seconds a user waits after a finish before its next "
                   "request (0)")


def closed_loop_from_args(args: argparse.Namespace) -> ClosedLoop | None:
    """The closed loop ``--mode closed --concurrency N [--think-time-s S]`` asks for."""
    from harness.target import ClosedLoop

    if args.mode != "closed":
        if args.concurrency is not None or args.think_time_s:
            raise UserError("--concurrency and --think-time-s: only with --mode closed")
        return None
    if args.concurrency is None:
        raise UserError("--mode closed: give the number of users with --concurrency N")
    loop = ClosedLoop(args.concurrency, args.think_time_s)
    try:
        loop.validate()
    except ValueError as exc:
        raise UserError("--" + str(exc).replace("think_time_s", "think-time-s")) from None
    return loop


def cmd_simulate(args: argparse.Namespace) -> int:
    from harness.sim.report_process import ReportProcess, signals_deferred

    # The report code takes longer to load than the rest of the command (about 0.7 s of a
    # core against 0.3 s): its process starts before anything else is loaded, and loads on
    # another core meanwhile. A command that fails before its run stops it (close).
    reporter: ReportProcess | None = None
    try:
        if not args.no_report:
            with signals_deferred():  # Ctrl-C now: raised once it is kept, then closed
                reporter = ReportProcess.start()
        return _simulate(args, reporter)
    finally:
        if reporter is not None:
            reporter.close()


def _simulate(args: argparse.Namespace, reporter: ReportProcess | None) -> int:
    from harness.results import SUMMARY_FILE, nothing_served, read_summary
    from harness.sim.report_process import ReportError
    from harness.sim.target import SimulatedTarget
    from harness.target import RunOptions

    config = reference_config(args)  # configuration errors before anything is written
    # --on-too-long drop|clip without --max-model-len: the engine's, which rejects the rest
    trace = load_trace(args, engine_max_model_len=config.resolved_max_model_len)
    target = SimulatedTarget(reference_spec(args))
    slo = parse_slo(args.slo)
    closed_loop = closed_loop_from_args(args)
    out = Path(args.out)
    refuse_cell(out)
    bar = progress_bar(len(trace.requests), "simulate")
    unrendered: ReportError | None = None
    try:
        summary = target.run(trace, out, RunOptions(slo=slo, progress=bar.update_to,
                                                     command=command_line(),
                                                     closed_loop=closed_loop,
                                                     overwrite=args.overwrite,
                                                     write_report=not args.no_report,
                                                     report_process=reporter))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    except ReportError as exc:  # every result is on disk: its headline, then why no report
        summary, unrendered = read_summary(out / SUMMARY_FILE), exc
    finally:
        bar.close()
    print_headline(summary)
    # what loading changed: the figures above are of these requests only
    print_trace_notes(trace.notes, arrivals=closed_loop is None)
    print_failures(summary, str(out))
    print_behind(str(out))
    print_predicted(config, headline=True)
    report = (f"no report: `batchlab report {out}` writes it"
              if args.no_report or unrendered else f"report: {out / 'report.md'}")
    print(f"results: {out}/ ({report})")
    served_none = nothing_served(summary, out)
    if served_none is not None:  # its summary and manifest say so (as replay's)
        from harness.manifest import record_failed

        record_failed(out, summary, served_none)
    why = served_none or too_many_failed(summary, args.max_failed)
    if why is not None:  # its files are kept; a script must not take it for a measurement
        print(f"error: {why}", file=sys.stderr)
    if unrendered is not None:
        if unrendered.detail:  # the child's traceback: what a bug report needs
            print(unrendered.detail, file=sys.stderr)
        print(f"error: report.md was not written: {unrendered.reason}; the results are "
              f"complete: `batchlab report {out}` writes it", file=sys.stderr)
    return EXIT_FAILURE if why is not None or unrendered is not None else 0


# ---------------------------------------------------------------- costmodel


def add_costmodel(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from adapters.reference import known_gpus, known_models

    p = add_subparser(
        sub, "costmodel",
        help="TPOT and throughput against batch size, from the reference engine's cost model",
        description="Print decode-step time (TPOT), output tokens/s, arithmetic intensity and "
        "the bound (memory or compute) for batch sizes 1, 4, 16, 64, 256 and the largest batch "
        "the engine runs: what the KV cache holds, within --max-num-seqs. KV blocks, block size "
        "and the scheduler's limits are those `batchlab simulate` uses with the same flags "
        "(and the profile's engine defaults). Formulas and constants: docs/cost-model.md.",
        epilog="example: batchlab costmodel --model llama-3.1-8b --gpu h100-sxm "
        "--kv-cache-dtype fp8",
    )
    p.add_argument("--model", default="llama-3.1-8b",
                   help=f"one of {', '.join(known_models())}, or a HF config.json path "
                        "(default llama-3.1-8b)")
    add_gpu_option(p, f"one of {', '.join(known_gpus())} (default: the profile's device, "
                   "else h100-sxm)")
    add_profile_option(p)
    p.add_argument("--context-len", type=int, default=1024,
                   help="tokens each request holds during the decode step (default 1024; at "
                   "most the max model length - 2, the most a request of simulate holds)")
    add_knob_flags(p, only=COSTMODEL_KNOBS)


def cmd_costmodel(args: argparse.Namespace) -> int:
    from adapters.reference import costmodel_report

    if args.context_len < 1:
        raise UserError(f"--context-len: must be a positive integer, got {args.context_len}")
    try:
        config = reference_config(args)  # the configuration simulate would use
        _check_context_len(config, args.context_len)
        print(costmodel_report(config, args.context_len))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    print()
    print_predicted(config)
    return 0


def _check_context_len(config: ReferenceConfig, context_len: int) -> None:
    """Refuse a context no request of ``simulate`` reaches. A request of prompt + output <=
    max_model_len tokens (what the engine accepts) holds KV for at most max_model_len - 1 of
    them (the last token sampled is never fed back), and a decode step adds the KV of one
    token to the ``context_len`` held: ``context_len + 1 <= max_model_len - 1``."""
    max_len = config.resolved_max_model_len
    if context_len > max_len - 2:
        raise UserError(
            f"--context-len: expected at most {max_len - 2}, got {context_len}: "
            f"{config.model}'s max_model_len is {max_len} tokens (prompt + output), the "
            f"longest request `batchlab simulate` runs, and its last decode step holds "
            f"{max_len - 2} of them (the step adds one; the last token sampled is never fed "
            "back)")


# ---------------------------------------------------------------- serve


def add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subparser(
        sub, "serve",
        help="serve the reference engine over vLLM's OpenAI and TGI's HTTP protocols",
        description="Run the reference engine (the scheduler and cost model of `simulate`) on "
        "the wall clock behind an HTTP server: each step sleeps its predicted duration, then "
        "streams the tokens it produced. Routes: /v1/completions, /v1/chat/completions "
        "(vLLM's dialect: stream, usage, ignore_eos, min_tokens, priority), /generate, "
        "/generate_stream and / (TGI), /health, /v1/models, /version, /info and Prometheus "
        "/metrics with vLLM's and TGI's metric names. Every request produces exactly its "
        "max_tokens; token-id prompts count exactly, text prompts as described in "
        "docs/reference-server.md. Stop it with Ctrl-C or SIGTERM.",
        epilog="examples:\n"
        "  batchlab serve reference --model llama-3.1-8b --gpu h100-sxm --port 8000\n"
        "  batchlab serve reference --model llama-3.1-70b --gpu a100-80gb --tp 4 "
        "--policy priority --port 0\n"
        "  then: batchlab replay --target http://127.0.0.1:8000 --protocol openai "
        "--trace harness/data/azure_conv_excerpt.csv --limit 50",
        formatter_class=RawDescriptionFormatter,
    )
    p.add_argument("engine", choices=("reference",),
                   help="the engine to serve (batchlab serves only its reference engine)")
    add_reference_options(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; 0.0.0.0 exposes it to the network)")
    g.add_argument("--port", type=int, default=8000,
                   help="port (default 8000; 0 picks a free one, printed at start)")
    g.add_argument("--served-model-name", metavar="NAME",
                   help="model name clients must send, if any (default: --model)")
    g.add_argument("--tokenizer", metavar="PATH",
                   help="count text prompts with this local tokenizer (default: one token per "
                   "word and per punctuation mark)")
    g.add_argument("--log-level", default="warning",
                   choices=("critical", "error", "warning", "info", "debug"),
                   help="server log level (warning)")
    g.add_argument("--access-log", action="store_true", help="log every HTTP request")
    g.add_argument("--api-key-env", metavar="VAR",
                   help="require `Authorization: Bearer <key>` on the /v1 routes, as vLLM's "
                   "--api-key does, with the key read from environment variable VAR (never "
                   "from the command line, never logged)")


def cmd_serve(args: argparse.Namespace) -> int:
    from harness.redact import env_var_name
    from harness.serve import ServerOptions, serve

    config = reference_config(args)
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port: expected a port from 0 to 65535, got {args.port}")
    kv_tokens = config.resolved_num_gpu_blocks() * config.block_size
    if config.resolved_max_model_len > kv_tokens:  # as vLLM refuses to start
        raise UserError(
            f"the model's max_model_len ({config.resolved_max_model_len}) is larger than the "
            f"KV cache holds ({kv_tokens} tokens): a request of that length could never run, "
            "yet /v1/models would advertise it; lower --max-model-len, or give the cache more "
            "(--gpu-memory-utilization, --num-gpu-blocks)")
    api_key = None
    if args.api_key_env:
        if not env_var_name(args.api_key_env):  # a key pasted for VAR: not repeated
            raise UserError("--api-key-env: expected the NAME of the environment variable "
                            "that holds the key (letters, digits and _, not starting with a "
                            "digit); what was given is not one, and is not repeated here (it "
                            "may be the key itself)")
        api_key = os.environ.get(args.api_key_env)
        if not api_key:  # the name is not repeated: a key pasted for it may be a name too
            raise UserError("--api-key-env: the environment variable it names is not set (or "
                            "empty; its name is not repeated here: it may be the key itself)")
    options = ServerOptions(host=args.host, port=args.port,
                            served_model_name=args.served_model_name,
                            tokenizer_path=args.tokenizer, log_level=args.log_level,
                            access_log=args.access_log, api_key=api_key)

    def ready(url: str) -> None:
        front = config.params.frontend_latency_s
        delay = f", front end {front * 1e3:g} ms a request" if front else ""
        print(f"batchlab serve reference: {config.model} on {config.tp}x "
              f"{config.gpu_spec.name}, policy {config.policy}{delay}, listening on {url}",
              flush=True)
        print_predicted(config, names=("its step times",))

    try:
        serve(config, options, on_ready=ready)
    except KeyboardInterrupt:  # uvicorn already shut down gracefully, then re-raised SIGINT
        return 0
    except OSError as exc:
        raise UserError(f"--host/--port: cannot listen on {args.host}:{args.port}: {exc}") \
            from None
    except ValueError as exc:  # a tokenizer that cannot be loaded
        raise UserError(str(exc)) from None
    return 0
