"""Counting text prompts without a tokenizer (``harness.serve.prompts``)."""

from __future__ import annotations

from harness.serve.output import OUTPUT_WORDS
from harness.serve.prompts import PromptCounter


def test_prompt_counter_counts_words_and_punctuation() -> None:
    counter = PromptCounter()
    assert counter.count("Hello, world!") == 4
    assert counter.count("".join(OUTPUT_WORDS * 3)) == 3 * len(OUTPUT_WORDS)
    assert counter.count("   ") == 0
