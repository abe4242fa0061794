"""JSON documents a caller sends (a structured-output schema, a LoRA adapter's
PEFT config), parsed so that a hostile one is refused with its field named.

Python's json module recurses once per nesting level and raises
RecursionError past about a thousand ("[" * 50000 did, and became
INTERNAL); what parses but nests deeply can still exhaust a recursive reader
further on (the schema compiler, vLLM's own checks, `json.dump`). It also
takes NaN, Infinity and -Infinity, which JSON does not have, and turns 1e999
into inf: a NaN lora_alpha then scales every adapted layer to NaN.

So: RecursionError is caught, nesting is measured level by level (no
recursion) against MAX_DEPTH, non-finite numbers are refused while parsing,
and the document must be an object. All of it runs before anything else
reads the document.
"""

from __future__ import annotations

import json
import math

from rollout_service.status.errors import InvalidArgument, short_repr

# Objects and arrays nest at most this many levels (the top one counts as
# 1). vLLM 0.32 refuses JSON schemas nested deeper than the same 64
# (sampling_params.MAX_STRUCTURED_OUTPUT_JSON_NESTING); a PEFT config nests 2.
MAX_DEPTH = 64


class _NotFinite(Exception):
    """Raised from inside json.loads by the number hooks below."""


def _refuse_constant(name: str):
    raise _NotFinite(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(f"{short_repr(text)} is out of range (not a finite number)")
    return value


def deeper_than(value: object, limit: int) -> bool:
    """Whether `value` (parsed JSON) nests objects and arrays more than
    `limit` levels, the top one counting as 1; level by level, no recursion."""
    level = [value] if isinstance(value, (dict, list)) else []
    for _ in range(limit):
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, (dict, list))
        ]
        if not level:
            return False
    return bool(level)


_TOO_DEEP = f"nests objects and arrays deeper than {MAX_DEPTH} levels"


def load_loose(text: str, field: str) -> object:
    """`text` parsed as any JSON value, or `text` itself when it is not JSON
    (a tool call's arguments, as a model wrote them); InvalidArgument naming
    `field` only when it nests deeper than MAX_DEPTH."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError as e:
        raise InvalidArgument(field, _TOO_DEEP) from e
    except (_NotFinite, ValueError):
        return text
    if deeper_than(value, MAX_DEPTH):
        raise InvalidArgument(field, _TOO_DEEP)
    return value


def load_object(text: str, field: str, what: str = "") -> dict:
    """`text` parsed as a JSON object, or InvalidArgument naming `field`:
    not JSON, nested deeper than MAX_DEPTH, holding a non-finite number, or
    not an object (`what` says which object is expected)."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError as e:
        raise InvalidArgument(field, _TOO_DEEP) from e
    except _NotFinite as e:
        raise InvalidArgument(field, str(e)) from e
    except ValueError as e:  # JSONDecodeError; an integer over 4,300 digits
        raise InvalidArgument(field, f"is not valid JSON ({e})") from e
    if not isinstance(value, dict):
        raise InvalidArgument(field, f"must be a JSON object{f' ({what})' if what else ''}")
    if deeper_than(value, MAX_DEPTH):
        raise InvalidArgument(field, _TOO_DEEP)
    return value
