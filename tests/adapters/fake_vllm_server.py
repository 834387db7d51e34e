"""A stand-in for vLLM's OpenAI server, for launch tests without vLLM.

Accepts the argv the vLLM adapter builds (``-m vllm.entrypoints.openai.api_server --model M
--port P ...``), streams tokens on a schedule (``harness.live.testing``), and adds what the adapter
and telemetry expect from vLLM: ``/version`` and a Prometheus ``/metrics`` with vLLM's names.
``--max-num-seqs`` is honoured: requests beyond it wait, and are counted as waiting. Chunked
prefill is logged as vLLM logs it at start-up: on unless ``--no-enable-chunked-prefill``, or
always with ``--ignore-no-chunking`` (as V1 releases that ignore the flag do).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import Any

from harness.live.testing import ScheduledStreamServer, _respond, serve_until_signal


class FakeVllm(ScheduledStreamServer):
    def __init__(self, *, max_num_seqs: int, crash_after_requests: int | None = None,
                 **kw: Any) -> None:
        super().__init__(**kw)
        self.slots = asyncio.Semaphore(max_num_seqs)
        self.crash_after_requests = crash_after_requests
        self.num_finished = 0
        self.num_running = 0
        self.num_waiting = 0
        self.num_steps = 0

    async def _dispatch(self, method: str, path: str, headers: dict[str, str], body: bytes,
                        recv_ns: int, writer: asyncio.StreamWriter) -> bool:
        if method == "GET" and path == "/version":
            return await _respond(writer, 200, b'{"version": "0.0.0-fake"}')
        if method == "GET" and path == "/metrics":
            self.num_steps += 1
            text = (
                "# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{engine="0",model_name="m"}} {self.num_running}\n'
                "# TYPE vllm:num_requests_waiting gauge\n"
                f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {self.num_waiting}\n'
                "# TYPE vllm:gpu_cache_usage_perc gauge\n"
                f'vllm:gpu_cache_usage_perc{{engine="0",model_name="m"}} {0.1 * self.num_running}\n'
                "# TYPE vllm:iteration_tokens_total histogram\n"
                f'vllm:iteration_tokens_total_sum{{engine="0"}} {4.0 * self.num_steps}\n'
                f'vllm:iteration_tokens_total_count{{engine="0"}} {self.num_steps}\n'
            )
            return await _respond(writer, 200, text.encode())
        if method == "POST" and path.startswith("/v1/"):
            self.num_waiting += 1
            async with self.slots:
                self.num_waiting -= 1
                self.num_running += 1
                try:
                    return await super()._dispatch(method, path, headers, body, recv_ns, writer)
                finally:
                    self.num_running -= 1
                    self.num_finished += 1
                    if self.num_finished == self.crash_after_requests:
                        # dies a moment after the response's last bytes left: the client has it
                        asyncio.get_running_loop().call_later(
                            0.2, os.kill, os.getpid(), signal.SIGKILL)
        return await super()._dispatch(method, path, headers, body, recv_ns, writer)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("-m", dest="module")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--fail", help="exit at once with this message (a bad flag)")
    p.add_argument("--no-enable-chunked-prefill", action="store_true")
    p.add_argument("--ignore-no-chunking", action="store_true")
    p.add_argument("--crash-after-requests", type=int,
                   help="die (SIGKILL itself) just after it finished this many requests")
    args, _unknown = p.parse_known_args()
    print(f"fake vllm argv: {sys.argv[1:]}", flush=True)
    if args.fail:
        print(args.fail, file=sys.stderr, flush=True)
        return 2
    if args.ignore_no_chunking or not args.no_enable_chunked_prefill:
        print("INFO [scheduler.py:308] Chunked prefill is enabled with "
              "max_num_batched_tokens=8192.", file=sys.stderr, flush=True)

    async def serve() -> None:
        server = FakeVllm(max_num_seqs=args.max_num_seqs, host=args.host, port=args.port,
                          ttft_s=0.01, itl_s=0.01,
                          crash_after_requests=args.crash_after_requests)
        await serve_until_signal(server)

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
