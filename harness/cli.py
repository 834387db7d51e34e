"""The ``batchlab`` command line: every subcommand is parsed here, and only here.

Each subcommand has an ``_add_<name>`` (arguments) and a ``_cmd_<name>`` (action) function;
actions turn arguments into the frozen configuration records of the module that does the work.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.base import KnobError, Knobs

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
    g.add_argument("--gpu", default=None,
                   help="catalog GPU (default: the profile's device, else h100-sxm)")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    g.add_argument("--profile", help="cost-model profile JSON (from `batchlab calibrate`)")
    g.add_argument("--policy", choices=("fcfs", "priority", "static"), default="fcfs",
                   help="scheduling policy (default fcfs)")
    g.add_argument("--admission", choices=("optimistic", "reserve"), default=None,
                   help="optimistic (default): allocate KV as tokens grow, preempt when full "
                        "(vLLM); reserve: reserve prompt+max output at admission, never preempt "
                        "(TGI, TRT-LLM GUARANTEED_NO_EVICT). The static policy always reserves.")
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


def _add_simulate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def _print_headline(summary: dict[str, Any]) -> None:
    tp = summary["throughput"]
    print(
        f"{summary['num_completed']}/{summary['num_requests']} requests completed in "
        f"{summary['duration_s']:.1f} s; {tp['output_tokens_per_s']:.0f} output tok/s; "
        f"TTFT p50 {_fmt_s(summary['ttft_s']['p50'])} p99 {_fmt_s(summary['ttft_s']['p99'])}; "
        f"TPOT p50 {_fmt_s(summary['tpot_s']['p50'])} p99 {_fmt_s(summary['tpot_s']['p99'])}; "
        f"{summary['num_preemptions']} preemptions"
    )


# ---------------------------------------------------------------- costmodel


def _add_costmodel(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from adapters.reference import known_gpus, known_models

    p = sub.add_parser(
        "costmodel",
        help="TPOT and throughput against batch size, from the reference engine's cost model",
        description="Print decode-step time (TPOT), output tokens/s, arithmetic intensity and "
        "the bound (memory or compute) for batch sizes 1, 4, 16, 64, 256 and the largest batch "
        "the KV cache holds. Formulas and constants: docs/cost-model.md.",
        epilog="example: batchlab costmodel --model llama-3.1-8b --gpu h100-sxm "
        "--kv-cache-dtype fp8",
    )
    p.add_argument("--model", default="llama-3.1-8b",
                   help=f"one of {', '.join(known_models())}, or a HF config.json path "
                        "(default llama-3.1-8b)")
    p.add_argument("--gpu", help=f"one of {', '.join(known_gpus())} (default: the profile's "
                                 "device, else h100-sxm)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    p.add_argument("--weights-dtype", choices=("bf16", "fp8"), default="bf16")
    p.add_argument("--kv-cache-dtype", choices=("bf16", "fp8"), default="bf16")
    p.add_argument("--context-len", type=int, default=1024,
                   help="tokens each request holds during the decode step (default 1024)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of GPU memory for weights, activations and KV (0.9)")
    p.add_argument("--profile", help="cost-model profile JSON (calibrated coefficients)")


def _cmd_costmodel(args: argparse.Namespace) -> int:
    from adapters.reference import costmodel_report

    if args.context_len < 1:
        raise UserError(f"--context-len: must be a positive integer, got {args.context_len}")
    try:
        print(costmodel_report(
            args.model, args.gpu, args.weights_dtype, args.kv_cache_dtype, args.tp,
            args.context_len, profile=args.profile,
            gpu_memory_utilization=args.gpu_memory_utilization))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return 0


# ---------------------------------------------------------------- run (scenarios) and report


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
                   help="skip cells that finished earlier; redo missing, failed or "
                   "interrupted ones")
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


def _add_report(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


# ---------------------------------------------------------------- replay and summarize (live)


def _add_replay(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a trace against a running server and measure every streamed chunk",
        description="Send each trace request to a server at its arrival time (open loop) or "
        "from N users (closed loop), streaming, and record when every chunk arrived. Writes "
        "records.jsonl as requests finish, then requests.parquet, chunks.parquet, summary.json "
        "and manifest.json. Ctrl-C keeps what was measured; `batchlab summarize DIR` rebuilds "
        "the summary from records.jsonl. How timings are taken: docs/metrics.md (Live runs).",
        epilog="examples:\n"
        "  batchlab replay --target http://127.0.0.1:8000 --protocol openai --model m \\\n"
        "      --trace harness/data/azure_conv_excerpt.csv --time-scale 0.5 --out reports/live\n"
        "  batchlab replay --target http://127.0.0.1:8080 --protocol tgi --trace synthetic \\\n"
        "      --num-requests 200 --rate 4 --prompt-tokens 512 --output-tokens 128 \\\n"
        "      --mode closed --concurrency 16 --slo ttft_s=0.5,tpot_s=0.05",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_trace_options(p)
    g = p.add_argument_group("replay")
    g.add_argument("--target", metavar="URL",
                   help="base URL of the server, e.g. http://127.0.0.1:8000")
    g.add_argument("--protocol", choices=("openai", "openai-chat", "tgi"), default="openai",
                   help="openai: /v1/completions (token-id prompts without --tokenizer); "
                   "openai-chat: /v1/chat/completions; tgi: /generate_stream (default openai)")
    g.add_argument("--model", metavar="NAME", help="model name sent in each request")
    g.add_argument("--mode", choices=("open", "closed"), default="open",
                   help="open: send at trace arrival times (default); closed: --concurrency "
                   "users, each sending its next request when the last one ends")
    g.add_argument("--concurrency", type=int, metavar="N", help="closed loop: number of users")
    g.add_argument("--max-concurrency", type=int, metavar="N",
                   help="open loop: at most N requests in flight; held requests go out in "
                   "arrival order, never faster than the trace's mean rate")
    g.add_argument("--timeout-s", type=float, default=600.0, metavar="S",
                   help="per-request limit from send to end of stream (600)")
    g.add_argument("--tokenizer", metavar="PATH",
                   help="local tokenizer folder (or tokenizer.json) of the served model: "
                   "prompts of exact token length; no hub access")
    g.add_argument("--slo", help="SLOs for goodput, e.g. ttft_s=0.5,tpot_s=0.05,e2e_s=20")
    g.add_argument("--client-lag-threshold-s", type=float, default=0.010, metavar="S",
                   help="flag the run client-limited when send-lag p99 exceeds S (0.010)")
    g.add_argument("--api-key-env", metavar="VAR",
                   help="environment variable holding a bearer API key (the key is never "
                   "printed or stored)")
    g.add_argument("--length-control", choices=("vllm", "transformers", "max_tokens"),
                   default="vllm",
                   help="how an OpenAI server is asked for exactly the trace's output length: "
                        "vllm = max_tokens+min_tokens+ignore_eos (vLLM, TRT-LLM, llama.cpp); "
                        "transformers = generation_config min/max_new_tokens (transformers "
                        "serve); max_tokens = upper bound only (default vllm)")
    g.add_argument("--http-client", choices=("lean", "httpx"), default="lean",
                   help="lean: batchlab's streaming HTTP/1.1 client, parsing in the socket "
                   "callback (default; several times the capacity); httpx: the httpx library")
    g.add_argument("--out", default="reports/replay", help="run folder (reports/replay)")
    _add_engine_options(p)


def _replay_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``ReplayConfig`` fields from the command line, all but the target URL."""
    return {
        "protocol": args.protocol,
        "model": args.model,
        "mode": args.mode,
        "concurrency": args.concurrency,
        "max_concurrency": args.max_concurrency,
        "timeout_s": args.timeout_s,
        "tokenizer_path": args.tokenizer,
        "slo": _parse_slo(args.slo),
        "client_lag_threshold_s": args.client_lag_threshold_s,
        "api_key_env": args.api_key_env,
        "seed": args.seed,
        "http_client": args.http_client,
        "length_control": args.length_control,
    }


def _cmd_replay(args: argparse.Namespace) -> int:
    from harness.replay import ReplayConfig, replay_sync

    if args.engine:
        return _cmd_replay_engine(args)
    if not args.target:
        raise UserError("--target URL is required (the server to replay against)")
    trace = _load_trace(args)
    try:
        config = ReplayConfig(target_url=args.target, **_replay_kwargs(args))
        config.validate()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    out = Path(args.out)
    bar = _progress_bar(len(trace.requests), "replay")
    try:
        summary = replay_sync(trace, config, out, progress=bar.update_to,
                              command=["batchlab", *sys.argv[1:]])
    except ValueError as exc:  # a tokenizer that cannot be loaded, ...
        raise UserError(str(exc)) from None
    finally:
        bar.close()
    _print_live_headline(summary)
    print(f"results: {out}/")
    return 0


def _print_live_headline(summary: dict[str, Any]) -> None:
    _print_headline(summary)
    if summary.get("failures"):
        print("failures: " + ", ".join(f"{k} {v}" for k, v in summary["failures"].items()))
    lag = summary.get("send_lag_s") or {}
    if summary.get("client_limited"):
        print(f"warning: client-limited run: send-lag p99 {_fmt_s(lag.get('p99'))} exceeds "
              f"{_fmt_s(summary.get('client_lag_threshold_s'))}; the client, not the server, "
              "may have set these figures", file=sys.stderr)


def _add_summarize(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "summarize",
        help="rebuild a run folder's summary (after a crash or with other SLOs)",
        description="Rebuild requests.parquet, chunks.parquet and summary.json of a live run "
        "folder from its records.jsonl (what survives a crash or Ctrl-C), or re-summarise any "
        "run folder's requests.parquet, e.g. under different SLOs.",
        epilog="example: batchlab summarize reports/live --slo ttft_s=0.5,tpot_s=0.05",
    )
    p.add_argument("run_dir", metavar="DIR", help="run folder")
    p.add_argument("--slo", help="SLOs for goodput (default: the run's own, from manifest.json)")


def _cmd_summarize(args: argparse.Namespace) -> int:
    from harness.replay import rebuild_summary

    try:
        summary = rebuild_summary(Path(args.run_dir), slo=_parse_slo(args.slo))
    except (ValueError, OSError) as exc:
        raise UserError(str(exc)) from None
    _print_live_headline(summary)
    print(f"summary: {Path(args.run_dir) / 'summary.json'}")
    return 0


# ---------------------------------------------------------------- main


# ---------------------------------------------------------------- engines (live runs)

ENGINE_CHOICES = ("vllm", "tgi", "trtllm", "openai", "reference")
_KNOB_FLAGS = (  # uniform knob -> its replay flag (max_model_len comes from the trace options)
    "max_num_seqs", "max_num_batched_tokens", "policy", "preemption", "chunked_prefill",
    "weights_dtype", "kv_cache_dtype", "gpu_memory_utilization", "prefix_caching",
    "tensor_parallel_size",
)


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    """Engine and uniform-knob options of a live replay (``--engine``); see docs/engines.md."""
    g = p.add_argument_group(
        "engine",
        "launch an engine with mapped knobs (--launch) or attach to one (--url); "
        "`batchlab engines` shows each engine's mapping",
    )
    g.add_argument("--engine", choices=ENGINE_CHOICES,
                   help="engine to drive; with it the run folder gets manifest.json (argv, "
                   "knob mapping, engine version) and telemetry.parquet")
    how = g.add_mutually_exclusive_group()
    how.add_argument("--launch", action="store_true",
                     help="start the engine (bound to 127.0.0.1, a free port) and stop it after")
    how.add_argument("--url", metavar="URL", help="attach to an engine already running at URL")
    g.add_argument("--model-path", metavar="PATH",
                   help="what the launched engine loads (local folder or hub id); default: "
                   "--model. Requests carry --model (default: this path)")
    g.add_argument("--allow-approximate", action="store_true",
                   help="record knobs the engine cannot honour as approximated or not applied "
                   "instead of failing")
    g.add_argument("--dry-run", action="store_true",
                   help="print the launch argv, generated config file and knob mapping; start "
                   "nothing")
    g.add_argument("--engine-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for the launched server (repeatable), e.g. "
                   "VLLM_CPU_KVCACHE_SPACE=1")
    g.add_argument("--engine-executable", metavar="PATH",
                   help="vllm: the python that has vLLM (default $BATCHLAB_VLLM_PYTHON, a "
                   "`vllm` command, or .venvs/vllm/bin/python); trtllm: the trtllm-serve command")
    g.add_argument("--container-runtime", choices=("native", "docker", "podman"),
                   help="tgi: run text-generation-launcher natively or in the official image "
                   "(default: native if installed, else docker/podman)")
    g.add_argument("--metric-map", metavar="MAP",
                   help="openai: telemetry names, a preset (llamacpp, vllm, transformers, none) "
                   "or canonical=metric pairs, e.g. num_running=foo_running,num_waiting=foo_q")
    g.add_argument("--port", type=int, help="port of the launched server (default: a free one)")
    g.add_argument("--ready-timeout-s", type=float, default=900.0, metavar="S",
                   help="how long to wait for the launched server's /health (900)")
    g.add_argument("--telemetry-interval-s", type=float, default=0.25, metavar="S",
                   help="seconds between /metrics scrapes (0.25)")
    k = p.add_argument_group("uniform knobs", "unset knobs keep batchlab's defaults "
                             "(docs/engines.md); --max-model-len is the trace option above")
    k.add_argument("--max-num-seqs", type=int, metavar="N", help="max running requests (256)")
    k.add_argument("--max-num-batched-tokens", type=int, metavar="T",
                   help="token budget per engine step (8192)")
    k.add_argument("--policy", choices=("fcfs", "priority", "static"), help="scheduling (fcfs)")
    k.add_argument("--preemption", choices=("recompute", "swap", "none"),
                   help="what happens when KV runs out (recompute)")
    k.add_argument("--chunked-prefill", action=argparse.BooleanOptionalAction, default=None,
                   help="split long prompts across steps (on)")
    k.add_argument("--weights-dtype", choices=("bf16", "fp8"), help="weights (bf16)")
    k.add_argument("--kv-cache-dtype", choices=("bf16", "fp8"), help="KV cache (bf16)")
    k.add_argument("--gpu-memory-utilization", type=float, metavar="F",
                   help="memory fraction for the engine (0.9)")
    k.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="reuse KV of shared prefixes (off)")
    k.add_argument("--tensor-parallel-size", type=int, metavar="TP", help="GPUs per model (1)")
    k.add_argument("--extra-arg", action="append", default=[], metavar="ARG",
                   help="one argv item appended to the engine command (repeatable; write "
                   "--extra-arg=--enforce-eager for flags)")


def _knobs_from_args(args: argparse.Namespace) -> Knobs:
    """Uniform knobs from the flags that were given; the rest keep their defaults."""
    values: dict[str, object] = {
        name: getattr(args, name) for name in _KNOB_FLAGS if getattr(args, name, None) is not None
    }
    if getattr(args, "max_model_len", None) is not None:
        values["max_model_len"] = args.max_model_len
    if getattr(args, "extra_arg", None):
        values["extra_args"] = tuple(args.extra_arg)
    try:
        return Knobs.from_mapping(values, where="command line")
    except KnobError as exc:
        raise UserError(str(exc)) from None


def _engine_env(items: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--engine-env {item!r}: expected KEY=VALUE")
        env[key] = value
    return env


def _run_engine(args: argparse.Namespace, trace: Trace, replay_kwargs: dict[str, Any],
                out_dir: str, *, url: str | None = None,
                progress: Callable[[int, int], None] | None = None,
                command: Sequence[str] | None = None) -> dict[str, Any]:
    """The live run of ``replay --engine``: plan, launch or attach, replay, tear down.

    ``url`` overrides ``--url`` (the replay's own target option). KnobError and a server that
    does not start become UserError / a printed failure.
    """
    from adapters.openai import parse_metric_map
    from adapters.process import EngineStartError
    from harness.live import run_live

    url = url or args.url
    if not args.launch and url is None:
        raise UserError(f"--engine {args.engine}: give --launch to start it or --url URL")
    model_path = args.model_path or getattr(args, "model", None)
    if not model_path:
        raise UserError(f"--engine {args.engine}: give --model-path (what the engine loads) or "
                        "--model")
    try:
        return run_live(
            args.engine, _knobs_from_args(args), trace, replay_kwargs, out_dir,
            launch=bool(args.launch), url=url, allow_approximate=args.allow_approximate,
            dry_run=args.dry_run, model=model_path,
            served_model_name=getattr(args, "model", None) or model_path,
            progress=progress, command=command, engine_env=_engine_env(args.engine_env),
            executable=args.engine_executable, runtime=args.container_runtime,
            metric_map=parse_metric_map(args.metric_map) if args.metric_map else None,
            port=args.port, ready_timeout_s=args.ready_timeout_s,
            telemetry_interval_s=args.telemetry_interval_s,
        )
    except KnobError as exc:
        raise UserError(str(exc)) from None
    except EngineStartError as exc:
        raise UserError(f"{exc}\n(see {out_dir}/manifest.json and the server logs there)") from None


def _cmd_replay_engine(args: argparse.Namespace) -> int:
    """``replay --engine``: the replay above, around an engine batchlab plans and launches."""
    if args.target and args.launch:
        raise UserError("--target and --launch: give --launch to start the engine, or the URL "
                        "of a running one")
    trace = _load_trace(args)
    command = ["batchlab", *sys.argv[1:]]
    if args.dry_run:
        _run_engine(args, trace, _replay_kwargs(args), args.out, url=args.target,
                    command=command)
        return 0
    bar = _progress_bar(len(trace.requests), f"replay {args.engine}")
    try:
        summary = _run_engine(args, trace, _replay_kwargs(args), args.out, url=args.target,
                              progress=bar.update_to, command=command)
    except ValueError as exc:  # replay options, a tokenizer that cannot be loaded, ...
        raise UserError(str(exc)) from None
    finally:
        bar.close()
    _print_live_headline(summary)
    print(f"results: {args.out}/ (manifest.json: engine version, argv, knob mapping)")
    return 0


def _add_engines(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "engines",
        help="show how the uniform knobs map to each engine's flags",
        description="Print every engine adapter's mapping table: which flag, config key or "
        "environment variable each uniform knob becomes, and which values are refused at plan "
        "time (or approximated with --allow-approximate).\n\n"
        "example: batchlab engines\n"
        "         batchlab engines --markdown > docs/engines.md",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--markdown", action="store_true",
                   help="print docs/engines.md (the same tables as Markdown)")


def _cmd_engines(args: argparse.Namespace) -> int:
    from adapters.catalog import mapping_markdown, mapping_text

    sys.stdout.write(mapping_markdown() if args.markdown else mapping_text())
    return 0


# ---------------------------------------------------------------- serve


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
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
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("engine", choices=("reference",),
                   help="the engine to serve (batchlab serves only its reference engine)")
    _add_engine_config_options(p)
    p.add_argument("--max-model-len", type=int, metavar="N",
                   help="context length: longer requests are refused with HTTP 400 "
                   "(default: the model's max_position_embeddings)")
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


def _cmd_serve(args: argparse.Namespace) -> int:
    from adapters.reference.server import ServerOptions, serve

    config = _reference_config(args)
    options = ServerOptions(host=args.host, port=args.port,
                            served_model_name=args.served_model_name,
                            tokenizer_path=args.tokenizer, log_level=args.log_level,
                            access_log=args.access_log)

    def ready(url: str) -> None:
        print(f"batchlab serve reference: {config.model} on {config.tp}x "
              f"{config.gpu_spec.name}, policy {config.policy}, listening on {url}", flush=True)

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


# ---------------------------------------------------------------- calibrate and validate


def _add_calibration_target_options(p: argparse.ArgumentParser) -> None:
    """What calibrate and validate share besides the engine options."""
    g = p.add_argument_group("model and reference")
    g.add_argument("--model", required=True, metavar="PATH_OR_NAME",
                   help="the model the engine serves (a local folder or hub id); requests carry "
                   "it as the model name (the engine loads --model-path when given)")
    g.add_argument("--reference-model", metavar="NAME_OR_PATH",
                   help="the model's shape for the reference cost model: a catalog name "
                   "(batchlab costmodel --list) or a local config.json / folder; default: "
                   "--model-path or --model when it is a local folder or a catalog name")
    g.add_argument("--tokenizer", metavar="PATH",
                   help="local tokenizer of the served model, for prompts of exact length "
                   "(default: the model folder's own)")


def _reference_model(args: argparse.Namespace) -> str:
    """The model's shape for the cost model: --reference-model, else the served model when it
    is a local folder, a catalog name, or a hub id the catalog lists (``-Instruct`` variants
    share their base model's shape)."""
    from adapters.reference.models import MODELS

    if args.reference_model:
        return str(args.reference_model)
    for candidate in (args.model_path, args.model):
        if not candidate:
            continue
        if (Path(candidate) / "config.json").is_file() or candidate.lower() in MODELS:
            return str(candidate)
        base = candidate.lower().split("/")[-1].replace("-instruct", "")
        for name, spec in MODELS.items():
            hub_id = spec.source.split()[0].lower()
            if candidate.lower() == hub_id or base == name:
                return name
    raise UserError(f"--reference-model: {args.model!r} is neither a local model folder nor a "
                    "catalog model; give the model's shape with --reference-model NAME or "
                    "--reference-model path/to/config.json")


def _engine_url_or_launch(args: argparse.Namespace) -> None:
    args.engine = args.engine or "vllm"
    if not args.launch and not args.url and not args.dry_run:
        raise UserError("give --launch (start the engine) or --url URL (attach to a running one)")


def _add_calibrate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "calibrate",
        help="fit the reference cost model to a live engine and write a profile",
        description="Run a short designed workload against a live engine (prefills of growing "
        "length on an idle engine; bursts of 1, 2, 4, ... requests decoding together, with "
        "short and long contexts), measure engine step times from the streamed token "
        "timestamps, fit the cost model's coefficients and write a profile JSON for "
        "`simulate --profile`, `serve reference --profile`, scenarios and `validate`. "
        "Method: docs/cost-model.md (Calibration).",
        epilog="examples:\n"
        "  batchlab calibrate --engine vllm --launch --model models/small-llama \\\n"
        "      --max-num-seqs 16 --max-num-batched-tokens 2048 --max-model-len 1024 \\\n"
        "      --extra-arg=--dtype --extra-arg=float32 --engine-env VLLM_CPU_KVCACHE_SPACE=1 \\\n"
        "      --out profiles/cpu-small-llama.json\n"
        "  batchlab calibrate --engine vllm --url http://127.0.0.1:8000 \\\n"
        "      --model meta-llama/Llama-3.1-8B --reference-model llama-3.1-8b \\\n"
        "      --device h100-sxm --out profiles/h100-llama8b.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_engine_options(p)
    _add_calibration_target_options(p)
    g = p.add_argument_group("calibration")
    g.add_argument("--max-model-len", type=int, metavar="N",
                   help="the engine's context length (knob); default: the model's")
    g.add_argument("--device", metavar="NAME",
                   help="the hardware the engine runs on: a catalog GPU (h100-sxm, h100-pcie, "
                   "h200, a100-80gb) keeps its datasheet figures and gets fitted efficiencies; "
                   "any other name (cpu, ...) is described by fitted effective figures. "
                   "Default: this machine's GPU (nvidia-smi), else cpu")
    g.add_argument("--out", required=True, metavar="PROFILE.json", help="the profile to write")
    g.add_argument("--work-dir", metavar="DIR",
                   help="run folders of the workload's phases and samples.parquet (default: "
                   "PROFILE.calibration/ beside the profile)")
    g.add_argument("--output-tokens", type=int, default=48, metavar="N",
                   help="tokens each decode-burst request generates (48)")
    g.add_argument("--max-batch-size", type=int, default=256, metavar="N",
                   help="largest burst (also capped by --max-num-seqs) (256)")
    g.add_argument("--long-prompt-tokens", type=int, default=512, metavar="N",
                   help="context of the long-context bursts (512; capped by --max-model-len)")


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from adapters.process import EngineStartError
    from harness.calibrate import (
        CalibrationError,
        WorkloadSpec,
        calibrate,
        design_workload,
        detect_device,
        reference_config,
        serving,
    )

    _engine_url_or_launch(args)
    knobs = _knobs_from_args(args)
    reference_model = _reference_model(args)
    device = args.device or detect_device()
    model_path = args.model_path or args.model
    out = Path(args.out)
    work_dir = Path(args.work_dir) if args.work_dir else out.with_suffix(".calibration")
    try:
        config = reference_config(reference_model, knobs, device)
        spec = WorkloadSpec(
            max_num_seqs=knobs.max_num_seqs, max_num_batched_tokens=knobs.max_num_batched_tokens,
            max_model_len=config.resolved_max_model_len, num_output_tokens=args.output_tokens,
            max_batch_size=args.max_batch_size, long_prompt_tokens=args.long_prompt_tokens)
        phases = design_workload(spec)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if args.dry_run:
        for phase in phases:
            lengths = sorted({r.num_prompt_tokens for r in phase.requests})
            how = (f"{phase.concurrency} user(s)" if phase.concurrency
                   else "one at a time" if phase.spaced_by else "all at once")
            print(f"phase {phase.name}: {len(phase.requests)} requests, prompts {lengths}, "
                  f"{how}: {phase.measures}")
        print(f"device {device}; reference model {reference_model}")
        return 0
    tokenizer = args.tokenizer or (model_path if (Path(model_path) / "tokenizer.json").is_file()
                                   else None)
    try:
        with serving(args.engine, knobs, model=model_path, served_model_name=args.model,
                     url=args.url, log_dir=work_dir, allow_approximate=args.allow_approximate,
                     engine_env=_engine_env(args.engine_env), executable=args.engine_executable,
                     ready_timeout_s=args.ready_timeout_s) as plan:
            result = calibrate(plan, knobs, reference_model=reference_model, device=device,
                               out_path=out, work_dir=work_dir, spec=spec,
                               tokenizer_path=tokenizer,
                               telemetry_interval_s=args.telemetry_interval_s,
                               command=["batchlab", *sys.argv[1:]])
    except KnobError as exc:
        raise UserError(str(exc)) from None
    except (EngineStartError, CalibrationError, ValueError) as exc:
        raise UserError(f"{exc}\n(run folders and server logs: {work_dir})") from None
    fit = result.fit
    c = fit.coefficients
    print(f"step = max(bytes / {_fmt_rate(fit.memory_bytes_per_s, 'B/s')}, "
          f"FLOPs / {_fmt_rate(fit.compute_flops_per_s, 'FLOP/s')}) + "
          f"{_fmt_s(c['step_overhead_s'])} + {_fmt_s(c['per_seq_overhead_s'])}/seq + "
          f"{c['per_kv_token_overhead_s'] * 1e6:.2f} µs/KV token + "
          f"{c['per_attention_pair_overhead_s'] * 1e9:.1f} ns/attention pair; front end "
          f"{_fmt_s(c['frontend_latency_s'])}")
    print(f"fit: {fit.num_samples} samples ({fit.num_outliers} outliers), median |error| "
          f"{fit.median_abs_relative_error:.1%}, p90 {fit.p90_abs_relative_error:.1%}")
    for note in result.profile["metadata"]["notes"]:
        print(f"note: {note}")
    print(f"profile: {out}  (workload run folders: {work_dir})")
    return 0


def _fmt_rate(value: float, unit: str) -> str:
    import math

    if not math.isfinite(value):
        return "inf"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _add_validate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "validate",
        help="replay a trace live and on the calibrated reference; report prediction errors",
        description="Replay a held-out trace against a live engine and simulate it on the "
        "reference engine with the same knobs and a calibration profile; print predicted vs "
        "measured TTFT, TPOT and E2E (p50, p90, p99), throughput, running batch size and "
        "per-request errors. With --out DIR: DIR/fidelity.json, DIR/fidelity.md, "
        "DIR/per_request_errors.parquet and the run folders DIR/live and DIR/simulated "
        "(`batchlab report DIR/live DIR/simulated` compares them).",
        epilog="example:\n"
        "  batchlab validate --profile profiles/cpu-small-llama.json --engine vllm \\\n"
        "      --url http://127.0.0.1:8000 --model models/small-llama --max-num-seqs 16 \\\n"
        "      --max-num-batched-tokens 2048 --extra-arg=--dtype --extra-arg=float32 \\\n"
        "      --trace harness/data/azure_conv_excerpt.csv --limit 40 --max-model-len 1024 \\\n"
        "      --on-too-long clip --rate 2 --out reports/validate",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_trace_options(p)
    _add_engine_options(p)
    _add_calibration_target_options(p)
    g = p.add_argument_group("validation")
    g.add_argument("--profile", required=True, metavar="PROFILE.json",
                   help="the calibration profile (from batchlab calibrate)")
    g.add_argument("--slo", help="SLOs for goodput, e.g. ttft_s=0.5,tpot_s=0.05")
    g.add_argument("--out", default="reports/validate", metavar="DIR",
                   help="where fidelity.json and the two run folders go (reports/validate)")


def _cmd_validate(args: argparse.Namespace) -> int:
    from adapters.process import EngineStartError
    from harness.calibrate import serving
    from harness.validate import render_fidelity_markdown, run_validation

    _engine_url_or_launch(args)
    knobs = _knobs_from_args(args)
    reference_model = _reference_model(args)
    trace = _load_trace(args)
    if args.dry_run:
        print(f"would replay {len(trace.requests)} requests of {trace.source} and simulate "
              f"them with {args.profile} (reference model {reference_model})")
        return 0
    model_path = args.model_path or args.model
    out = Path(args.out)
    replay_kwargs: dict[str, Any] = {"seed": args.seed}
    if args.tokenizer:
        replay_kwargs["tokenizer_path"] = args.tokenizer
    bar = _progress_bar(len(trace.requests), "validate")
    try:
        with serving(args.engine, knobs, model=model_path, served_model_name=args.model,
                     url=args.url, log_dir=out / "server", allow_approximate=args.allow_approximate,
                     engine_env=_engine_env(args.engine_env), executable=args.engine_executable,
                     ready_timeout_s=args.ready_timeout_s) as plan:
            fid = run_validation(plan, knobs, trace, profile=args.profile,
                                 reference_model=reference_model, out_dir=out, model=model_path,
                                 replay_kwargs=replay_kwargs, slo=_parse_slo(args.slo),
                                 command=["batchlab", *sys.argv[1:]], progress=bar.update_to,
                                 telemetry_interval_s=args.telemetry_interval_s)
    except KnobError as exc:
        raise UserError(str(exc)) from None
    except (EngineStartError, ValueError) as exc:
        raise UserError(str(exc)) from None
    finally:
        bar.close()
    print(render_fidelity_markdown(fid, title="Prediction fidelity", intro=False), end="")
    speed = fid.get("engine_speed_vs_calibration") or {}
    if speed.get("before") is not None and speed.get("after") is not None:
        print(f"Engine speed since calibration (burst {speed['burst']} again): "
              f"{speed['before']:+.1%} before the replay, {speed['after']:+.1%} after "
              "(+: slower; a drifting machine, not the model).\n")
    in_flight = fid.get("in_flight_requests")
    if in_flight:
        print(f"Requests in flight (send to finish, both sides from their timelines), mean: "
              f"predicted {in_flight['mean']['predicted']:.2f}, measured "
              f"{in_flight['mean']['measured']:.2f}.\n")
    print(f"results: {out}/fidelity.json  (compare: batchlab report {out}/live "
          f"{out}/simulated)")
    return 0


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
    _add_costmodel(sub)
    commands["costmodel"] = _cmd_costmodel
    _add_trace(sub)
    commands["trace"] = _cmd_trace
    _add_run(sub)
    commands["run"] = _cmd_run
    _add_report(sub)
    commands["report"] = _cmd_report
    _add_replay(sub)
    commands["replay"] = _cmd_replay
    _add_summarize(sub)
    commands["summarize"] = _cmd_summarize
    _add_engines(sub)
    commands["engines"] = _cmd_engines
    _add_serve(sub)
    commands["serve"] = _cmd_serve
    _add_calibrate(sub)
    commands["calibrate"] = _cmd_calibrate
    _add_validate(sub)
    commands["validate"] = _cmd_validate
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
