"""How fast the reference engine simulates a whole real trace.

Simulates the Azure LLM inference conversation trace (19,366 requests, 58 minutes) on
llama-3.1-8b / h100-sxm with fcfs, and prints wall time, simulated steps per second and
requests per second. The baseline is the same run with decode spans off (``decode_spans=False``:
every step goes through the full scheduler); both must give identical results, which this
script checks. CPU time is printed next to wall time because the machine may be shared.

    .venv/bin/python bench/simulate_speed.py [TRACE] [--limit N] [--no-baseline] [--no-cli]
                                             [--repeat N]

Then, with prefix caching off and on, the whole command line (`batchlab simulate`: process
start, trace load, simulation, writing every result file and report.md) next to the core
simulation of the same configuration, in one run; the target is at most 1.30x. The core
simulation as timed inside that command (``simulation_wall_s`` of its summary.json) is printed
beside it: the difference between the two cores is the machine's noise, or work the command
does inside ``simulate`` that this process had done already (imports). With ``--repeat N``
the core and the command alternate N times each and the best of each is compared (a shared
machine's noise only ever adds time); every time is printed.

Before the command runs, the bytecode of the repository's packages is brought up to date
(``compileall``), as an installed package has it: with PYTHONDONTWRITEBYTECODE set (CI
machines, this one) Python would otherwise compile every module the command imports at each
start, which no user's install pays. The script says how many it compiled.

The command is also timed with ``--no-report`` (what scenario cells and capacity probes run):
the main process alone, without the report's child process and its figures.

Next to the times, the CPU seconds the command spends beyond its core simulation, over all of
its processes (the report is drawn by a child process): the work that has to fit on the
machine's other cores, or after the simulation.

TRACE defaults to $BATCHLAB_TRACES_DIR/AzureLLMInferenceTrace_conv.csv (the folder defaults
to ../shared/traces next to the repository); without it, and no TRACE given, the script says
so and skips (exit 0).
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from arg_types import positive_int

from adapters.reference import ReferenceConfig
from harness.sim import SimulationResult, simulate
from harness.traces import TraceError, TraceOptions, load_trace, shared_traces_dir
from harness.traces.data import TRACES_DIR_ENV, default_traces_dir

TRACE_NAME = "AzureLLMInferenceTrace_conv.csv"
PACKAGES = ("harness", "adapters")  # what `batchlab simulate` imports of the repository
TARGET = 1.30  # whole command / core simulation (issue: the CLI adds at most 30%)


def full_trace() -> Path | None:
    """The whole Azure conversation trace in the shared traces folder; None, once it has said
    so, when it is not there: as the tests that want the full traces do (README, "Traces"),
    the script is skipped, and says why."""
    folder = shared_traces_dir()
    if folder is not None and (folder / TRACE_NAME).is_file():
        return folder / TRACE_NAME
    configured = os.environ.get(TRACES_DIR_ENV)
    where = (folder or (Path(configured) if configured else default_traces_dir())) / TRACE_NAME
    print(f"skipped: the full trace is not at {where} (set {TRACES_DIR_ENV} to the folder "
          "that holds it, or pass a trace path: harness/data/azure_conv_excerpt.csv runs in "
          "seconds, though on its requests the fixed costs weigh more than on the whole "
          "trace)")
    return None


def _run(trace_requests: tuple, config: ReferenceConfig, *, decode_spans: bool
         ) -> tuple[SimulationResult, float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    result = simulate(trace_requests, config, decode_spans=decode_spans)
    return result, time.perf_counter() - t0, time.process_time() - c0


def _line(label: str, result: SimulationResult, wall_s: float, cpu_s: float) -> str:
    num_req = len(result.timelines)
    ok = sum(tl.ok for tl in result.timelines)
    sim_s = float(result.steps["t_s"][-1].as_py()) if result.num_steps else 0.0
    return (f"{label:<22} wall {wall_s:6.2f} s (cpu {cpu_s:6.2f} s)   "
            f"{result.num_steps:>9,} steps "
            f"({result.num_steps / wall_s:>9,.0f} steps/s)   "
            f"{num_req / wall_s:>8,.0f} requests/s   "
            f"{ok:,}/{num_req:,} completed, {sim_s:,.0f} simulated s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace", nargs="?", help=f"trace file (default: shared {TRACE_NAME})")
    parser.add_argument("--limit", type=positive_int, help="first N requests only")
    parser.add_argument("--no-baseline", action="store_true", help="skip the step-by-step run")
    parser.add_argument("--no-cli", action="store_true", help="skip the command-line runs")
    parser.add_argument("--repeat", type=positive_int, default=1, metavar="N",
                        help="command-line runs and their core runs, best of N (1)")
    args = parser.parse_args(argv)

    path = Path(args.trace) if args.trace else full_trace()
    if path is None:
        return 0
    t0 = time.perf_counter()
    try:
        trace = load_trace(path, TraceOptions(limit=args.limit))
    except TraceError as exc:  # the message names the file, and the line and field
        parser.error(str(exc))
    load_s = time.perf_counter() - t0
    config = ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm", policy="fcfs")
    print(f"trace {path}: {len(trace.requests):,} requests (loaded in {load_s:.2f} s); "
          f"llama-3.1-8b / h100-sxm, fcfs, {config.resolved_num_gpu_blocks():,} KV blocks")

    fast, fast_s, fast_cpu_s = _run(trace.requests, config, decode_spans=True)
    print(_line("decode spans (default)", fast, fast_s, fast_cpu_s))
    if not args.no_baseline:
        slow, slow_s, slow_cpu_s = _run(trace.requests, config, decode_spans=False)
        print(_line("baseline: step by step", slow, slow_s, slow_cpu_s))
        same = fast.timelines == slow.timelines and fast.steps.equals(slow.steps)
        print(f"speed-up vs step by step: {slow_s / fast_s:.2f}x wall, "
              f"{slow_cpu_s / fast_cpu_s:.2f}x cpu; identical results: {same}")
        if not same:
            return 1
    if not args.no_cli:
        print(_compiled())
        for caching in (False, True):
            _cli_vs_core(path, trace.requests, args.limit, prefix_caching=caching,
                         repeat=max(args.repeat, 1))
    return 0


def _compiled() -> str:
    """The packages' bytecode brought up to date (module docstring); what was done."""
    root = Path(__file__).resolve().parent.parent
    sources = [p for name in PACKAGES for p in (root / name).rglob("*.py")]
    stale = [p for p in sources if not _bytecode_current(p)]
    for name in PACKAGES:
        compileall.compile_dir(root / name, quiet=2)  # quiet: a failure is counted below
    left = sum(not _bytecode_current(p) for p in stale)
    said = (f"bytecode of {', '.join(f'{n}/' for n in PACKAGES)}: {len(stale) - left} of "
            f"{len(sources)} modules compiled first, as an installed package has them")
    if left:  # a read-only checkout: the command compiles those at each start
        said += (f"; {left} could not be written, and the command compiles them at each "
                 "start (its times include that)")
    return said


def _bytecode_current(source: Path) -> bool:
    """Whether Python would load ``source``'s bytecode rather than compile it: the cached
    file records the source's modification time and size (PEP 552, timestamp-based)."""
    try:
        header = Path(importlib.util.cache_from_source(str(source))).read_bytes()[:16]
        stat = source.stat()
    except OSError:
        return False
    return (len(header) == 16 and int.from_bytes(header[4:8], "little") == 0
            and int.from_bytes(header[8:12], "little") == int(stat.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(header[12:16], "little") == stat.st_size & 0xFFFFFFFF)


def _cli_vs_core(path: Path, requests: tuple, limit: int | None, *, prefix_caching: bool,
                 repeat: int) -> None:
    """The whole ``batchlab simulate`` process against the core simulation it runs."""
    config = ReferenceConfig(model="llama-3.1-8b", gpu="h100-sxm", policy="fcfs",
                             prefix_caching=prefix_caching)
    argv = [sys.executable, "-m", "harness.cli", "simulate", "--trace", str(path),
            "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--policy", "fcfs",
            "--prefix-caching" if prefix_caching else "--no-prefix-caching"]
    if limit is not None:
        argv += ["--limit", str(limit)]
    core_s, cli_s, inside_s, core_cpu_s, cli_cpu_s, bare_s = [], [], [], [], [], []
    for _ in range(repeat):  # alternating, so that drift in the machine's speed hits all three
        _, wall_s, cpu_s = _run(requests, config, decode_spans=True)
        core_s.append(wall_s)
        core_cpu_s.append(cpu_s)
        wall_s, cpu_s, summary = _command(argv)
        cli_s.append(wall_s)
        cli_cpu_s.append(cpu_s)  # the command and its report process
        inside_s.append(float(summary["simulation_wall_s"]))
        bare_s.append(_command([*argv, "--no-report"])[0])
    best = "" if repeat == 1 else f" (best of {repeat})"
    ratio = min(cli_s) / min(core_s)
    print(f"prefix caching {'on ' if prefix_caching else 'off'}{best}: core simulation "
          f"{min(core_s):6.2f} s (inside the CLI {min(inside_s):.2f} s), whole CLI "
          f"{min(cli_s):6.2f} s: whole CLI / core simulation {ratio:.2f}x "
          f"(target <= {TARGET:.2f}x: {'met' if ratio <= TARGET else 'NOT met'})")
    bare = min(bare_s) / min(core_s)
    print(f"    without the report (--no-report, as scenario cells and capacity probes run: "
          f"process start, trace load, simulation, the results files): {min(bare_s):.2f} s, "
          f"{bare:.2f}x the core ({'within' if bare <= TARGET else 'above'} {TARGET:.2f}x)")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"    CPU beyond the core simulation, all of the command's processes: "
          f"{min(cli_cpu_s) - min(core_cpu_s):.2f} s (best of each; {cores} cores here)")
    if repeat > 1:
        for label, times in (("core", core_s), ("inside the CLI", inside_s),
                             ("whole CLI", cli_s), ("no report", bare_s),
                             ("core CPU", core_cpu_s),
                             ("whole CLI CPU", cli_cpu_s)):
            print(f"    {label:<15}" + " ".join(f"{t:6.2f}" for t in times))


def _command(argv: list[str]) -> tuple[float, float, dict]:
    """Run ``argv`` with ``--out`` a fresh folder: (wall s, CPU s of it and its children,
    its summary.json)."""
    with tempfile.TemporaryDirectory() as tmp:
        t0, c0 = time.perf_counter(), _children_cpu_s()
        subprocess.run([*argv, "--out", str(Path(tmp) / "run")], check=True,
                       stdout=subprocess.DEVNULL)
        wall_s, cpu_s = time.perf_counter() - t0, _children_cpu_s() - c0
        return wall_s, cpu_s, json.loads((Path(tmp) / "run" / "summary.json").read_text())


def _children_cpu_s() -> float:
    """User + system CPU seconds of every child process waited for so far (and theirs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    sys.exit(main())
