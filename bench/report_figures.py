"""What a simulated run's figures cost when drawn as ``batchlab simulate`` draws them: each in
a process forked from a warm report renderer (``harness.sim.report_process``).

Simulates TRACE (default: the whole Azure LLM inference conversation trace, as
bench/simulate_speed.py; 19,366 requests, 4.1 million output tokens) on llama-3.1-8b /
h100-sxm into a temporary run folder (``batchlab simulate --no-report``, in a process of its
own: this one's heap stays that of a report renderer, which is what the forked processes
inherit), loads and warms the report code in this process as the report child does, then
alternates, N times each (``--repeat``, best of N printed, every time with ``--verbose``):

1. The three run figures, each drawn in a process forked from this one, side by side:
   baseline, the cyclic garbage collector on in the forked processes (as before 2026-12-04);
   then off, as ``harness.report.side_by_side`` draws them now. Their wall time, and the CPU
   time of the three processes.
2. The throughput figure's data, in a forked process without the collector: baseline, every chunk of
   ``chunks.parquet`` read at once and binned (``read_columns``, then ``tokens_binned`` over
   the whole arrays: how the figure read it before 2026-12-04); then ``last_chunk_s`` and
   ``chunk_tokens_binned``, a row group at a time, as the figure reads it now. Wall, CPU
   and the page faults of the forked process (fresh memory the kernel maps in); the script
   checks that both give the same counts.

    .venv/bin/python bench/report_figures.py [TRACE] [--limit N] [--repeat N] [--verbose]

Without the full trace, and no TRACE given, the script says so and skips (exit 0).
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from arg_types import positive_int
from simulate_speed import full_trace

from harness.report import plots
from harness.report.render import RUN_FIGURES, draw_run_figure, warm_up
from harness.report.runs import chunk_tokens_binned, first_arrival_s, last_chunk_s, read_columns
from harness.report.side_by_side import _draw_and_exit
from harness.results import CHUNKS_FILE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace", nargs="?", help="trace file (default: the whole Azure "
                        "conversation trace of the shared traces)")
    parser.add_argument("--limit", type=positive_int, help="first N requests only")
    parser.add_argument("--repeat", type=positive_int, default=3, metavar="N",
                        help="each way N times, alternating; best of N (3)")
    parser.add_argument("--verbose", action="store_true", help="print every time")
    args = parser.parse_args(argv)
    if not hasattr(os, "fork"):
        parser.error("needs os.fork, as the figures' processes of `batchlab simulate` do")
    path = Path(args.trace) if args.trace else full_trace()
    if path is None:
        return 0
    if not path.is_file():
        parser.error(f"{path}: no such file")
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        done = subprocess.run(
            [sys.executable, "-m", "harness.cli", "simulate", "--trace", str(path),
             "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--policy", "fcfs",
             "--no-report", "--out", str(run),
             *(["--limit", str(args.limit)] if args.limit else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
        if done.returncode != 0:  # a trace it cannot read: its one-line error names it
            parser.error(done.stderr.strip().splitlines()[-1] if done.stderr.strip()
                         else f"batchlab simulate exited with status {done.returncode}")
        num_chunks = pq.ParquetFile(run / CHUNKS_FILE).metadata.num_rows
        print(f"trace {path}: {num_chunks:,} chunks; llama-3.1-8b / h100-sxm, fcfs")
        warm_up(Path(tmp))  # as the report child does while the simulation runs
        figures: dict[str, list[Measure]] = {"collector on": [], "collector off": []}
        data: dict[str, list[Measure]] = {"all at once": [], "in batches": []}
        for _ in range(args.repeat):
            pngs = [f.png for f in RUN_FIGURES]
            figures["collector on"].append(_forked([partial(draw_run_figure, run, p)
                                                    for p in pngs]))
            figures["collector off"].append(_forked([partial(_draw_and_exit,
                                                             partial(draw_run_figure, run, p))
                                                     for p in pngs]))
            # as in the figure's process: without the collector
            data["all at once"].append(_forked([partial(_all_at_once, run)], collector=False))
            data["in batches"].append(_forked([partial(_in_batches, run)], collector=False))
        _print("the three run figures, each in a forked process, drawn side by side",
               figures, args.verbose)
        _print("the throughput figure's data, in a forked process", data, args.verbose)
        same = _all_at_once(run) == _in_batches(run)
        print(f"the same counts both ways: {same}")
    return 0 if same else 1


Measure = tuple[float, float, int]  # wall s, CPU s, page faults


def _forked(jobs: list[Callable[[], object]], *, collector: bool = True) -> Measure:
    """Each of ``jobs`` in a process forked from this one, all side by side (``collector``:
    with the garbage collector on in them): wall time until the last has ended, and the CPU
    time and page faults of all of them."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    pids = []
    for job in jobs:
        pid = os.fork()
        if pid == 0:
            code = 1
            if not collector:
                gc.disable()
            try:
                job()  # _draw_and_exit exits here: 0 drawn, 3 nothing to draw, 1 failed
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"a forked process ended with status {status}: nothing drawn")
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
            after.ru_minflt - before.ru_minflt)


def _all_at_once(run: Path) -> list[float]:
    """The baseline: every chunk's instant and tokens in memory at once, then binned."""
    chunks = read_columns(run / CHUNKS_FILE, ("t_s", "num_tokens")) or {}
    t_s = np.asarray(chunks["t_s"], dtype=np.float64) - first_arrival_s(run)
    edges = plots.token_bin_edges(float(np.max(t_s)))
    return plots.tokens_binned(t_s, chunks["num_tokens"], edges).tolist()


def _in_batches(run: Path) -> list[float]:
    """As the throughput figure reads its data now."""
    origin = first_arrival_s(run)
    last = last_chunk_s(run / CHUNKS_FILE)
    assert last is not None
    counts = chunk_tokens_binned(run / CHUNKS_FILE, origin,
                                 plots.token_bin_edges(last - origin))
    assert counts is not None
    return counts.tolist()


def _print(what: str, ways: dict[str, list[Measure]], verbose: bool) -> None:
    base, new = ways
    best = {way: (min(m[0] for m in runs), min(m[1] for m in runs), min(m[2] for m in runs))
            for way, runs in ways.items()}
    print(f"{what} (best of {len(ways[base])}):")
    for way, (wall, cpu, faults) in best.items():
        print(f"    {way:<14} wall {wall:6.3f} s   CPU {cpu:6.3f} s   {faults:>8,} page faults")
    print(f"    {new} against {base} (baseline): wall {best[base][0] / best[new][0]:.2f}x, "
          f"CPU {best[base][1] / best[new][1]:.2f}x faster")
    if verbose:
        for way, runs in ways.items():
            print(f"    {way:<14} wall " + " ".join(f"{m[0]:.3f}" for m in runs)
                  + "   CPU " + " ".join(f"{m[1]:.3f}" for m in runs))


if __name__ == "__main__":
    sys.exit(main())
