"""A request body, bounded before any work and parsed off the event loop.

What a caller can make grow is capped in the order it would cost: the bytes
(Content-Length, then what actually arrives: 413 past MAX_BODY_BYTES), then,
on the tokenizing thread, the JSON (no NaN or Infinity, no nesting deeper
than MAX_DEPTH: Python's parser recurses per level and the schema compiler,
Jinja and pydantic after it too), then its lists (messages, tools), then
vLLM's protocol model, whose errors name the field. Only the byte count runs
on the loop; everything that grows with the body runs on the thread.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from rollout_service.generation.json_input import deeper_than
from rollout_service.http.errors import HttpError
from rollout_service.status.errors import InvalidArgument, short_repr

# A long chat (a context of 128k tokens is under 1 MiB of text) fits many
# times over; a hostile body is refused before it is held.
MAX_BODY_BYTES = 16 << 20
# vLLM refuses JSON schemas nested deeper than 64 (a tool's parameters sit
# 4 levels down in a request).
MAX_DEPTH = 72
MAX_MESSAGES = 4096
MAX_TOOLS = 256
# Fields this front adds to OpenAI's requests (docs/openai.md, "Extensions").
# A vLLM protocol model (ChatCompletionRequest, CompletionRequest).
_Model = TypeVar("_Model", bound=BaseModel)
EXTENSIONS = frozenset({"required_weight_version"})


async def read_bounded(request) -> bytes:
    """The body's bytes, or 413 past MAX_BODY_BYTES (declared or sent)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise HttpError(413, f"the body is over {MAX_BODY_BYTES} bytes ({declared} declared)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise HttpError(413, f"the body is over {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{short_repr(text)} is out of range")
    return value


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; 400 when it is not one."""
    try:
        data = json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError as e:
        raise InvalidArgument("body", f"nests deeper than {MAX_DEPTH} levels") from e
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidArgument("body", f"is not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise InvalidArgument("body", "must be a JSON object")
    if deeper_than(data, MAX_DEPTH):
        raise InvalidArgument("body", f"nests objects and arrays deeper than {MAX_DEPTH} levels")
    return data


def check_lists(data: dict[str, Any]) -> None:
    """The lists whose length the work grows with, bounded."""
    for name, most in (("messages", MAX_MESSAGES), ("tools", MAX_TOOLS)):
        value = data.get(name)
        if isinstance(value, list) and len(value) > most:
            raise InvalidArgument(name, f"at most {most} entries, got {len(value)}")


def validated(model: type[_Model], data: dict[str, Any]) -> _Model:
    """`data` as vLLM's protocol `model`; unknown fields and every pydantic
    or vLLM validation error become 400 naming the field."""
    known = set(model.model_fields) | EXTENSIONS
    for key in data:
        if key not in known:
            raise InvalidArgument(short_repr(key).strip("'"), "is not a field of this request")
    from vllm.exceptions import VLLMValidationError

    try:
        return model.model_validate({k: v for k, v in data.items() if k not in EXTENSIONS})
    except ValidationError as e:
        first = e.errors(include_url=False, include_input=False)[0]
        message = first["msg"].removeprefix("Value error, ")
        raise InvalidArgument(_path(data, first["loc"]) or "body", message) from None
    except VLLMValidationError as e:
        raise InvalidArgument(e.parameter or "body", Exception.__str__(e)) from None


def _path(data: Any, loc: Sequence[Any]) -> str:
    """pydantic's error location as a field path of the body: `messages[2].
    content`. Union members' tags (pydantic puts the member's name in the
    location) are not keys of the body and are left out."""
    out = ""
    for part in loc:
        if isinstance(part, int) and isinstance(data, list) and 0 <= part < len(data):
            out += f"[{part}]"
            data = data[part]
        elif isinstance(part, str) and isinstance(data, dict) and part in data:
            out += f".{part}" if out else part
            data = data[part]
    return out
