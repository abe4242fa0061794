"""The contract's copied fields: GenerateStreamRequest repeats GenerateRequest's
fields, and the server turns one into the other through their bytes
(`GenerateRequest.FromString(stream_request.SerializeToString())`), so a
field the two number or type differently, or one added to GenerateRequest
alone, would be dropped or misread without an error.

The contract's static field rules are protovalidate options (proto/buf/validate/
validate.proto, vendored as released): the vendored file must be the schema
the server's protovalidate reads them with, and every rule must compile.
Engine-free: read from the generated descriptors."""

from __future__ import annotations

import protovalidate
from buf.validate import validate_pb2
from google.protobuf import message_factory
from google.protobuf.descriptor_pb2 import (
    DescriptorProto,
    FieldDescriptorProto,
    FileDescriptorProto,
)

from rollout.v1 import rollout_pb2 as pb

# GenerateStreamRequest's own fields, not copied: each sits on a number
# GenerateRequest reserves, so its bytes never land in a GenerateRequest field.
STREAM_ONLY = {"stream_options"}
UNARY, STREAM = pb.GenerateRequest.DESCRIPTOR, pb.GenerateStreamRequest.DESCRIPTOR


def _proto(descriptor) -> DescriptorProto:
    out = DescriptorProto()
    descriptor.CopyToProto(out)
    return out


def _oneof(message: DescriptorProto, field: FieldDescriptorProto) -> str | None:
    return message.oneof_decl[field.oneof_index].name if field.HasField("oneof_index") else None


def parity_problems(unary: DescriptorProto, stream: DescriptorProto, stream_only: set[str]):
    """What keeps a `stream` message's bytes from parsing as `unary` with
    every shared field intact: one line per field."""
    problems = []
    theirs = {f.name: f for f in stream.field}
    for f in unary.field:
        s = theirs.get(f.name)
        if s is None:
            problems.append(f"{f.name}: in {unary.name}, missing from {stream.name}")
            continue
        for attr in ("number", "type", "label", "type_name", "proto3_optional"):
            if getattr(f, attr) != getattr(s, attr):
                problems.append(f"{f.name}: {attr} {getattr(f, attr)!r} != {getattr(s, attr)!r}")
        if _oneof(unary, f) != _oneof(stream, s):
            problems.append(f"{f.name}: oneof {_oneof(unary, f)} != {_oneof(stream, s)}")
    ours = {f.name for f in unary.field}
    reserved = {n for r in unary.reserved_range for n in range(r.start, r.end)}
    for s in stream.field:
        if s.name in ours:
            continue
        if s.name not in stream_only:
            problems.append(f"{s.name}: in {stream.name}, missing from {unary.name}")
        elif s.number not in reserved:
            problems.append(f"{s.name}: number {s.number} is not reserved in {unary.name}")
    for name in stream_only - {s.name for s in stream.field}:
        problems.append(f"{name}: listed as {stream.name}'s own but it has no such field")
    return problems


def test_generate_stream_request_copies_every_generate_request_field():
    unary, stream = (
        _proto(pb.GenerateRequest.DESCRIPTOR),
        _proto(pb.GenerateStreamRequest.DESCRIPTOR),
    )
    assert parity_problems(unary, stream, STREAM_ONLY) == []


def _field(message: DescriptorProto, name: str) -> FieldDescriptorProto:
    return next(f for f in message.field if f.name == name)


def test_the_parity_check_names_each_way_the_copy_can_drift():
    unary, stream = (
        _proto(pb.GenerateRequest.DESCRIPTOR),
        _proto(pb.GenerateStreamRequest.DESCRIPTOR),
    )

    renumbered = DescriptorProto()
    renumbered.CopyFrom(stream)
    _field(renumbered, "lora_adapter").number = 11
    assert parity_problems(unary, renumbered, STREAM_ONLY) == ["lora_adapter: number 8 != 11"]

    retyped = DescriptorProto()
    retyped.CopyFrom(stream)
    _field(retyped, "prompt_text").type = FieldDescriptorProto.TYPE_BYTES
    assert parity_problems(unary, retyped, STREAM_ONLY) == ["prompt_text: type 9 != 12"]

    # A field added to GenerateRequest alone.
    grown = DescriptorProto()
    grown.CopyFrom(unary)
    grown.field.add(name="priority", number=11, type=FieldDescriptorProto.TYPE_INT32)
    assert parity_problems(grown, stream, STREAM_ONLY) == [
        "priority: in GenerateRequest, missing from GenerateStreamRequest"
    ]

    # A stream-only field on a number GenerateRequest does not reserve.
    unreserved = DescriptorProto()
    unreserved.CopyFrom(unary)
    del unreserved.reserved_range[:]
    assert parity_problems(unreserved, stream, STREAM_ONLY) == [
        "stream_options: number 9 is not reserved in GenerateRequest"
    ]


def test_a_stream_request_keeps_every_shared_field_through_the_servicers_conversion():
    stream = pb.GenerateStreamRequest(
        request_id="r-1",
        prompt_token_ids=[5, 6],
        prompt_text="hi",
        sampling_params=pb.SamplingParams(max_tokens=3, temperature=0.5, stop=["\n"]),
        images=[pb.Image(data=b"png")],
        messages=[pb.ChatMessage(role="user", content=[pb.ContentPart(text="hi")])],
        chat_options=pb.ChatOptions(continue_final_message=True),
        lora_adapter="a",
        stream_options=pb.StreamOptions(delta_tokens=4, omit_text=True),
        required_weight_version="v7",
    )
    shared = [f.name for f in UNARY.fields]
    # Every shared field set, so that none can go missing unseen.
    assert set(shared) <= {f.name for f, _ in stream.ListFields()}

    request = pb.GenerateRequest.FromString(stream.SerializeToString())

    for name in shared:
        assert getattr(request, name) == getattr(stream, name), name


def _schema(blob: bytes) -> FileDescriptorProto:
    """validate.proto's messages, enums and extensions as compiled: without
    json names (protoc's Python output drops them) and file options (the
    language packages each generator sets)."""
    file = FileDescriptorProto.FromString(blob)

    def strip(message: DescriptorProto) -> None:
        for f in [*message.field, *message.extension]:
            f.ClearField("json_name")
        for nested in message.nested_type:
            strip(nested)

    for message in file.message_type:
        strip(message)
    for f in file.extension:
        f.ClearField("json_name")
    file.ClearField("source_code_info")
    file.ClearField("options")
    return file


def test_the_vendored_validate_proto_is_the_one_protovalidate_reads():
    # protovalidate's own copy, compiled into it (a protobuf-py descriptor).
    runtime = protovalidate.ViolationPb.desc().file.proto.to_binary()
    vendored = validate_pb2.DESCRIPTOR.serialized_pb
    assert _schema(vendored) == _schema(runtime)

    # The comparison sees a rule changed, not just a file replaced.
    changed = _schema(vendored)
    next(m for m in changed.message_type if m.name == "FloatRules").field[0].ClearField("options")
    assert changed != _schema(runtime)


def test_every_rule_of_the_contract_compiles():
    # Validating a message compiles the rules of every message it can hold;
    # a rule protovalidate cannot compile raises CompilationError.
    messages = [
        m
        for f in pb.DESCRIPTOR.dependencies
        if f.package == "rollout.v1"
        for m in f.message_types_by_name.values()
    ]
    assert {"SamplingParams", "SleepRequest", "UpdateWeightsBegin"} <= {m.name for m in messages}
    for m in messages:
        protovalidate.collect_violations(message_factory.GetMessageClass(m)())


def test_the_contract_states_the_static_ranges():
    """A few of the rules, read back as a client in any language reads them."""
    bad = pb.GenerateRequest(
        prompt_token_ids=[1],
        sampling_params=pb.SamplingParams(top_p=1.5, stop=["", "x"]),
        messages=[pb.ChatMessage(role="")],
    )
    paths = {_path(v) for v in protovalidate.collect_violations(bad)}
    assert paths == {"sampling_params.top_p", "sampling_params.stop[0]", "messages[0].role"}
    assert [_path(v) for v in protovalidate.collect_violations(pb.SleepRequest(level=3))] == [
        "level"
    ]
    assert protovalidate.collect_violations(pb.SleepRequest(level=2)) == []


def _path(violation) -> str:
    parts = []
    for e in violation.proto.field.elements:
        sub = e.subscript
        parts.append(e.field_name + ("" if sub is None else f"[{sub.value!r}]"))
    return ".".join(parts)
