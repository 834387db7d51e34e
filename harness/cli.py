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

EXIT_USAGE = 2
EXIT_FAILURE = 1


class UserError(Exception):
    """A problem with the user's input (file, field, knob): printed without a traceback."""


# ---------------------------------------------------------------- trace options (shared)


def _add_trace_options(p: argparse.ArgumentParser) -> None:
    """Trace options shared by simulate, replay, validate. (Filled in with harness.traces.)"""
    p.add_argument("--trace", help="trace file (Azure CSV, Mooncake JSONL[.gz], ...)")


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
