"""The contract's copied fields: GenerateStreamRequest repeats GenerateRequest's
fields, and the server turns one into the other through their bytes
(`GenerateRequest.FromString(stream_request.SerializeToString())`), so a
field the two number or type differently, or one added to GenerateRequest
alone, would be dropped or misread without an error. Engine-free: read from
the generated descriptors."""

from __future__ import annotations

from google.protobuf.descriptor_pb2 import DescriptorProto, FieldDescriptorProto

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
