"""Request bodies: reading the JSON, checking its fields, and the error they turn into.

Each protocol renders an ``ApiError`` its own way (``openai.openai_error``, ``tgi.tgi_error``).

Field types: vLLM's request models are pydantic models in lax mode, so ``"max_tokens": "5"``,
``2.0`` or ``true`` are integers there, and ``"stream": "true"`` is a boolean; TGI's are serde
structs, which take only JSON's own types. ``int_field`` and ``bool_field`` take ``lax`` to say
which (pydantic's rules: docs.pydantic.dev, "Conversion Table").
"""

from __future__ import annotations

import asyncio
import json
import re
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


def json_object(body: bytes) -> dict[str, Any] | ApiError:
    """``body`` as a JSON object, or the 400 it is (malformed, nested too deeply, not an
    object)."""
    try:
        obj = json.loads(body)
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
# longer than any int64 in text (with a sign, underscores and a fraction of zeros): refused
# before int(), which raises past 4,300 digits (a 500 and a traceback)
_LAX_INT_CHARS = 64
# pydantic's lax bool from a string, compared lowercased
_LAX_BOOLS = {"1": True, "on": True, "t": True, "true": True, "y": True, "yes": True,
              "0": False, "off": False, "f": False, "false": False, "n": False, "no": False}


def as_int(value: Any, *, lax: bool) -> int | None:
    """``value`` as an integer, or None when it is not one. Strict (serde): JSON integers only,
    not booleans. Lax (pydantic v2): also booleans (1, 0), integral floats within int64 (2.0)
    and strings of digits ("5")."""
    if is_int(value):
        return int(value)
    if not lax:
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        return int(value) if value.is_integer() and -_INT64 <= value < _INT64 else None
    if isinstance(value, str) and len(value) <= _LAX_INT_CHARS and _LAX_INT.fullmatch(
            value.strip()):
        number = int(value.strip().split(".")[0])
        return number if -_INT64 <= number < _INT64 else None
    return None


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
              label: str | None = None, *, lax: bool = False) -> int | ApiError | None:
    value = obj.get(name)
    if value is None:
        return None
    number = as_int(value, lax=lax)
    if number is None or number < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
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
