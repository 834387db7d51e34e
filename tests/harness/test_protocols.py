"""Request bodies and recorded SSE streams of each protocol, including every error case."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.live.protocols import (
    Prompt,
    SseDecoder,
    SseEvent,
    StreamParser,
    build_body,
    error_kind_for_status,
    parse_stream,
)

DATA = Path(__file__).resolve().parent.parent / "data"


def fixture(name: str) -> bytes:
    return (DATA / f"sse_{name}.txt").read_bytes()


# name -> protocol, error_kind, completed, chunk tokens, usage output tokens, finish_reason
CASES = {
    "openai_completions_usage": ("openai", None, True, (1, 1, 1, 1), 4, "length"),
    "openai_completions_plain": ("openai", None, True, (1, 1, 1), None, "length"),
    "openai_completions_multitoken": ("openai", None, True, (1, 3, 2), 6, "length"),
    "openai_completions_error_event": ("openai", "stream_error", False, (1, 1), 2, None),
    "openai_completions_flat_overload": ("openai", "overloaded", False, (), None, None),
    "openai_completions_cut": ("openai", "stream_cut", False, (1, 1), None, None),
    "openai_completions_malformed": ("openai", "invalid_json", False, (1,), None, None),
    "openai_chat_usage": ("openai-chat", None, True, (1, 1, 1), 3, "length"),
    "openai_chat_tgi_error": ("openai-chat", "stream_error", False, (1,), None, None),
    "tgi_generate_stream": ("tgi", None, True, (1, 1, 1), 3, "eos_token"),
    "tgi_overloaded": ("tgi", "overloaded", False, (), None, None),
    "tgi_error_event": ("tgi", "stream_error", False, (1,), None, None),
    "tgi_cut": ("tgi", "stream_cut", False, (1, 1), None, None),
    "tgi_malformed": ("tgi", "invalid_json", False, (1,), None, None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_recorded_stream(name: str) -> None:
    protocol, kind, completed, tokens, usage, finish = CASES[name]
    out = parse_stream(protocol, [fixture(name)])  # type: ignore[arg-type]
    assert out.error_kind == kind, out.error_message
    assert out.completed is completed
    assert out.chunk_num_tokens == tokens
    assert out.usage_num_output_tokens == usage
    assert out.finish_reason == finish
    if kind is not None:
        assert out.error_message


@pytest.mark.parametrize("name", sorted(CASES))
def test_byte_by_byte_and_crlf_give_the_same_outcome(name: str) -> None:
    protocol = CASES[name][0]
    raw = fixture(name)
    whole = parse_stream(protocol, [raw])  # type: ignore[arg-type]
    bytewise = parse_stream(protocol, [raw[i:i + 1] for i in range(len(raw))])  # type: ignore[arg-type]
    crlf = parse_stream(protocol, [raw.replace(b"\n", b"\r\n")])  # type: ignore[arg-type]
    for other in (bytewise, crlf):
        assert other.error_kind == whole.error_kind
        assert other.chunk_num_tokens == whole.chunk_num_tokens
        assert other.text == whole.text


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=12),
       name=st.sampled_from(sorted(CASES)))
def test_any_split_gives_the_same_outcome(cuts: list[int], name: str) -> None:
    protocol = CASES[name][0]
    raw = fixture(name)
    points = sorted({0, len(raw), *(c % (len(raw) + 1) for c in cuts)})
    pieces = [raw[a:b] for a, b in itertools.pairwise(points)]
    out = parse_stream(protocol, pieces)  # type: ignore[arg-type]
    ref = parse_stream(protocol, [raw])  # type: ignore[arg-type]
    assert (out.error_kind, out.chunk_num_tokens, out.text, out.usage_num_output_tokens) == (
        ref.error_kind, ref.chunk_num_tokens, ref.text, ref.usage_num_output_tokens)


def test_chunk_instants_are_the_read_instants() -> None:
    raw = fixture("openai_completions_usage")
    events = raw.split(b"\n\n")
    pieces = [e + b"\n\n" for e in events if e]
    out = parse_stream("openai", pieces, times_ns=[100, 200, 300, 400, 500, 600])
    assert out.chunk_times_ns == (100, 200, 300, 400)  # the usage trailer and [DONE] are no chunks
    assert out.text == " The quick brown fox"
    assert out.usage_num_prompt_tokens == 12


def test_chat_role_chunk_is_not_a_token() -> None:
    out = parse_stream("openai-chat", [fixture("openai_chat_usage")], times_ns=[7])
    assert out.text == "Sure, here"
    assert len(out.chunk_times_ns) == 3


def test_tgi_details_give_the_server_count() -> None:
    out = parse_stream("tgi", [fixture("tgi_generate_stream")])
    assert out.usage_num_output_tokens == 3
    assert out.usage_num_prompt_tokens == 17
    assert out.text == " The quick"  # the special EOS token counts, but carries no text


def test_sse_decoder_fields() -> None:
    d = SseDecoder()
    events = d.feed(b": keep-alive\n\nevent: error\ndata: a\ndata:b\n\nid: 3\nretry: 5\n\n")
    assert events == [SseEvent(data="a\nb", event="error")]
    assert d.feed(b"data: {\"x\"") == []
    assert d.pending
    assert d.feed(b": 1}\n\n") == [SseEvent(data='{"x": 1}')]
    assert not d.pending


def test_parser_stops_after_done() -> None:
    p = StreamParser("openai")
    assert p.on_event(SseEvent("[DONE]"), 1)
    assert p.on_event(SseEvent('{"choices":[{"text":"late"}]}'), 2)
    assert p.outcome().chunk_times_ns == ()
    assert p.outcome().completed


def test_finish_reason_without_done_is_complete() -> None:
    body = b'data: {"choices":[{"text":"x","finish_reason":"length"}]}\n\n'
    out = parse_stream("openai", [body])
    assert out.completed and out.error_kind is None


@pytest.mark.parametrize(("status", "kind"), [(429, "overloaded"), (503, "overloaded"),
                                              (500, "http_error"), (400, "http_error"),
                                              (404, "http_error")])
def test_status_kinds(status: int, kind: str) -> None:
    assert error_kind_for_status(status) == kind


def test_openai_body_asks_for_exact_length() -> None:
    body = build_body("openai", Prompt("token_ids", token_ids=(5, 6, 7)), num_output_tokens=9,
                      model="m", priority=1)
    assert body["prompt"] == [5, 6, 7]
    assert body["max_tokens"] == body["min_tokens"] == 9
    assert body["ignore_eos"] is True and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["priority"] == 1 and body["model"] == "m"
    json.dumps(body)


def test_chat_body_sends_max_tokens_only() -> None:
    body = build_body("openai-chat", Prompt("approx_text", text=" the of"), num_output_tokens=4)
    assert body["messages"] == [{"role": "user", "content": " the of"}]
    assert "max_completion_tokens" not in body  # TGI rejects a body carrying both
    assert "model" not in body and "priority" not in body


def test_tgi_body_has_no_fields_tgi_lacks() -> None:
    body = build_body("tgi", Prompt("tokenizer_text", text="hi"), num_output_tokens=4, priority=0)
    assert body == {"inputs": "hi", "parameters": {"max_new_tokens": 4, "details": True}}


def test_token_ids_only_where_accepted() -> None:
    with pytest.raises(ValueError, match="token ids"):
        build_body("tgi", Prompt("token_ids", token_ids=(1,)), num_output_tokens=1)
    with pytest.raises(ValueError, match="token ids"):
        build_body("openai-chat", Prompt("token_ids", token_ids=(1,)), num_output_tokens=1)
    with pytest.raises(ValueError, match="num_output_tokens"):
        build_body("openai", Prompt("token_ids", token_ids=(1,)), num_output_tokens=0)


def test_length_control_variants_ask_for_exact_length_differently() -> None:
    import json as _json

    from harness.live.protocols import Prompt, build_body

    prompt = Prompt(mode="token_ids", token_ids=(1, 2, 3))
    vllm = build_body("openai", prompt, num_output_tokens=7)
    assert (vllm["max_tokens"], vllm["min_tokens"], vllm["ignore_eos"]) == (7, 7, True)
    hf = build_body("openai", prompt, num_output_tokens=7, length_control="transformers")
    assert "ignore_eos" not in hf and "min_tokens" not in hf
    assert _json.loads(hf["generation_config"])["min_new_tokens"] == 7
    bound = build_body("openai", prompt, num_output_tokens=7, length_control="max_tokens")
    assert bound["max_tokens"] == 7
    assert "min_tokens" not in bound and "generation_config" not in bound
