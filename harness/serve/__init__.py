"""The reference engine served over HTTP: vLLM's OpenAI routes, TGI's routes, Prometheus metrics.

The same ``EngineCore`` (scheduler + cost-model executor) that ``harness.sim`` drives on a
virtual clock runs here on the wall clock, one step at a time, in an asyncio loop (``loop``).
docs/reference-server.md has the details of what a client sees:

- Output: the reference never samples EOS, so every request produces exactly its
  ``max_tokens`` / ``max_new_tokens`` tokens (``ignore_eos`` and ``min_tokens`` are accepted and
  change nothing). Token ``i`` is the word ``OUTPUT_WORDS[i % len(OUTPUT_WORDS)]``, one token in
  common BPE vocabularies, so clients can count tokens by text (``output``).
- Prompt length: a list of token ids counts exactly; text is counted by ``PromptCounter``
  (a local tokenizer when given, else one token per word and per punctuation mark; ``prompts``).
- A request the engine can never run (too long for ``max_model_len`` or for the whole KV
  cache) is refused before streaming: HTTP 400 with vLLM's error body on the OpenAI routes
  (``openai``), TGI's validation error on TGI's (``tgi``: 422 on ``/generate``; HTTP 200 and an
  error event on ``/generate_stream``, as TGI does).
- A client that disconnects aborts its request: it leaves the scheduler with its KV blocks
  freed and is counted as aborted in ``/metrics`` (``cancel``).
- A request reaches the scheduler the profile's ``frontend_latency_s`` after the server
  received it, as ``simulate`` delays each arrival; TTFT and E2E include it (``loop``).

Modules: ``app`` (the Starlette app, ``serve``, a server on a thread), ``loop`` (the wall-clock
step loop), ``openai``, ``tgi``, ``cancel`` (abort on disconnect), ``metrics`` (Prometheus),
``prompts``, ``output``, ``bodies`` (request fields and ``ApiError``), ``process`` (the server
in a child process).
"""

from harness.serve.app import (
    ReferenceServer,
    RunningServer,
    ServerOptions,
    serve,
    start_server_in_thread,
)
from harness.serve.loop import Rejection, ServedEngine, TokenStream
from harness.serve.output import OUTPUT_WORDS, output_text, output_token_id, output_token_text
from harness.serve.process import ReferenceChild, launch_server_process
from harness.serve.prompts import PromptCounter

__all__ = [
    "OUTPUT_WORDS",
    "PromptCounter",
    "ReferenceChild",
    "ReferenceServer",
    "Rejection",
    "RunningServer",
    "ServedEngine",
    "ServerOptions",
    "TokenStream",
    "launch_server_process",
    "output_text",
    "output_token_id",
    "output_token_text",
    "serve",
    "start_server_in_thread",
]
