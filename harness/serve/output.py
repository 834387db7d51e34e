"""What every response is made of: the scripted output tokens, and compact JSON.

The reference never samples: token ``i`` of every response is ``OUTPUT_WORDS[i % 10]``, each
one token (with its leading space) in GPT-2, Llama 2/3, Mistral and Qwen BPE, so a client that
re-tokenizes the text counts the right number.
"""

from __future__ import annotations

import json
from typing import Any

OUTPUT_WORDS = (" the", " of", " and", " to", " in", " is", " that", " for", " it", " as")
OUTPUT_TOKEN_ID_BASE = 1000  # token i has id OUTPUT_TOKEN_ID_BASE + i % len(OUTPUT_WORDS)


def output_token_text(index: int) -> str:
    return OUTPUT_WORDS[index % len(OUTPUT_WORDS)]


def output_token_id(index: int) -> int:
    return OUTPUT_TOKEN_ID_BASE + index % len(OUTPUT_WORDS)


def output_text(num_tokens: int) -> str:
    return "".join(output_token_text(i) for i in range(num_tokens))


def dumps(obj: Any) -> bytes:
    """JSON without spaces, as an SSE event's payload."""
    return json.dumps(obj, separators=(",", ":")).encode()
