"""One llama-server, three clients' figures side by side: batchlab, the server's own, vLLM's.

Starts llama.cpp's ``llama-server`` (``make engines``: ``.build/llama-server`` and
``models/small-llama.gguf``) once, then on that same server, one after another:

1. batchlab (``--engine llamacpp --url``): TTFT and TPOT per request, token counts from the
   server's running count (``timings_per_token``);
2. the server's own per-request timings, from its log (``prompt eval time``, ``eval time ... ms
   per token``): time in the slot, without HTTP and queueing;
3. vLLM's ``bench serve`` client (``.venvs/vllm``, when present) on the same load: it counts
   output tokens by re-tokenising the text it received, which llama.cpp streams with special
   tokens as empty text and incomplete UTF-8 held back.

Each client sends N requests of P prompt tokens asking for exactly O output tokens, from C
users (closed loop). The prompt cache is off, so every request computes its prompt. Prints the
figures, then each client's against the server's own (the baseline): the server's timings of
that client's requests, read from the part of its log written while that client ran. TPOT and
the output-token count are printed as ratios (client / server's, tokens / asked); TTFT as the
difference, the client's p50 - the server's prompt-eval p50 in ms, with their ratio beside it.
The difference is the figure to read: the server's prompt time leaves out HTTP, the front end
and the wait for the next step, a roughly fixed cost in ms, so the ratio mostly tracks how
short the prompt is.

    .venv/bin/python bench/llamacpp_side_by_side.py [--requests 32 --users 4 --output 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pyarrow.parquet as pq  # noqa: E402
from arg_types import positive_int  # noqa: E402

from adapters.knobs import Knobs  # noqa: E402
from adapters.process import ServerProcess, free_port  # noqa: E402
from harness.live import run as live  # noqa: E402
from harness.target import RunOptions, TargetSpec  # noqa: E402
from harness.traces import Trace, TraceError, TraceOptions, load_trace  # noqa: E402

BINARY = REPO / ".build" / "llama-server"
MODEL = REPO / "models" / "small-llama"
VLLM_PYTHON = REPO / ".venvs" / "vllm" / "bin" / "python"
PROMPT = re.compile(r"task (\d+) \| prompt eval time =\s+([\d.]+) ms /\s+(\d+) tokens")
EVAL = re.compile(r"task (\d+) \|\s+eval time =\s+([\d.]+) ms /\s+(\d+) tokens \(\s*([\d.]+) ms "
                  r"per token")
VLLM_RUNNER = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
p = FlexibleArgumentParser()
add_cli_args(p)
main(p.parse_args(sys.argv[1:]))
"""


def ms(values: list[float]) -> str:
    if not values:
        return "none"
    p50, mean = statistics.median(values) * 1e3, statistics.fmean(values) * 1e3
    return f"p50 {p50:7.2f} ms  mean {mean:7.2f} ms"


def server_timings(log: str) -> dict[int, dict[str, float]]:
    """Per task: prompt_ms, eval per-token ms and eval tokens, from llama-server's log."""
    out: dict[int, dict[str, float]] = {}
    for task, prompt_ms, _n in PROMPT.findall(log):
        out.setdefault(int(task), {})["prompt_s"] = float(prompt_ms) / 1e3
    for task, _ms, n, per_token in EVAL.findall(log):
        out.setdefault(int(task), {}).update(tpot_s=float(per_token) / 1e3, tokens=int(n))
    return {t: v for t, v in out.items() if "tpot_s" in v}


class ServerLog:
    """llama-server's log files read piece by piece: ``new()`` returns the whole lines written
    since the previous call, so each client's part of the log can be told from the others'."""

    def __init__(self, paths: tuple[Path, ...]) -> None:
        self._offsets = dict.fromkeys(paths, 0)

    def new(self) -> str:
        parts = []
        for path, start in self._offsets.items():
            if not path.exists():
                continue
            with path.open("rb") as f:
                f.seek(start)
                data = f.read()
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
            self._offsets[path] = start + end
            parts.append(data[:end].decode(errors="replace"))
        return "".join(parts)


def timings_since(log: ServerLog, num_requests: int, wait_s: float = 5.0
                  ) -> dict[int, dict[str, float]]:
    """The server's timings of the requests it finished since the last read of ``log``: waits
    up to ``wait_s`` for ``num_requests`` of them (the server writes its log lines from its
    own thread, possibly after the client has its last byte)."""
    text = log.new()
    deadline = time.monotonic() + wait_s
    while len(server_timings(text)) < num_requests and time.monotonic() < deadline:
        time.sleep(0.1)
        text += log.new()
    return server_timings(text)


def baseline_row(own: dict[int, dict[str, float]]) -> dict[str, Any]:
    """The server's own figures for one client's requests, in the clients' shape."""
    return {"ttft": [v["prompt_s"] for v in own.values() if "prompt_s" in v],
            "tpot": [v["tpot_s"] for v in own.values()],
            "tokens": int(sum(v["tokens"] for v in own.values())),
            "num": len(own)}


SLOT_CONTEXT_TOKENS = 1024  # each slot's share of the context: -c slots x this


def batchlab_trace(args: argparse.Namespace) -> Trace:
    return load_trace("synthetic", TraceOptions(num_requests=args.requests, rate=1000.0,
                                                prompt_tokens=args.prompt,
                                                output_tokens=args.output))


def run_batchlab(url: str, trace: Trace, args: argparse.Namespace, out: Path
                 ) -> dict[str, Any]:
    spec = TargetSpec("llamacpp", "attach", knobs=Knobs(given=frozenset()), model=str(MODEL),
                      served_model_name="small", url=url, telemetry_interval_s=0.25)
    live.run_live(spec, trace, out, RunOptions(
        replay={"mode": "closed", "concurrency": args.users, "prompt_salt": "batchlab"},
        write_report=False))
    ok = [r for r in pq.read_table(out / "requests.parquet").to_pylist() if not r["error_kind"]]
    return {
        "ttft": [r["ttft_s"] for r in ok if r["ttft_s"] == r["ttft_s"]],  # not NaN
        "tpot": [r["tpot_s"] for r in ok if r["tpot_s"] == r["tpot_s"]],
        "tokens": sum(r["num_output_tokens"] or 0 for r in ok),
        "num": len(ok),
    }


def run_vllm_client(url: str, args: argparse.Namespace, out: Path) -> dict[str, Any] | None:
    if not VLLM_PYTHON.exists():
        return None
    result = out / "vllm-bench.json"
    argv = [str(VLLM_PYTHON), "-c", VLLM_RUNNER, "--backend", "openai", "--base-url", url,
            "--endpoint", "/v1/completions", "--model", "small", "--tokenizer", str(MODEL),
            "--dataset-name", "random", "--random-input-len", str(args.prompt),
            "--random-output-len", str(args.output), "--num-prompts", str(args.requests),
            "--max-concurrency", str(args.users), "--request-rate", "inf", "--ignore-eos",
            "--temperature", "0", "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--save-result", "--save-detailed", "--result-dir", str(out),
            "--result-filename", result.name, "--disable-tqdm"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False,
                          timeout=600)
    if done.returncode != 0 or not result.exists():
        print(f"vllm bench serve failed ({done.returncode}):\n{done.stderr[-2000:]}")
        return None
    data = json.loads(result.read_text())
    # its own TPOT: (latency - TTFT) / (output tokens it counted - 1), per request
    per = zip(data["latencies"], data["ttfts"], data["output_lens"], strict=False)
    return {
        "ttft": [t for t in data["ttfts"] if t],
        "tpot": [(lat - ttft) / (n - 1) for lat, ttft, n in per if ttft and n > 1],
        "tokens": int(data.get("total_output_tokens") or sum(data["output_lens"])),
        "num": int(data.get("completed") or 0),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=positive_int, default=32,
                   help="requests each client sends (32)")
    p.add_argument("--users", type=positive_int, default=4,
                   help="closed-loop users, requests in flight at a time (4)")
    p.add_argument("--prompt", type=positive_int, default=32, help="prompt tokens (32)")
    p.add_argument("--output", type=positive_int, default=64,
                   help="output tokens asked for, exactly (64)")
    p.add_argument("--slots", type=positive_int, default=4, help="llama-server -np (4)")
    args = p.parse_args()
    if args.prompt + args.output > SLOT_CONTEXT_TOKENS:
        p.error(f"--prompt {args.prompt} + --output {args.output} is more than a slot's "
                f"{SLOT_CONTEXT_TOKENS} tokens of context")
    try:  # before the server starts or its folder is made
        trace = batchlab_trace(args)
    except TraceError as exc:
        p.error(str(exc))
    for path in (BINARY, MODEL, MODEL.with_suffix(".gguf")):
        if not path.exists():
            print(f"{path.relative_to(REPO)} missing: run `make engines`")
            return 2
    work = Path(tempfile.mkdtemp(prefix="llamacpp-bench-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [str(BINARY), "-m", str(MODEL.with_suffix(".gguf")), "--alias", "small",
            "--host", "127.0.0.1", "--port", str(port), "--metrics", "-np", str(args.slots),
            "-c", str(args.slots * SLOT_CONTEXT_TOKENS), "-cb", "--no-cache-prompt",
            "--cache-ram", "0", "-t", "2"]
    print(f"load: {args.requests} requests, {args.prompt} prompt + {args.output} output tokens, "
          f"{args.users} users; llama-server -np {args.slots}; load average "
          f"{os.getloadavg()[0]:.2f}")
    with ServerProcess(argv, log_dir=work, name="llama-server") as server:
        server.start()
        asyncio.run(server.wait_ready(url + "/health", timeout_s=60))
        log = ServerLog((server.stderr_path, server.stdout_path))
        log.new()  # start-up lines
        ours = run_batchlab(url, trace, args, work / "batchlab")
        rows = [("batchlab", ours, baseline_row(timings_since(log, ours["num"])))]
        theirs = run_vllm_client(url, args, work)
        if theirs:
            rows.append(("vllm bench serve", theirs,
                         baseline_row(timings_since(log, theirs["num"]))))
    print(f"\n{'client':<32} {'TTFT':<34} {'TPOT':<34} output tokens")
    for name, fig, own in rows:
        print(f"{name:<32} {ms(fig['ttft']):<34} {ms(fig['tpot']):<34} {fig['tokens']} "
              f"({fig['num']} requests)")
        print(f"{'  llama-server log (baseline)':<32} {ms(own['ttft']):<34} "
              f"{ms(own['tpot']):<34} {own['tokens']} ({own['num']} requests; TTFT = prompt "
              f"eval in the slot)")
    exact = args.requests * args.output
    print(f"\nasked for {exact} output tokens in all ({args.requests} x {args.output}); each "
          f"client against the server's own timings of its requests (TTFT as a difference: "
          f"the server's prompt time leaves out HTTP and the wait for a step, a cost in ms "
          f"whatever the prompt, which a ratio would mix with the prompt's length)")
    status = 0
    for name, fig, own in rows:
        if not own["tpot"] or not own["ttft"]:
            print(f"{name}: no ratio: no line of the server's log written while it ran matched "
                  f"both\n    {PROMPT.pattern}\n    {EVAL.pattern}\n  (has llama-server's log "
                  f"format changed?)")
            status = 1
            continue
        if not fig["tpot"] or not fig["ttft"]:
            print(f"{name}: no ratio: the client measured no TTFT or TPOT")
            continue
        tpot_ratio = statistics.median(fig["tpot"]) / statistics.median(own["tpot"])
        fig_ttft, own_ttft = statistics.median(fig["ttft"]), statistics.median(own["ttft"])
        ttft_extra = fig_ttft - own_ttft
        ttft_ratio = f"{fig_ttft / own_ttft:.2f}x" if own_ttft > 0 else "n/a"
        print(f"{name}: TPOT p50 / server's {tpot_ratio:.3f}; TTFT p50 - server's prompt time "
              f"{ttft_extra * 1e3:+.1f} ms (ratio {ttft_ratio}); output tokens / asked "
              f"{fig['tokens'] / exact:.3f}")
    print(f"(run folder and server log: {work})")
    return status


if __name__ == "__main__":
    sys.exit(main())
