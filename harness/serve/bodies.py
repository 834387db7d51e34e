"""Request bodies: reading the JSON, checking its fields, and the error they turn into.

Each protocol renders an ``ApiError`` its own way (``openai.openai_error``, ``tgi.tgi_error``).

Field types: vLLM's request models are pydantic models in lax mode, so ``"max_tokens": "5"``,
``2.0`` or ``true`` are integers there, and ``"stream": "true"`` is a boolean; TGI's are serde
structs, which take only JSON's own types. ``int_field`` and ``bool_field`` take ``lax`` to say
which (pydantic's rules: docs.pydantic.dev, "Conversion Table"). Integers are 64-bit (a JSON
integer past 2^63 - 1 is refused in the field's words, as a string of digits past it is), and a
number longer than Python converts (4,300 digits) is a ``LongNumber``, never Python's advice.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.requests import Request as StarletteRequest


@dataclass(frozen=True, slots=True)
class ApiError:
    """A request refused before generation; each protocol renders it its own way."""

    status: int
    message: str
    type: str = "BadRequestError"
    param: str | None = None


T = TypeVar("T")
# A body of more bytes than this is parsed (the JSON, then its fields and its prompt counted) on
# a worker thread: parsing a large one (megabytes of token ids, hundreds of KB of text counted
# by a tokenizer) on the event loop would stall every stream for that long. The size in bytes
# is known before anything is parsed and bounds the work whatever the body holds.
OFF_LOOP_BYTES = 16_384


def is_parsed_off_loop(num_body_bytes: int) -> bool:
    """Whether a body of ``num_body_bytes`` is parsed on a worker thread (else on the loop)."""
    return num_body_bytes > OFF_LOOP_BYTES


async def read_json(request: StarletteRequest) -> dict[str, Any] | ApiError:
    """The request's body as a JSON object (on a worker thread when it is large)."""
    body = await request.body()
    if is_parsed_off_loop(len(body)):
        return await asyncio.to_thread(json_object, body)
    return json_object(body)


@dataclass(frozen=True, slots=True)
class LongNumber:
    """A JSON integer of more digits than Python converts (``sys.get_int_max_str_digits()``,
    4,300 by default), where the body holds one: no field takes it, and each field that reads
    it refuses it in its own words (``shown`` writes it as below)."""

    num_digits: int
    limit: int

    def __repr__(self) -> str:
        return f"a number with more than {self.limit:,} digits"


def _json_int(text: str) -> int | LongNumber:
    """``json``'s ``parse_int``: ``int(text)``, or a ``LongNumber`` past Python's limit."""
    limit = sys.get_int_max_str_digits()
    num_digits = len(text.lstrip("-"))
    if limit and num_digits > limit:
        return LongNumber(num_digits, limit)
    return int(text)


class LongNumberBody(dict[str, Any]):
    """A request body holding a ``LongNumber``; ``where`` names the first one (``a.b[2]``)."""

    __slots__ = ("where",)

    def __init__(self, obj: dict[str, Any], where: str) -> None:
        super().__init__(obj)
        self.where = where


def _first_long_number(obj: Any) -> str | None:
    """Where the first ``LongNumber`` in ``obj`` is, as ``a.b[2]``; None if none is."""
    stack: list[tuple[str, Any]] = [("", obj)]  # (not recursive: bodies nest deep)
    while stack:
        where, value = stack.pop()
        if isinstance(value, LongNumber):
            return where
        if isinstance(value, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v)
                         for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(value))))
    return None


def long_number_error(body: Mapping[str, Any], status: int = 400) -> ApiError | None:
    """The refusal of a body holding a number longer than Python converts, where no field the
    route reads has refused it already (an ignored field, say); None for any other body."""
    if not isinstance(body, LongNumberBody):
        return None
    return ApiError(status, f"{body.where} is a number with more than "
                    f"{sys.get_int_max_str_digits():,} digits, longer than any field takes",
                    param=body.where.split(".")[0].split("[")[0])


def json_object(body: bytes) -> dict[str, Any] | ApiError:
    """``body`` as a JSON object, or the 400 it is (malformed, nested too deeply, not an
    object)."""
    try:
        try:
            obj = json.loads(body)
        except ValueError as exc:
            # json converts integers as int() does, up to 4,300 digits, and raises with
            # Python's advice (sys.set_int_max_str_digits()). Read again (a rare body: the
            # common one keeps json's fast path) with such a number as a LongNumber: the field
            # holding it refuses it in its own words and the route's format, and a body it
            # passes is refused whole (``long_number_error``), as vLLM's FastAPI refuses it.
            if isinstance(exc, json.JSONDecodeError) or "integer string conversion" not in str(
                    exc):
                raise
            obj = json.loads(body, parse_int=_json_int)
            where = _first_long_number(obj)
            if isinstance(obj, dict) and where is not None:
                obj = LongNumberBody(obj, where)
    except RecursionError:  # json's decoder recurses once per level of nesting
        return ApiError(400, "the request body is not valid JSON: it is nested too deeply")
    except ValueError as exc:
        return ApiError(400, f"the request body is not valid JSON: {exc}")
    if not isinstance(obj, dict):
        return ApiError(400, "the request body must be a JSON object")
    return obj


async def parse_off_loop(request: StarletteRequest, parse: Callable[[], T]) -> T:
    """``parse()`` (validating the body read from ``request`` and counting its prompt) on a
    worker thread when the body is large, else here; the same result either way."""
    if is_parsed_off_loop(len(await request.body())):  # (read before: Starlette keeps it)
        return await asyncio.to_thread(parse)
    return parse()


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# pydantic's lax int from a string: digits (underscores between them), a sign, surrounding
# whitespace, and a fraction of zeros ("5", " +5 ", "1_000", "5.00"; not "5.5", "1e3", "0x10")
_LAX_INT = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*(?:\.0+)?")
_INT64 = 2**63
INT64_MAX = _INT64 - 1  # the largest integer a field takes, unless it says otherwise
# longer than any int64 in text (with a sign, underscores and a fraction of zeros): refused
# before int(), which raises past 4,300 digits (a 500 and a traceback)
_LAX_INT_CHARS = 64
# pydantic's lax bool from a string, compared lowercased
_LAX_BOOLS = {"1": True, "on": True, "t": True, "true": True, "y": True, "yes": True,
              "0": False, "off": False, "f": False, "false": False, "n": False, "no": False}


def as_int(value: Any, *, lax: bool, maximum: int = INT64_MAX) -> int | None:
    """``value`` as an integer from -2^63 to ``maximum`` (int64's by default), or None when it
    is not one. Strict (serde): JSON integers only, not booleans. Lax (pydantic v2): also
    booleans (1, 0), integral floats (2.0) and strings of digits ("5")."""
    number: int | None = None
    if is_int(value):
        number = int(value)
    elif not lax:
        return None
    elif isinstance(value, bool):
        number = int(value)
    elif isinstance(value, float):
        if value.is_integer() and -_INT64 <= value < _INT64:  # (int() of inf raises)
            number = int(value)
    elif isinstance(value, str) and len(value) <= _LAX_INT_CHARS and _LAX_INT.fullmatch(
            value.strip()):
        number = int(value.strip().split(".")[0])
    return number if number is not None and -_INT64 <= number <= maximum else None


def is_whole_number(value: Any, *, lax: bool) -> bool:
    """Whether ``value`` is written as a whole number, of any size: where ``as_int`` refuses
    one, it is out of range."""
    if is_int(value) or isinstance(value, LongNumber):
        return True
    if not lax:
        return False
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, str) and _LAX_INT.fullmatch(value.strip()) is not None


def power_of_two_text(maximum: int) -> str:
    """``2**63 - 1`` as "2^63 - 1", for a message; any other bound as its digits."""
    if maximum > 0 and (maximum + 1) & maximum == 0:
        return f"2^{maximum.bit_length()} - 1"
    return str(maximum)


def as_bool(value: Any, *, lax: bool) -> bool | None:
    """``value`` as a boolean, or None when it is not one. Strict (serde): JSON booleans only.
    Lax (pydantic v2): also 0 and 1 (int or float), and "true"/"false", "yes"/"no", "on"/"off",
    "1"/"0", "t"/"f", "y"/"n" in any case."""
    if isinstance(value, bool):
        return value
    if not lax:
        return None
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        return _LAX_BOOLS.get(value.lower())
    return None


def shown(value: Any) -> str:
    """A field's value, for an error message: short, and never a nested structure's repr."""
    if isinstance(value, list | dict):
        return "a JSON array" if isinstance(value, list) else "a JSON object"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def int_field(obj: Mapping[str, Any], name: str, minimum: int, status: int = 400,
              label: str | None = None, *, lax: bool = False,
              maximum: int = INT64_MAX) -> int | ApiError | None:
    """``obj[name]`` as an integer from ``minimum`` to ``maximum``; None where it is absent or
    null; else the error naming the field."""
    value = obj.get(name)
    if value is None:
        return None
    number = as_int(value, lax=lax, maximum=maximum)
    if number is None or number < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        if number is None and is_whole_number(value, lax=lax):  # a whole number past the bound
            what += f" (at most {power_of_two_text(maximum)})"
        return ApiError(status, f"{label or name} must be {what}, got {shown(value)}",
                        param=name)
    return number


def bool_field(obj: Mapping[str, Any], name: str, default: bool, status: int = 400, *,
               lax: bool = False) -> bool | ApiError:
    value = obj.get(name)
    if value is None:
        return default
    flag = as_bool(value, lax=lax)
    if flag is None:
        return ApiError(status, f"{name} must be true or false, got {shown(value)}",
                        param=name)
    return flag
