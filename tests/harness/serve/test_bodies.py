"""Request bodies (``harness.serve.bodies``): field types as vLLM's pydantic models (lax) and
TGI's serde structs (strict) take them, which bodies are parsed off the event loop, and JSON
too deeply nested to parse."""

from __future__ import annotations

import json
from typing import Any

import pytest

from harness.serve.bodies import (
    OFF_LOOP_BYTES,
    ApiError,
    as_bool,
    as_int,
    bool_field,
    int_field,
    is_parsed_off_loop,
    json_object,
    long_number_error,
)


# pydantic v2 lax mode (its "Conversion Table": int from bool, from an exact float, from a
# string of digits; bool from 0/1 and from the listed strings in any case)
@pytest.mark.parametrize("value, expected", [
    (5, 5), ("5", 5), (" 5 ", 5), ("+5", 5), ("-3", -3), ("1_000", 1000), ("5.00", 5),
    (2.0, 2), (-2.0, -2), (True, 1), (False, 0),
    (2.5, None), ("2.5", None), ("abc", None), ("", None), ("1e3", None), ("0x10", None),
    ("5.", None), (1e20, None), (float("inf"), None), (None, None), ([5], None), ({}, None),
    # past int64, and past the 4,300 digits int() takes (it raised: a 500 and a traceback)
    ("9223372036854775807", 2**63 - 1), ("9223372036854775808", None), ("9" * 5000, None),
])
def test_lax_ints_are_pydantics(value: Any, expected: int | None) -> None:
    assert as_int(value, lax=True) == expected


@pytest.mark.parametrize("value, expected", [
    (True, True), (False, False), ("true", True), ("False", False), ("TRUE", True),
    ("yes", True), ("No", False), ("on", True), ("OFF", False), ("1", True), ("0", False),
    ("t", True), ("f", False), ("y", True), ("n", False), (1, True), (0, False), (1.0, True),
    (0.0, False),
    (2, None), ("maybe", None), (" true", None), ("", None), (None, None), ([], None),
])
def test_lax_bools_are_pydantics(value: Any, expected: bool | None) -> None:
    assert as_bool(value, lax=True) == expected


def test_strict_fields_take_only_json_types() -> None:
    """TGI's fields are serde's: a string, a float or a bool is not an integer, and only a
    JSON boolean is a boolean."""
    for value in ("5", 5.0, True, "true"):
        assert as_int(value, lax=False) is None
    for value in ("true", "yes", 1, 0):
        assert as_bool(value, lax=False) is None
    assert as_int(7, lax=False) == 7 and as_bool(True, lax=False) is True


def test_fields_name_themselves_and_keep_their_minimum() -> None:
    assert int_field({"max_tokens": "5"}, "max_tokens", 1, lax=True) == 5
    assert int_field({"max_tokens": True}, "max_tokens", 1, lax=True) == 1
    refused = int_field({"max_tokens": False}, "max_tokens", 1, lax=True)  # 0 < 1
    assert isinstance(refused, ApiError) and refused.param == "max_tokens"
    strict = int_field({"max_new_tokens": "5"}, "max_new_tokens", 1, 422, "`max_new_tokens`")
    assert isinstance(strict, ApiError) and strict.status == 422
    assert strict.message == "`max_new_tokens` must be a positive integer, got '5'"
    assert bool_field({"stream": "true"}, "stream", False, lax=True) is True
    assert isinstance(bool_field({"stream": "true"}, "stream", False), ApiError)
    # a nested value is named by its kind, never written out
    nested = int_field({"max_tokens": [[[1]]] * 1000}, "max_tokens", 1, lax=True)
    assert isinstance(nested, ApiError) and nested.message.endswith("got a JSON array")


def test_large_bodies_are_parsed_off_the_loop_whatever_they_hold() -> None:
    """The decision goes by the body's bytes: a prompt of token ids (0 characters of text
    before) or a small prompt padded with whitespace is as much parsing as a long text."""
    ids = json.dumps({"prompt": list(range(3000)), "max_tokens": 1}).encode()
    padded = json.dumps({"prompt": [1, 2, 3], "max_tokens": 1}, indent=OFF_LOOP_BYTES).encode()
    text = json.dumps({"prompt": "ab " * (OFF_LOOP_BYTES // 3 + 1)}).encode()
    for body in (ids, padded, text):
        assert len(body) > OFF_LOOP_BYTES and is_parsed_off_loop(len(body))
    small = json.dumps({"prompt": list(range(100)), "max_tokens": 1}).encode()
    assert not is_parsed_off_loop(len(small))
    assert not is_parsed_off_loop(OFF_LOOP_BYTES) and is_parsed_off_loop(OFF_LOOP_BYTES + 1)


def test_json_nested_too_deeply_to_parse_is_a_refusal_not_a_crash() -> None:
    deep = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    err = json_object(deep)
    assert isinstance(err, ApiError) and err.status == 400
    assert "nested too deeply" in err.message
    assert json_object(b'{"prompt": [[[1]]]}') == {"prompt": [[[1]]]}


def test_integers_past_int64_are_refused_in_the_fields_words() -> None:
    """A JSON integer past 2^63 - 1 was taken whole (then a context-length error), while the
    same digits as a string were refused: now both are refused, saying the bound."""
    for value in (2**63, "99999999999999999999999", 1e20):
        assert as_int(value, lax=True) is None
        refused = int_field({"max_tokens": value}, "max_tokens", 1, lax=True)
        assert isinstance(refused, ApiError) and refused.param == "max_tokens"
        assert refused.message.startswith(
            "max_tokens must be a positive integer (at most 2^63 - 1), got ")
    assert as_int(2**63 - 1, lax=False) == 2**63 - 1 and as_int(-(2**63), lax=False) == -(2**63)
    assert as_int(2**63, lax=False) is None
    strict = int_field({"max_new_tokens": 2**63}, "max_new_tokens", 1, 422, "`max_new_tokens`")
    assert isinstance(strict, ApiError) and strict.message == (
        "`max_new_tokens` must be a positive integer (at most 2^63 - 1), "
        "got 9223372036854775808")
    # a field with another bound says it (TGI's seed is serde's u64)
    assert int_field({"seed": 2**64 - 1}, "seed", 0, maximum=2**64 - 1) == 2**64 - 1
    seed = int_field({"seed": 2**64}, "seed", 0, maximum=2**64 - 1)
    assert isinstance(seed, ApiError)
    assert seed.message == (
        "seed must be an integer >= 0 (at most 2^64 - 1), got 18446744073709551616")
    # not a whole number: no bound to say
    assert int_field({"max_tokens": "abc"}, "max_tokens", 1, lax=True) == ApiError(
        400, "max_tokens must be a positive integer, got 'abc'", param="max_tokens")


def test_a_number_past_pythons_4300_digits_is_read_without_pythons_advice() -> None:
    """json raised "Exceeds the limit (4300 digits) for integer string conversion; use
    sys.set_int_max_str_digits()": the 400 said so. Now the field reading it refuses it."""
    body = json_object(b'{"prompt": [1], "max_tokens": ' + b"9" * 5000 + b"}")
    assert not isinstance(body, ApiError)
    refused = int_field(body, "max_tokens", 1, lax=True)
    assert isinstance(refused, ApiError) and refused.message == (
        "max_tokens must be a positive integer (at most 2^63 - 1), got a number with more "
        "than 4,300 digits")
    assert long_number_error(body) == ApiError(
        400, "max_tokens is a number with more than 4,300 digits, longer than any field takes",
        param="max_tokens")
    nested = json_object(b'{"a": {"b": [1, -' + b"9" * 4301 + b"]}}")
    assert not isinstance(nested, ApiError)
    unread = long_number_error(nested)
    assert unread is not None and unread.message.startswith(
        "a.b[1] is a number with more than 4,300 digits")
    assert long_number_error({"max_tokens": 5}) is None
    assert json_object(b'{"max_tokens": ' + b"9" * 4300 + b"}") == {"max_tokens": int("9" * 4300)}
    # malformed after the long number: malformed, as before
    broken = json_object(b'{"max_tokens": ' + b"9" * 5000 + b", }")
    assert isinstance(broken, ApiError) and broken.message.startswith(
        "the request body is not valid JSON: Expecting property name")
