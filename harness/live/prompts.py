"""Synthetic prompts of an exact (or, without a tokenizer, approximate) length.

A trace gives only lengths, so the replay client makes up prompt content. Three ways, recorded in
the run's manifest as the prompt mode:

- ``token_ids``: no tokenizer, and the protocol accepts token ids (OpenAI completions): a list of
  ids drawn from ``SAFE_TOKEN_ID_RANGE``, ordinary tokens in every common vocabulary (Llama 2's
  32,000 up to Llama 3's and Qwen's 128k+). The server counts exactly ``num_prompt_tokens``.
- ``tokenizer_text`` (``--tokenizer PATH``, a local Hugging Face tokenizer): text that the
  engine's tokenizer turns into exactly the trace's token count (special tokens the tokenizer
  adds, such as BOS, included). Built from "word" tokens that re-tokenize to themselves, then
  checked by re-encoding and trimmed or padded until exact.
- ``approx_text``: no tokenizer and a text-only protocol (chat, TGI): common short English
  words, each one token in the usual BPE vocabularies (GPT-2, Llama 2/3, Mistral, Qwen), so
  ``N`` words are close to ``N`` tokens (about 4 characters a token); BOS and a chat template add
  a few more. Requests report ``num_prompt_tokens`` from the trace; the server's count, where it
  sends one, is kept in ``records.jsonl`` as ``server_num_prompt_tokens``.

Prefix sharing: when a trace request carries prefix-block hashes (Mooncake, 512 tokens a block),
block ``k`` of its prompt is derived only from hash ``k`` (a random generator seeded by the
hash), so requests that share leading hashes share that prompt prefix, token for token, and a
prefix cache sees the reuse the trace recorded. Tokens past the hashed blocks come from a
generator seeded by the request id.

Salt: prompts depend only on (seed, request id, prefix hashes), so a second run sends the same
prompts, and a server that caches prompts (llama.cpp by default, vLLM with prefix caching)
serves them from its cache: a much shorter TTFT that belongs to the cache, not the scheduler.
``--prompt-salt`` mixes a per-run string into every seed (``auto``: a fresh one each run,
recorded in the manifest); prefix sharing *within* the run is kept, and lengths are unchanged.
The default (no salt) keeps today's reproducible prompts.
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from harness.live.protocols import Prompt, PromptMode, ProtocolName
from harness.redact import redact_url
from harness.traces import TraceRequest

SAFE_TOKEN_ID_RANGE = (1000, 30000)  # [low, high): plain tokens in every common vocabulary
DEFAULT_PREFIX_BLOCK_NUM_TOKENS = 512  # Mooncake's hash block

# Each is a single token, with its leading space, in GPT-2, Llama 2/3, Mistral and Qwen BPE.
APPROX_WORDS = (
    " the", " of", " and", " to", " in", " is", " that", " for", " it", " as", " was", " with",
    " be", " by", " on", " not", " he", " this", " are", " or", " his", " from", " at", " which",
    " but", " have", " an", " had", " they", " you", " were", " their", " one", " all", " we",
    " can", " her", " has", " there", " been", " if", " more", " when", " will", " would",
    " who", " so", " no", " she", " other", " its", " may", " these", " some", " what", " time",
    " into", " only", " do", " could", " new", " about", " two", " than", " first", " made",
)


class TextTokenizer(Protocol):
    """What prompt synthesis and output counting need from a tokenizer."""

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    @property
    def vocab_size(self) -> int: ...


class _HfTokenizer:
    """A ``transformers`` tokenizer behind ``TextTokenizer``."""

    def __init__(self, tok: Any) -> None:
        self._tok = tok

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    @property
    def vocab_size(self) -> int:
        return len(self._tok)


class _FastTokenizer:
    """A bare ``tokenizers.Tokenizer`` (``tokenizer.json``) behind ``TextTokenizer``."""

    def __init__(self, tok: Any) -> None:
        self._tok = tok

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size())


def load_tokenizer(path: str | Path) -> TextTokenizer:
    """Load a local tokenizer: a Hugging Face model/tokenizer folder or a ``tokenizer.json``.

    Never touches the hub (``HF_HUB_OFFLINE=1``, ``local_files_only``). Uses ``transformers``
    when installed, else the ``tokenizers`` library on the folder's ``tokenizer.json``. Loaded
    once per path and process (``ReplayConfig.validate`` loads it before a run folder is
    claimed, so that a tokenizer that will not load never costs an earlier run's files).
    """
    return _load_tokenizer(str(Path(path).resolve()))


@functools.lru_cache(maxsize=4)
def _load_tokenizer(path: str) -> TextTokenizer:
    p = Path(path)
    if not p.exists():
        raise ValueError(f"--tokenizer: {p} does not exist (a local tokenizer folder is needed)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if p.is_dir():
        try:
            from transformers import AutoTokenizer  # lazy: heavy, and optional
        except ImportError:
            pass
        else:
            try:
                return _HfTokenizer(AutoTokenizer.from_pretrained(str(p), local_files_only=True))
            except Exception as exc:
                if not (p / "tokenizer.json").exists():
                    raise ValueError(f"--tokenizer: cannot load {p}: {exc}") from None
    json_path = p / "tokenizer.json" if p.is_dir() else p
    if not json_path.exists():
        raise ValueError(f"--tokenizer: {p} has no tokenizer.json (install transformers to load "
                         "other tokenizer formats)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError("--tokenizer needs the transformers or tokenizers package "
                         "(pip install tokenizers)") from None
    try:
        return _FastTokenizer(Tokenizer.from_file(str(json_path)))
    except Exception as exc:
        raise ValueError(f"--tokenizer: cannot read {json_path}: {exc}") from None


# ---------------------------------------------------------------- deterministic token streams


def resolve_prompt_salt(value: str | None) -> str:
    """``--prompt-salt``: ``none`` (or nothing) is no salt, ``auto`` a fresh random one for
    this run, anything else is used as given (to repeat a salted run)."""
    if value is None or value.strip().lower() in ("", "none"):
        return ""
    if value.strip().lower() == "auto":
        return secrets.token_hex(6)
    return value


def salted_seed(seed: int, salt: str) -> int:
    """The seed prompts are drawn with: ``seed`` itself without a salt (today's prompts)."""
    return seed if not salt else _seed(seed, "salt", salt)


def _seed(*parts: object) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def draw_indices(
    req: TraceRequest, num_tokens: int, pool_size: int, *, seed: int, block_num_tokens: int
) -> np.ndarray:
    """``num_tokens`` indices into a pool of ``pool_size``; hashed blocks are shared prefixes."""
    parts: list[np.ndarray] = []
    filled = 0
    for h in req.prefix_hash_ids:
        if filled >= num_tokens:
            break
        n = min(block_num_tokens, num_tokens - filled)
        # Always draw the whole block, then cut: a short last block is a prefix of the full one.
        block = np.random.default_rng(_seed(seed, "block", h)).integers(
            0, pool_size, size=block_num_tokens
        )
        parts.append(block[:n])
        filled += n
    if filled < num_tokens:
        rng = np.random.default_rng(_seed(seed, "request", req.request_id))
        parts.append(rng.integers(0, pool_size, size=num_tokens - filled))
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


# ---------------------------------------------------------------- builders


@dataclass(frozen=True, slots=True)
class PromptStats:
    """How many prompts came out at exactly the asked length (tokenizer mode)."""

    num_built: int
    num_inexact: int


class PromptBuilder:
    """Makes the prompt for each trace request, in the mode the protocol and tokenizer allow."""

    def __init__(
        self,
        protocol: ProtocolName,
        tokenizer: TextTokenizer | None = None,
        *,
        seed: int = 0,
        block_num_tokens: int = DEFAULT_PREFIX_BLOCK_NUM_TOKENS,
        salt: str = "",
    ) -> None:
        self.protocol = protocol
        self.tokenizer = tokenizer
        self.salt = salt
        self.seed = salted_seed(seed, salt)
        self.block_num_tokens = block_num_tokens
        self.mode: PromptMode
        if tokenizer is not None:
            self.mode = "tokenizer_text"
            self._pool = np.asarray(word_token_pool(tokenizer), dtype=np.int64)
            # Tokens the server's tokenizer adds around the text (BOS, ...). A chat template adds
            # its own on top, which no client can see without the template.
            self._num_special = 0 if protocol == "openai-chat" else len(
                tokenizer.encode("", add_special_tokens=True)
            )
        elif protocol == "openai":
            self.mode = "token_ids"
        else:
            self.mode = "approx_text"
        self._num_built = 0
        self._num_inexact = 0

    @property
    def stats(self) -> PromptStats:
        return PromptStats(self._num_built, self._num_inexact)

    def build(self, req: TraceRequest) -> Prompt:
        self._num_built += 1
        n = max(req.num_prompt_tokens, 1)
        if self.mode == "token_ids":
            low, high = SAFE_TOKEN_ID_RANGE
            idx = draw_indices(req, n, high - low, seed=self.seed,
                               block_num_tokens=self.block_num_tokens)
            return Prompt("token_ids", token_ids=tuple((idx + low).tolist()))
        if self.mode == "approx_text":
            idx = draw_indices(req, n, len(APPROX_WORDS), seed=self.seed,
                               block_num_tokens=self.block_num_tokens)
            return Prompt("approx_text", text="".join(APPROX_WORDS[i] for i in idx.tolist()))
        return Prompt("tokenizer_text", text=self._exact_text(req, n))

    def _exact_text(self, req: TraceRequest, n: int) -> str:
        tok = self.tokenizer
        assert tok is not None
        target = max(n - self._num_special, 1)
        idx = draw_indices(req, target, len(self._pool), seed=self.seed,
                           block_num_tokens=self.block_num_tokens)
        ids = self._pool[idx].tolist()
        text = tok.decode(ids)
        pad_rng = np.random.default_rng(_seed(self.seed, "pad", req.request_id))
        for _ in range(8):
            got = tok.encode(text, add_special_tokens=False)
            if len(got) == target:
                return text
            if len(got) > target:
                ids = got[:target]
            else:
                extra = self._pool[pad_rng.integers(0, len(self._pool), target - len(got))]
                ids = got + extra.tolist()
            text = tok.decode(ids)
        self._num_inexact += 1
        return text


def word_token_pool(
    tok: TextTokenizer, *, max_pool: int = 2048, max_scan: int = 60000
) -> list[int]:
    """Token ids that behave as whole words: ``t t t`` decodes to space-separated text that
    re-encodes to exactly ``[t, t, t]``. Sequences of them keep their length through a
    decode/encode round trip, because whitespace pre-tokenization never merges across words."""
    vocab = tok.vocab_size
    # Scan a spread of ids (stride coprime with the vocabulary) rather than only the first ones,
    # which are bytes and special tokens in most vocabularies.
    stride = 7919 if vocab % 7919 else 7907
    pool: list[int] = []
    for k in range(min(vocab, max_scan)):
        t = (k * stride) % vocab
        s = tok.decode([t, t, t])
        words = s.split()
        if len(words) != 3 or not words[0].isalpha() or not words[0].isascii():
            continue
        if tok.encode(s, add_special_tokens=False) != [t, t, t]:
            continue
        pool.append(t)
        if len(pool) >= max_pool:
            break
    if len(pool) < 8:
        raise ValueError(
            "--tokenizer: found too few whole-word tokens to build prompts from "
            f"({len(pool)} in {min(vocab, max_scan)} scanned)"
        )
    return sorted(pool)


def count_output_tokens(tok: TextTokenizer, text: str) -> int:
    """Tokens in generated text, as vLLM's benchmark counts them (no special tokens added)."""
    return len(tok.encode(text, add_special_tokens=False)) if text else 0


# ---------------------------------------------------------------- servers that cache prompts


def prompt_cache_hint(base_url: str, *, timeout_s: float = 5.0) -> str | None:
    """Why a running server may answer a repeated prompt from its cache, or None.

    llama.cpp's server caches prompts by default (``--cache-prompt``, and ``--cache-ram``
    keeps idle slots' prompts): it answers ``/props`` with ``total_slots``. vLLM says whether
    prefix caching is on in ``vllm:cache_config_info``. A server that answers neither is not
    known to cache. Two GETs, before anything is measured.
    """
    import httpx  # lazy: the prompt builder itself needs no HTTP

    root = base_url.rstrip("/")
    with httpx.Client(timeout=timeout_s, trust_env=False) as http:
        try:
            props = http.get(root + "/props")
            body = props.json() if props.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            body = None
        if isinstance(body, dict) and ("total_slots" in body
                                       or "default_generation_settings" in body):
            return ("llama.cpp's server caches prompts unless started with --no-cache-prompt "
                    "(and keeps idle slots' prompts in --cache-ram)")
        try:
            metrics = http.get(root + "/metrics")
            text = metrics.text if metrics.status_code == 200 else ""
        except httpx.HTTPError:
            text = ""
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info") and 'enable_prefix_caching="True"' in line:
            return "vLLM runs with prefix caching on"
    return None


def prompt_cache_warning(base_url: str, salt: str) -> str | None:
    """The console warning for an attached server that may cache prompts (None: no cause);
    the URL's credentials masked (``harness.redact.redact_url``)."""
    if salt:
        return None
    why = prompt_cache_hint(base_url)
    if why is None:
        return None
    return (f"warning: {redact_url(base_url)} may answer repeated prompts from its cache: "
            f"{why}. batchlab's prompts are the same run after run (seed, request id), so a "
            "second run can measure the cache, not the scheduler; pass --prompt-salt auto for "
            "fresh prompts each run")
