"""The served reference engine against its own simulation: does the live path reproduce it?

Simulates a trace excerpt with ``harness.sim.simulate`` (the baseline), then replays the
same trace against ``batchlab serve reference`` (same engine settings, a child process) with the
live replay client, and prints:

- TTFT and TPOT p50/p90/p99, simulated and served, and the ratio served / simulated;
- per-request differences (served - simulated) of TTFT and TPOT: median, p90 of |diff|, max;
- where the served engine released tokens late (``batchlab_reference_step_lateness_seconds``)
  and the client's send lag, the two halves of the timing error.

    .venv/bin/python bench/served_vs_simulated.py [--limit 100] [--rate 4]
        [--protocol openai|openai-chat|tgi] [--model llama-3.1-70b --gpu a100-80gb --tp 4]

With the defaults (100 Azure conversation requests at 4 req/s, 70B on 4 A100s: ~23 ms decode
steps) it takes about 35 s of wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from arg_types import positive_float, positive_int
from prometheus_client.parser import text_string_to_metric_families

from adapters.reference.config import ConfigError, ReferenceConfig
from harness.live.recorder import RECORDS_FILE, read_records
from harness.live.replay import ReplayConfig, replay
from harness.metrics import request_metrics, summarize
from harness.serve import launch_server_process
from harness.sim import simulate
from harness.traces import TraceError, TraceOptions, load_trace

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = REPO / "harness" / "data" / "azure_conv_excerpt.csv"
QUANTILES = ("p50", "p90", "p99")


def lateness_summary(metrics_text: str) -> str:
    """Share of steps released later than each bucket edge, from the server's histogram."""
    buckets: list[tuple[float, float]] = []
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "batchlab_reference_step_lateness_seconds":
            for s in family.samples:
                if s.name.endswith("_bucket"):
                    buckets.append((float(s.labels["le"]), s.value))
    if not buckets:
        return "n/a"
    total = buckets[-1][1]
    if not total:
        return "no steps"
    parts = [f">{edge * 1e3:g} ms {100 * (1 - count / total):.1f}%"
             for edge, count in buckets if edge in (0.001, 0.005, 0.02, 0.1)]
    return f"{int(total)} steps; late " + ", ".join(parts)


def fmt_ms(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value * 1e3:8.2f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default=str(DEFAULT_TRACE),
                   help="trace file (default: harness/data/azure_conv_excerpt.csv in the "
                   "repository, wherever the script is run from)")
    p.add_argument("--limit", type=positive_int, default=100, help="first N requests (100)")
    p.add_argument("--rate", type=positive_float, default=4.0,
                   help="arrivals rescaled to this many requests/s (4)")
    p.add_argument("--protocol", default="openai", choices=("openai", "openai-chat", "tgi"))
    p.add_argument("--model", default="llama-3.1-70b")
    p.add_argument("--gpu", default="a100-80gb")
    p.add_argument("--tp", type=positive_int, default=4)
    p.add_argument("--out", help="keep the replay's run folder here (default: a temp folder)")
    args = p.parse_args()

    if args.out and Path(args.out).is_dir() and any(Path(args.out).iterdir()):
        p.error(f"--out {args.out}: not empty; choose a new or empty folder")
    try:  # before the server starts: a bad trace or setting is one line, exit status 2
        trace = load_trace(args.trace, TraceOptions(limit=args.limit, rate=args.rate))
        config = ReferenceConfig(model=args.model, gpu=args.gpu, tp=args.tp)
    except (TraceError, ConfigError) as exc:  # the message names the file or the field
        p.error(str(exc))
    sim = simulate(trace.requests, config)
    sim_summary = summarize(sim.timelines)
    engine_args = ("--model", args.model, "--gpu", args.gpu, "--tp", str(args.tp))

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out) if args.out else Path(tmp) / "run"
        started = time.perf_counter()
        with launch_server_process(engine_args, log_path=Path(tmp) / "server.log") as server:
            live_summary = asyncio.run(replay(
                trace, ReplayConfig(target_url=server.url, protocol=args.protocol), out))
            metrics_text = httpx.get(server.url + "/metrics", trust_env=False).text
        wall_s = time.perf_counter() - started
        live = {tl.request_id: tl for tl in read_records(out / RECORDS_FILE)}

    print(f"trace {trace.source}: {len(trace.requests)} requests at {args.rate:g} req/s; "
          f"{config.model} on {config.tp}x {config.gpu_spec.name}; protocol {args.protocol}")
    print(f"baseline: the simulation ({sim.num_steps} steps); served run took {wall_s:.1f} s; "
          f"{sum(1 for tl in live.values() if not tl.ok)} failed requests")
    print()
    print(f"{'metric (ms)':<12}{'':>4}" + "".join(f"{q:>10}" for q in QUANTILES))
    for metric in ("ttft_s", "tpot_s"):
        sim_row = [sim_summary[metric][q] for q in QUANTILES]
        live_row = [live_summary[metric][q] for q in QUANTILES]
        print(f"{metric:<12}{'sim':>4}" + "".join(f"{fmt_ms(v):>10}" for v in sim_row))
        print(f"{'':<12}{'live':>4}" + "".join(f"{fmt_ms(v):>10}" for v in live_row))
        ratios = [b / a if a else math.nan for a, b in zip(sim_row, live_row, strict=True)]
        print(f"{'':<12}{'x':>4}" + "".join(f"{r:>10.3f}" for r in ratios))

    print()
    print("per request, served - simulated (ms):   median    p90|d|    max|d|")
    for metric in ("ttft_s", "tpot_s"):
        diffs = []
        for tl in sim.timelines:
            a, b = request_metrics(tl), request_metrics(live[tl.request_id])
            diffs.append(getattr(b, metric) - getattr(a, metric))
        d = np.array([x for x in diffs if math.isfinite(x)])
        print(f"  {metric:<36}{np.median(d) * 1e3:8.2f}  "
              f"{np.percentile(np.abs(d), 90) * 1e3:8.2f}  {np.max(np.abs(d)) * 1e3:8.2f}")

    lag = live_summary.get("send_lag_s", {})
    print()
    print(f"client send lag: p50 {fmt_ms(lag.get('p50')).strip()} ms, "
          f"p99 {fmt_ms(lag.get('p99')).strip()} ms")
    print(f"server step release: {lateness_summary(metrics_text)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
