"""``--prompt-salt``: fresh prompts per run, same lengths and prefix sharing, default unchanged."""

from __future__ import annotations

from harness.live.prompts import PromptBuilder, resolve_prompt_salt
from harness.traces import TraceRequest


def requests() -> list[TraceRequest]:
    return [TraceRequest("a", 0.0, 700, 4, prefix_hash_ids=(1, 2)),
            TraceRequest("b", 0.0, 700, 4, prefix_hash_ids=(1, 3)),
            TraceRequest("c", 0.0, 50, 4)]


def ids(builder: PromptBuilder) -> list[tuple[int, ...]]:
    return [builder.build(r).token_ids for r in requests()]


def test_no_salt_keeps_todays_prompts() -> None:
    assert ids(PromptBuilder("openai", seed=3)) == ids(PromptBuilder("openai", seed=3, salt=""))


def test_a_salt_changes_every_prompt_but_not_its_length_or_shared_prefix() -> None:
    plain = ids(PromptBuilder("openai", seed=3))
    salted = ids(PromptBuilder("openai", seed=3, salt="run-2"))
    assert [len(p) for p in salted] == [len(p) for p in plain]
    assert all(s[:16] != p[:16] for s, p in zip(salted, plain, strict=True))  # no cache hit
    assert salted[0][:512] == salted[1][:512] != salted[0][512:]  # the shared block stays shared
    assert ids(PromptBuilder("openai", seed=3, salt="run-2")) == salted  # repeatable


def test_salt_values() -> None:
    assert resolve_prompt_salt(None) == resolve_prompt_salt("none") == ""
    assert resolve_prompt_salt("abc") == "abc"
    first, second = resolve_prompt_salt("auto"), resolve_prompt_salt("auto")
    assert first and second and first != second
