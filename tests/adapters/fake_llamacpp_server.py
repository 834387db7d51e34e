"""A stand-in for llama.cpp's ``llama-server``, reproducing the quirks batchlab must survive.

Streams tokens on a schedule (``harness.live.testing``) and adds what llama-server does
differently from vLLM (tools/server in llama.cpp commit 0c1e570, the llama-cpp-python 0.3.36
sdist):

- ``/props`` (``total_slots``, ``default_generation_settings.n_ctx``, ``build_info``) and
  ``/slots`` describe the server; ``/metrics`` uses the ``llamacpp:*`` names;
- ``-np`` slots: requests beyond them wait, counted as ``llamacpp:requests_deferred``;
- a token-id prompt with an id outside the vocabulary is refused with HTTP 400 and
  ``Prompt contains invalid tokens``;
- prompts are cached (unless ``--no-cache-prompt``): a prompt seen before gets its first token
  after ``--cached-ttft-s`` instead of ``--ttft-s``;
- no running usage on every event (``continuous_usage_stats`` is ignored), only a last one;
- ``--empty-text``: every event carries empty text (what llama-server streams for special
  tokens); with ``timings_per_token`` each event still carries ``timings.predicted_n``, the
  server's running count, and without it nothing says that the events were tokens.

Run as ``python fake_llamacpp_server.py -m MODEL.gguf --port P [-np N] [-c C] ...`` (the argv
the llamacpp adapter builds; unknown flags are ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from harness.live.testing import ScheduledStreamServer, _respond, serve_until_signal


class FakeLlamaServer(ScheduledStreamServer):
    def __init__(self, *, num_slots: int = 4, n_ctx: int = 4096, vocab_size: int = 2048,
                 cache_prompt: bool = True, cached_ttft_s: float = 0.002,
                 empty_text: bool = False, **kw: Any) -> None:
        super().__init__(**kw)
        self.num_slots = num_slots
        self.n_ctx = n_ctx
        self.vocab_size = vocab_size
        self.cache_prompt = cache_prompt
        self.cached_ttft_s = cached_ttft_s
        self.empty_text = empty_text
        self.slots = asyncio.Semaphore(num_slots)
        self.num_running = 0
        self.num_deferred = 0
        self.num_decode = 0
        self.seen_prompts: set[str] = set()
        self.num_cache_hits = 0
        self._timings_per_token: set[str] = set()  # request ids that asked for it

    async def _dispatch(self, method: str, path: str, headers: dict[str, str], body: bytes,
                        recv_ns: int, writer: asyncio.StreamWriter) -> bool:
        if method == "GET" and path == "/props":
            props = {
                "default_generation_settings": {"n_ctx": self.n_ctx // self.num_slots,
                                                "params": {"n_predict": -1}},
                "total_slots": self.num_slots, "model_path": "fake.gguf",
                "build_info": "b0-fake", "endpoint_metrics": True,
            }
            return await _respond(writer, 200, json.dumps(props).encode())
        if method == "GET" and path == "/slots":
            slots = [{"id": i, "n_ctx": self.n_ctx // self.num_slots, "is_processing": False}
                     for i in range(self.num_slots)]
            return await _respond(writer, 200, json.dumps(slots).encode())
        if method == "GET" and path == "/_cache":  # for tests: how often the cache answered
            payload = {"num_cache_hits": self.num_cache_hits, "num_prompts": len(self.seen_prompts)}
            return await _respond(writer, 200, json.dumps(payload).encode())
        if method == "GET" and path == "/metrics":
            self.num_decode += 1
            text = (
                "# TYPE llamacpp:requests_processing gauge\n"
                f"llamacpp:requests_processing {self.num_running}\n"
                "# TYPE llamacpp:requests_deferred gauge\n"
                f"llamacpp:requests_deferred {self.num_deferred}\n"
                "# TYPE llamacpp:n_decode_total counter\n"
                f"llamacpp:n_decode_total {self.num_decode}\n"
            )
            return await _respond(writer, 200, text.encode())
        if method == "POST" and path.startswith("/v1/"):
            try:
                request = json.loads(body) if body else {}
            except ValueError:
                request = {}
            prompt = request.get("prompt")
            if isinstance(prompt, list) and any(
                    not isinstance(t, int) or not 0 <= t < self.vocab_size for t in prompt):
                error = {"error": {"code": 400, "message": "Prompt contains invalid tokens",
                                   "type": "invalid_request_error"}}
                return await _respond(writer, 400, json.dumps(error).encode())
            key = json.dumps(prompt if prompt is not None else request.get("messages"))
            cached = self.cache_prompt and request.get("cache_prompt", True) \
                and key in self.seen_prompts
            self.seen_prompts.add(key)
            self.num_cache_hits += int(bool(cached))
            self.num_deferred += 1
            # llama-server has include_usage (a usage on the last event) but no running usage
            # on every event: continuous_usage_stats is ignored (tools/server/server-schema.cpp)
            options = request.get("stream_options")
            if isinstance(options, dict) and options.pop("continuous_usage_stats", None):
                body = json.dumps(request).encode()
            rid = headers.get("x-request-id") or f"anon-{self.stats.num_requests}"
            if request.get("timings_per_token"):
                self._timings_per_token.add(rid)
            async with self.slots:
                self.num_deferred -= 1
                self.num_running += 1
                # the schedule counts from the read instant: a cache hit starts that much earlier
                start_ns = recv_ns - round((self.ttft_s - self.cached_ttft_s) * 1e9 * cached)
                try:
                    return await super()._dispatch(method, path, headers, body, start_ns, writer)
                finally:
                    self.num_running -= 1
        return await super()._dispatch(method, path, headers, body, recv_ns, writer)

    def _event(self, protocol: str, rid: str, index: int, n: int, sent: int, last: bool,
               finish_reason: str, continuous: bool, details: bool) -> dict[str, Any]:
        obj = super()._event(protocol, rid, index, n, sent, last, finish_reason, continuous,
                             details)
        if self.empty_text:
            for choice in obj.get("choices", []):
                if "text" in choice:
                    choice["text"] = ""
                if isinstance(choice.get("delta"), dict):
                    choice["delta"]["content"] = ""
        if rid in self._timings_per_token:
            obj["timings"] = {"predicted_n": sent, "predicted_ms": sent * self.itl_s * 1e3}
        return obj


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("-m", dest="model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("-np", dest="num_slots", type=int, default=4)
    p.add_argument("-c", dest="n_ctx", type=int, default=4096)
    p.add_argument("-cb", "-nocb", dest="cont_batching", action="store_true")  # not "-c b"
    p.add_argument("--no-cache-prompt", action="store_true")
    p.add_argument("--ttft-s", type=float, default=0.03)
    p.add_argument("--cached-ttft-s", type=float, default=0.002)
    p.add_argument("--itl-s", type=float, default=0.005)
    p.add_argument("--empty-text", action="store_true")
    p.add_argument("--n-vocab", type=int, default=2048)
    args, _unknown = p.parse_known_args()
    print(f"fake llama-server argv: {sys.argv[1:]}", flush=True)

    async def serve() -> None:
        server = FakeLlamaServer(num_slots=args.num_slots, n_ctx=args.n_ctx,
                                 vocab_size=args.n_vocab,
                                 cache_prompt=not args.no_cache_prompt,
                                 cached_ttft_s=args.cached_ttft_s, empty_text=args.empty_text,
                                 host=args.host, port=args.port, ttft_s=args.ttft_s,
                                 itl_s=args.itl_s)
        await serve_until_signal(server)

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
