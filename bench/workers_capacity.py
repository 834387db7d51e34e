"""How much load ``replay --workers N`` sustains: 1 and 2 client processes, in one run.

Starts the scheduled-stream loopback server of ``bench/client_capacity.py`` (``harness.live.
testing``: first chunk 20 ms after the request, then one every 5 ms, 16 tokens; it does no
model work) in a subprocess, then replays constant-rate traces at rising rates through
``harness.live.workers.replay_workers``, at each rate with 1 worker and with 2 workers back to
back (taking turns to go first, so that drift in the machine's load hits both), each until it
falls behind (sent rate off by more than 2 %, send-lag p50 over 5 ms, or a failure; the other
goes on alone). Per step it prints the
sent rate, send lag, streamed tokens/s, and where the CPU went: each worker's CPU seconds in
its replay, the server's (from /proc) and the whole machine's busy share (/proc/stat), so that
the limit can be named: a worker near 100 % of a core is a client limit; the server near 100 %
is a server limit; all processes together near the machine's cores is the machine.

All three CPU shares are over one window, so that they can be set side by side: from t0 (the
workers' shared clock origin, when the first request is due) to the return of
``replay_workers``. It holds the sends and streams, each worker writing its records, and the
parent merging them (that last on the machine's share only; the parent's own CPU is counted
with the server's and the workers' when the limit is named). A worker's own count starts when
it is told t0, up to a second (the start margin) before t0, a wait it spends idle.

The baseline is 1 worker (the ordinary replay's event loop in one process): the script prints
the ratio of the highest rate 2 workers kept up with to it, and which process was the limit.

    .venv/bin/python bench/workers_capacity.py [--rates 200,400,...] [--step-s 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow.parquet as pq
from arg_types import ascending_rates, positive_float

from harness.live.config import ReplayConfig
from harness.live.testing import server_process
from harness.live.workers import replay_workers
from harness.traces import Trace, TraceRequest

REPO = Path(__file__).resolve().parent.parent
TTFT_S, ITL_S, OUTPUT_TOKENS, PROMPT_TOKENS = 0.020, 0.005, 16, 32
KEEP_UP_LAG_S = 0.005
DEFAULT_RATES = (50, 100, 150, 200, 250, 300, 400, 500, 600, 800, 1000, 1200, 1600, 2000)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far, every process (Linux /proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


class CpuMark(NamedTuple):
    """CPU counters at one instant: the server's, the machine's ticks and this process's."""

    at_ns: int  # perf_counter_ns
    server_s: float
    machine: tuple[int, int]  # (busy, total) ticks
    parent_s: float


def cpu_mark(server_pid: int) -> CpuMark:
    return CpuMark(time.perf_counter_ns(), cpu_s(server_pid), machine_ticks(),
                   time.process_time())


def mark_at(t0_ns: int, server_pid: int) -> CpuMark:
    """The counters at the replay's start: wait for t0 (the parent idles meanwhile)."""
    time.sleep(max(0.0, (t0_ns - time.perf_counter_ns()) / 1e9))
    return cpu_mark(server_pid)


def constant_trace(rate: float, duration_s: float, tag: str) -> Trace:
    n = max(int(rate * duration_s), 1)
    reqs = tuple(TraceRequest(f"{tag}-{i}", i / rate, PROMPT_TOKENS, OUTPUT_TOKENS)
                 for i in range(n))
    return Trace(reqs, source=f"constant:{rate}", format="synthetic", digest=tag)


def step(url: str, server_pid: int, workers: int, rate: float, step_s: float,
         out: Path) -> dict[str, Any]:
    trace = constant_trace(rate, step_s, f"w{workers}r{rate:g}")
    marks: list[CpuMark] = []
    config = ReplayConfig(target_url=url, protocol="openai", timeout_s=30.0)
    summary = replay_workers(trace, config, out, num_workers=workers,
                             on_t0=lambda t0_ns: marks.append(mark_at(t0_ns, server_pid)))
    marks.append(cpu_mark(server_pid))
    start, end = marks[0], marks[-1]  # the window of every CPU share (module doc)
    window_s = (end.at_ns - start.at_ns) / 1e9 or 1.0
    (busy0, total0), (busy1, total1) = start.machine, end.machine
    table = pq.read_table(out / "requests.parquet", columns=["sent_s", "error_kind"]).to_pydict()
    sent = np.sort(np.asarray([s for s in table["sent_s"] if s is not None], dtype=np.float64))
    span = float(sent[-1] - sent[0]) if sent.size > 1 else 0.0
    lag = summary.get("send_lag_s") or {}
    per_worker = summary.get("workers") or []
    return {
        "workers": workers, "rate": rate, "num": len(table["sent_s"]),
        "failed": sum(1 for e in table["error_kind"] if e),
        "sent_rate": (sent.size - 1) / span if span > 0 else float("nan"),
        "lag_p50": lag.get("p50") or 0.0, "lag_p99": lag.get("p99") or 0.0,
        "tok_s": summary["throughput"]["output_tokens_per_s"],
        "worker_lag_p99": [w.get("send_lag_s_p99") or 0.0 for w in per_worker],
        "window_s": window_s,
        "worker_cpu": [(w.get("cpu_s") or 0.0) / window_s for w in per_worker],
        "server_cpu": (end.server_s - start.server_s) / window_s,
        "parent_cpu": (end.parent_s - start.parent_s) / window_s,  # mostly the merge
        # the whole machine over the same window, other users' processes included
        "machine_busy": (busy1 - busy0) / (total1 - total0) if total1 > total0 else 0.0,
    }


def kept_up(r: dict[str, Any]) -> bool:
    return (not r["failed"] and r["lag_p50"] < KEEP_UP_LAG_S
            and abs(r["sent_rate"] - r["rate"]) <= 0.02 * r["rate"])


def line(r: dict[str, Any]) -> str:
    lags = "/".join(f"{v * 1e3:.2f}" for v in r["worker_lag_p99"])
    cpus = "/".join(f"{v:.0%}" for v in r["worker_cpu"])
    return (f"{r['workers']:>7} {r['rate']:6g} {r['sent_rate']:8.1f} {r['failed']:6d} "
            f"{r['lag_p50'] * 1e3:8.2f} {r['lag_p99'] * 1e3:8.2f}  {lags:>13}  "
            f"{r['tok_s']:8.0f}  {cpus:>9}  {r['server_cpu']:6.0%}  {r['machine_busy']:7.0%}  "
            f"{'yes' if kept_up(r) else 'NO'}")


def limit_of(r: dict[str, Any]) -> str:
    """Which process ran out of CPU at the first rate not kept up."""
    cores = os.cpu_count() or 1
    total = r["server_cpu"] + sum(r["worker_cpu"]) + r["parent_cpu"]
    parts = []
    if r["server_cpu"] >= 0.85:
        parts.append(f"the server ({r['server_cpu']:.0%} of a core)")
    busy = [f"worker {i} ({c:.0%})" for i, c in enumerate(r["worker_cpu"]) if c >= 0.85]
    if busy:
        parts.append("the client: " + ", ".join(busy))
    if total >= 0.85 * cores:
        parts.append(f"the machine: server, workers and parent used {total:.2f} of {cores} "
                     "cores")
    elif r["machine_busy"] >= 0.9:
        parts.append(f"the machine, shared: its {cores} cores were {r['machine_busy']:.0%} busy "
                     f"but server, workers and parent got only {total:.2f} of them (other "
                     "processes took the rest)")
    return "; ".join(parts) or (f"no process near a full core (server {r['server_cpu']:.0%}, "
                                f"workers {'/'.join(f'{c:.0%}' for c in r['worker_cpu'])})")


def sweep(url: str, pid: int, rates: list[float], step_s: float,
          tmp: Path) -> dict[int, list[dict[str, Any]]]:
    """Each rate with 1 and with 2 workers back to back, which goes first alternating from
    rate to rate; each stops at its first rate not kept up. Steps per number of workers."""
    results: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    for i, rate in enumerate(rates):
        going = [w for w, done in results.items() if not done or kept_up(done[-1])]
        if not going:
            break
        for workers in going if i % 2 == 0 else going[::-1]:
            results[workers].append(step(url, pid, workers, rate, step_s,
                                         tmp / f"w{workers}-r{rate:g}"))
        for workers in going:
            print(line(results[workers][-1]), flush=True)
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", type=ascending_rates,
                   default=",".join(str(r) for r in DEFAULT_RATES),
                   help="request rates to sweep (req/s), comma-separated, each above 0, rising")
    p.add_argument("--step-s", type=positive_float, default=3.0,
                   help="seconds of arrivals per rate")
    args = p.parse_args()
    rates: list[float] = args.rates
    wall0 = time.perf_counter()
    with server_process("--ttft-s", str(TTFT_S), "--itl-s", str(ITL_S)) as server:
        url = server.url
        print(f"loopback server {url} (pid {server.pid}): first chunk after {TTFT_S * 1e3:g} ms, "
              f"then every {ITL_S * 1e3:g} ms, {OUTPUT_TOKENS} tokens; constant rate, "
              f"{args.step_s:g} s per step; {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.1f}")
        print("CPU columns: shares of one window, t0 to replay_workers' return (sends, streams, "
              "the workers writing their records, the parent merging them)")
        print("workers   rate   sent/s failed  lag p50  lag p99  worker p99 ms     tok/s  "
              "worker CPU  server  machine  kept up")
        best: dict[int, dict[str, Any] | None] = {}
        limits: dict[int, str] = {}
        with tempfile.TemporaryDirectory() as tmp:
            by_workers = sweep(url, server.pid, rates, args.step_s, Path(tmp))
            for workers, results in by_workers.items():
                kept = [r for r in results if kept_up(r)]
                best[workers] = max(kept, key=lambda r: r["rate"]) if kept else None
                behind = next((r for r in results if not kept_up(r)), None)
                limits[workers] = (limit_of(behind) if behind is not None
                                   else "none reached: raise --rates")
        for workers in (1, 2):
            b = best[workers]
            text = (f"{b['rate']:g} req/s, {b['tok_s']:.0f} streamed tok/s" if b
                    else "no rate tried")
            print(f"{workers} worker{'s' if workers > 1 else ''}: highest rate kept up with: "
                  f"{text}; limit at the next rate: {limits[workers]}")
        one, two = best[1], best[2]
        if one and two and all(limits[w] != "none reached: raise --rates" for w in (1, 2)):
            print(f"2 workers / 1 worker (the baseline): {two['rate'] / one['rate']:.2f}x the "
                  f"rate")
        elif one and two:  # a ratio of two rates that were not limits says nothing
            print("2 workers / 1 worker (the baseline): no ratio, "
                  + ("neither" if limits[1] == limits[2] else "one of them")
                  + " reached its limit within --rates (raise them)")
        print(f"total wall time {time.perf_counter() - wall0:.1f} s; load average "
              f"{os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
