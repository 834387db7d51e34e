"""Synthetic prompts: exact lengths with a tokenizer, token ids without, shared prefix blocks."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from harness.live.prompts import (
    APPROX_WORDS,
    SAFE_TOKEN_ID_RANGE,
    PromptBuilder,
    count_output_tokens,
    load_tokenizer,
)
from harness.traces import TraceRequest

tokenizers = pytest.importorskip("tokenizers")

WORDS = ["alpha", "beta", "gamma", "delta", "hello", "world", "cat", "dog", "run", "blue",
         "red", "green", "the", "of", "and", "quick", "brown", "fox", "jumps", "over", "lazy"]


def _word_level(tmp_path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[UNK]": 0, "[BOS]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[BOS] $A",
                                                       special_tokens=[("[BOS]", 1)])
    out = tmp_path / "wordlevel"
    out.mkdir()
    tok.save(str(out / "tokenizer.json"))
    return out


def _byte_level_bpe(tmp_path: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(40)) for _ in range(200)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    out = tmp_path / "bpe"
    out.mkdir()
    tok.save(str(out / "tokenizer.json"))
    return out


def req(rid: str, n: int, hashes: tuple[int, ...] = ()) -> TraceRequest:
    return TraceRequest(rid, 0.0, n, 4, prefix_hash_ids=hashes)


def test_token_ids_without_tokenizer() -> None:
    b = PromptBuilder("openai")
    assert b.mode == "token_ids"
    p = b.build(req("a", 700))
    assert len(p.token_ids) == 700
    low, high = SAFE_TOKEN_ID_RANGE
    assert all(low <= t < high for t in p.token_ids)
    assert b.build(req("a", 700)) == p  # deterministic
    assert b.build(req("b", 700)) != p


def test_shared_hashes_share_the_prefix() -> None:
    b = PromptBuilder("openai", block_num_tokens=16)
    x = b.build(req("x", 40, (7, 8, 9))).token_ids
    y = b.build(req("y", 45, (7, 8, 10))).token_ids
    z = b.build(req("z", 20, (7, 8))).token_ids
    assert x[:32] == y[:32]
    assert x[32:40] != y[32:40]
    assert z == x[:20]  # a short last block is a prefix of the full block


def test_approx_text_is_one_word_per_token() -> None:
    for protocol in ("openai-chat", "tgi"):
        b = PromptBuilder(protocol)  # type: ignore[arg-type]
        assert b.mode == "approx_text"
        text = b.build(req("a", 300, (1, 2))).text
        assert len(text.split()) == 300
        assert all(f" {w}" in APPROX_WORDS for w in text.split())
    b = PromptBuilder("tgi", block_num_tokens=8)
    s1 = b.build(req("a", 20, (1, 2))).text.split()
    s2 = b.build(req("b", 20, (1, 3))).text.split()
    assert s1[:8] == s2[:8] and s1 != s2


@pytest.mark.parametrize("kind", ["wordlevel", "bpe"])
@pytest.mark.parametrize("protocol", ["openai", "openai-chat", "tgi"])
def test_tokenizer_text_has_the_exact_length(tmp_path: Path, kind: str, protocol: str) -> None:
    path = _word_level(tmp_path) if kind == "wordlevel" else _byte_level_bpe(tmp_path)
    tok = load_tokenizer(path)
    b = PromptBuilder(protocol, tok, block_num_tokens=32)  # type: ignore[arg-type]
    assert b.mode == "tokenizer_text"
    for n in (1, 2, 17, 64, 129, 500):
        text = b.build(req(f"r{n}", n, (11, 12))).text
        # completions and TGI: what the server counts, BOS included; chat: the message content
        special = protocol != "openai-chat"
        assert len(tok.encode(text, add_special_tokens=special)) == max(n, 2 if special else 1)
    assert b.stats.num_inexact == 0


def test_tokenizer_prompts_share_prefixes(tmp_path: Path) -> None:
    tok = load_tokenizer(_byte_level_bpe(tmp_path))
    b = PromptBuilder("tgi", tok, block_num_tokens=32)
    a = tok.encode(b.build(req("a", 100, (5, 6, 7))).text, add_special_tokens=False)
    c = tok.encode(b.build(req("c", 100, (5, 6, 8))).text, add_special_tokens=False)
    assert a[:60] == c[:60]
    assert a != c


def test_count_output_tokens(tmp_path: Path) -> None:
    tok = load_tokenizer(_word_level(tmp_path) / "tokenizer.json")
    assert count_output_tokens(tok, "hello world cat") == 3
    assert count_output_tokens(tok, "") == 0


def test_tokenizer_errors_name_the_option(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--tokenizer: .* does not exist"):
        load_tokenizer(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="--tokenizer"):
        load_tokenizer(tmp_path / "empty")
