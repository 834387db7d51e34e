"""Request bodies: reading the JSON, checking its fields, and the error they turn into.

Each protocol renders an ``ApiError`` its own way (``openai.openai_error``, ``tgi.tgi_error``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
