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
no failures. The baseline is ``vllm bench serve`` (vLLM's serving benchmark, from the
``.venvs/vllm`` environment when it imports) on the same server in the same run, at the same
rate: the script prints the ratio of the two clients' figures, or why it was skipped.

    .venv/bin/python bench/client_capacity.py [--rates 25,50,...] [--step-s 4] [--no-vllm]

Takes about two minutes on two cores, most of it in the steps and vLLM's import.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
LAG_LIMIT_S = 0.001
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
    recv_delay: list[float] = []
    for tl in ok:
        log = server_log.get(tl.request_id)
        if not log or len(log) - 1 != len(tl.chunk_times_s):
            continue
        client_ns = np.asarray(tl.chunk_times_s) * 1e9 + t0_ns
        recv_delay.extend(((client_ns - np.asarray(log[1:], dtype=np.float64)) / 1e9).tolist())
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
        "ttft_p50": pct([tl.ttft_s() for tl in ok], 50),
        "itl_p50": pct(np.concatenate([np.diff(tl.chunk_times_s) for tl in ok]) if ok else [],
                       50),
        "req_s": summary["throughput"]["requests_per_s"],
    }


HEADER = ("  rate  sent/s  failed  lag p50  lag p99 (ms)   tok/s   TTFT err p50   p99   "
          "ITL err p50   p99   recv delay p50   p99 (ms)")


def line(r: dict[str, Any]) -> str:
    return (f"{r['rate']:6g} {r['sent_rate']:7.1f} {r['failed']:7d} {ms(r['lag_p50'])} "
            f"{ms(r['lag_p99'])}      {r['tok_s']:7.0f}  {ms(r['ttft_err_p50'])} "
            f"{ms(r['ttft_err_p99'])}  {ms(r['itl_err_p50'])} {ms(r['itl_err_p99'])}  "
            f"{ms(r['recv_p50'])}        {ms(r['recv_p99'])}")


# ---------------------------------------------------------------- vLLM's client, the baseline

VLLM_PYTHON = REPO / ".venvs" / "vllm" / "bin" / "python"

_VLLM_DRIVER = r"""
import json, sys
from vllm.benchmarks.serve import add_cli_args, main
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
args = parser.parse_args(sys.argv[1:])
result = main(args)
keep = ("completed", "failed", "duration", "request_throughput", "output_throughput",
        "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms", "median_tpot_ms")
print("BATCHLAB_RESULT " + json.dumps({k: result.get(k) for k in keep}))
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


def vllm_available() -> str | None:
    """None when vLLM's client can run, else why not."""
    if not VLLM_PYTHON.exists():
        return (f"{VLLM_PYTHON.relative_to(REPO)} does not exist "
                "(scripts/setup_engines.sh builds it)")
    probe = subprocess.run([str(VLLM_PYTHON), "-c", "import vllm.benchmarks.serve"],
                           capture_output=True, text=True, timeout=180, check=False)
    if probe.returncode != 0:
        return "`import vllm.benchmarks.serve` failed: " + probe.stderr.strip().splitlines()[-1]
    return None


def run_vllm(url: str, rate: float, num: int, tokenizer: Path) -> dict[str, Any] | str:
    argv = [
        str(VLLM_PYTHON), "-c", _VLLM_DRIVER,
        "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
        "--model", "loopback", "--tokenizer", str(tokenizer),
        "--dataset-name", "random", "--random-input-len", str(PROMPT_TOKENS),
        "--random-output-len", str(OUTPUT_TOKENS), "--random-range-ratio", "0",
        "--num-prompts", str(num), "--request-rate", str(rate), "--burstiness", "inf",
        "--ignore-eos", "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False,
                          env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                               "PATH": "/usr/bin:/bin", "VLLM_LOGGING_LEVEL": "WARNING"})
    for out_line in proc.stdout.splitlines():
        if out_line.startswith("BATCHLAB_RESULT "):
            result: dict[str, Any] = json.loads(out_line.split(" ", 1)[1])
            return result
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return "vllm bench serve failed: " + " | ".join(tail)


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
              f"{ITL_S * 1e3:g} ms; {OUTPUT_TOKENS} output tokens a request; "
              f"constant-rate arrivals, {args.step_s:g} s per rate")
        print(HEADER)
        with tempfile.TemporaryDirectory() as tmp:
            for rate in rates:
                r = step(url, rate, args.step_s, Path(tmp) / f"r{rate:g}")
                results.append(r)
                print(line(r), flush=True)
                if r["lag_p99"] > 5 * LAG_LIMIT_S or r["failed"]:
                    break  # well past the limit: higher rates only take longer
            passing = [r for r in results if r["lag_p99"] < LAG_LIMIT_S and not r["failed"]]
            if passing:
                best = max(passing, key=lambda r: r["rate"])
                print(f"\nhighest rate with send-lag p99 < {LAG_LIMIT_S * 1e3:g} ms: "
                      f"{best['rate']:g} req/s, {best['tok_s']:.0f} streamed tok/s "
                      f"(send lag p99 {best['lag_p99'] * 1e3:.3f} ms)")
            else:
                best = results[0]
                print(f"\nno rate kept send-lag p99 under {LAG_LIMIT_S * 1e3:g} ms")
            low = results[0]
            print(f"timing error at {low['rate']:g} req/s: TTFT p50 {ms(low['ttft_err_p50'])} "
                  f"p99 {ms(low['ttft_err_p99'])} ms; ITL p50 {ms(low['itl_err_p50'])} "
                  f"p99 {ms(low['itl_err_p99'])} ms (measured - schedule, includes the "
                  f"server's own sleep jitter); client receive delay p50 {ms(low['recv_p50'])} "
                  f"p99 {ms(low['recv_p99'])} ms")
            print(f"harness wall time {time.perf_counter() - wall0:.1f} s")

            if args.no_vllm:
                print("vllm bench serve: skipped (--no-vllm)")
                return 0
            why = vllm_available()
            if why is not None:
                print(f"vllm bench serve: skipped: {why}")
                return 0
            make_tokenizer(Path(tmp) / "tok")
            httpx.get(f"{url}/_log", timeout=30)  # drop the log of earlier steps
            for rate in sorted({low["rate"], best["rate"]}):
                num = max(int(rate * args.step_s), 1)
                v = run_vllm(url, rate, num, Path(tmp) / "tok")
                ours = next(r for r in results if r["rate"] == rate)
                if isinstance(v, str):
                    print(f"vllm bench serve at {rate:g} req/s: {v}")
                    continue
                print(f"vllm bench serve at {rate:g} req/s: {v['completed']} done, "
                      f"{v['request_throughput']:.1f} req/s, {v['output_throughput']:.0f} tok/s, "
                      f"TTFT p50 {v['median_ttft_ms']:.3f} ms, ITL p50 {v['median_itl_ms']:.3f} ms")
                print(f"  ratio batchlab / vllm: req/s "
                      f"{ours['req_s'] / v['request_throughput']:.3f}, tok/s {ours['tok_s'] / v['output_throughput']:.3f}, TTFT p50 "
                      f"{ours['ttft_p50'] * 1e3 / v['median_ttft_ms']:.3f}, ITL p50 "
                      f"{ours['itl_p50'] * 1e3 / v['median_itl_ms']:.3f}; TTFT error vs the "
                      f"schedule: batchlab {ours['ttft_err_p50'] * 1e3:.3f} ms, vllm "
                      f"{v['median_ttft_ms'] - TTFT_S * 1e3:.3f} ms")
            print(f"total wall time {time.perf_counter() - wall0:.1f} s")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
