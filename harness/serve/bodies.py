"""Request bodies: reading the JSON, checking its fields, and the error they turn into.

Each protocol renders an ``ApiError`` its own way (``openai.openai_error``, ``tgi.tgi_error``).
"""

from __future__ import annotations

import asyncio
import json
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


async def read_json(request: StarletteRequest) -> dict[str, Any] | ApiError:
    body = await request.body()
    try:
        obj = json.loads(body)
    except ValueError as exc:
        return ApiError(400, f"the request body is not valid JSON: {exc}")
    if not isinstance(obj, dict):
        return ApiError(400, "the request body must be a JSON object")
    return obj


T = TypeVar("T")
# A prompt of more characters than this is counted on a worker thread: counting a long one
# (hundreds of KB, a tokenizer) on the event loop would stall every stream for that long.
OFF_LOOP_CHARS = 16_384


def _text_chars(value: Any) -> int:
    """The characters of the text (and token ids) a body's prompt fields hold."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_chars(v) for v in value)
    if isinstance(value, dict):
        return _text_chars(value.get("content"))
    return 0


async def parse_off_loop(body: Mapping[str, Any], parse: Callable[[], T]) -> T:
    """``parse()`` (validating and counting the body's prompt) on a worker thread when the
    prompt is long, else here; the same result either way."""
    size = sum(_text_chars(body.get(k)) for k in ("prompt", "messages", "inputs"))
    if size <= OFF_LOOP_CHARS:
        return parse()
    return await asyncio.to_thread(parse)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def int_field(obj: Mapping[str, Any], name: str, minimum: int, status: int = 400,
              label: str | None = None) -> int | ApiError | None:
    value = obj.get(name)
    if value is None:
        return None
    if not is_int(value) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        return ApiError(status, f"{label or name} must be {what}, got {value!r}", param=name)
    return int(value)


def bool_field(obj: Mapping[str, Any], name: str, default: bool,
               status: int = 400) -> bool | ApiError:
    value = obj.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        return ApiError(status, f"{name} must be true or false, got {value!r}", param=name)
    return value
