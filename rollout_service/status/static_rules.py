"""The contract's static field rules, checked where a request enters.

proto/ states each field's static range once, as a protovalidate option
(`[(buf.validate.field).float = {finite: true, gt: 0, lte: 1}]`), so every
language's client sees it; `check` holds a message to those rules and raises
InvalidArgument naming the first field outside them, in the paths the rest
of the server writes (`sampling_params.stop[0]`, `messages[1].role`). What a
static rule cannot say stays in Python: ranges set by the served model (the
context, the vocabulary, the engine's logprobs limit), by other fields
(min_tokens against max_tokens) or by the server's state.

Callers check where a request enters the pipeline (a generation's
conversion, a session turn, OpenSession, an update's begin, Sleep), not where
gRPC parses a message: one bad request of a GenerateMany stream fails alone,
and the front (gRPC or HTTP) does not matter. The weight chunks' fast path
(rollout_codecs/wire.py) builds no messages and has no rules.
"""

from __future__ import annotations

import protovalidate
from google.protobuf.message import Message

from rollout.v1 import rollout_pb2 as pb
from rollout_service.status.errors import InvalidArgument, short_repr

# The Validator compiles a message type's rules on its first check (about
# 6 ms each) and keeps them; checks then cost microseconds.
_VALIDATOR = protovalidate.Validator()

# What the entry points check (warm_up compiles their rules before serving).
ENTRY_TYPES = (
    pb.GenerateRequest,
    pb.SamplingParams,
    pb.SleepRequest,
    pb.UpdateWeightsBegin,
    pb.OpenSessionRequest,
)


def check(message: Message, prefix: str = "") -> None:
    """INVALID_ARGUMENT naming the first field of `message` outside the
    contract's rules, with every rule it breaks; `prefix`: where `message`
    sits in the request (`sampling_params` for a turn's SamplingParams)."""
    violations = _VALIDATOR.collect_violations(message)
    if not violations:
        return
    path = field_path(violations[0])
    same = [v for v in violations if field_path(v) == path]
    problem = "; ".join(v.proto.message for v in same)
    value = same[0].field_value
    if isinstance(value, bool | int | float | str):
        problem += f", got {short_repr(value)}"
    raise InvalidArgument(f"{prefix}.{path}" if prefix and path else prefix or path, problem)


def field_path(violation: protovalidate.Violation) -> str:
    """`messages[1].content[0].part`: the field (or oneof) a violation names,
    from the request's root."""
    where = violation.proto.field
    if where is None:
        return ""
    parts = []
    for e in where.elements:
        sub = e.subscript
        parts.append(e.field_name if sub is None else f"{e.field_name}[{sub.value!r}]")
    return ".".join(parts)


def warm_up() -> None:
    """Compiles the entry points' rules (tens of milliseconds in all): run
    it off the event loop before serving, so no first request pays for it."""
    for message_type in ENTRY_TYPES:
        _VALIDATOR.collect_violations(message_type())
