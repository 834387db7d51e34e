"""How many tokens a text prompt is, for the served engine."""

from __future__ import annotations

import re
import zlib

from harness.live.prompts import TextTokenizer, load_tokenizer


class PromptCounter:
    """How many tokens a text prompt is: a local tokenizer's count, else words + punctuation.

    Without a tokenizer, a run of letters/digits is one token and so is each other non-space
    character ("Hello, world!" is 4). That is exact for the replay client's approximate-text
    prompts (one common word per token) and close for English prose. Token-id prompts never
    come here: they count exactly.
    """

    _PIECES = re.compile(r"\w+|[^\w\s]")

    def __init__(self, tokenizer_path: str | None = None) -> None:
        self.tokenizer_path = tokenizer_path
        self._tokenizer: TextTokenizer | None = None
        if tokenizer_path is not None:
            self._tokenizer = load_tokenizer(tokenizer_path)

    @property
    def rule(self) -> str:
        if self.tokenizer_path is not None:
            return f"tokenizer {self.tokenizer_path} (special tokens included)"
        return "words and punctuation marks, one token each"

    def count(self, text: str) -> int:
        if self._tokenizer is not None:
            return len(self._tokenizer.encode(text, add_special_tokens=True))
        return sum(1 for _ in self._PIECES.finditer(text))

    def keys(self, text: str) -> tuple[int, ...]:
        """The prompt's token identities, for prefix caching: the tokenizer's ids, else a
        stable hash of each word or punctuation mark (the same pieces ``count`` counts)."""
        if self._tokenizer is not None:
            return tuple(self._tokenizer.encode(text, add_special_tokens=True))
        return tuple(zlib.crc32(m.group().encode()) for m in self._PIECES.finditer(text))
