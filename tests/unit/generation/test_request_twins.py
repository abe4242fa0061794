"""GenerateStreamRequest carries GenerateRequest's fields under the same
numbers: the servicer turns one into the other by re-parsing its bytes
(pipeline/generations.py), so a field added to one and not the other, or numbered
apart, would be dropped or misread without a word. Engine-free."""

from __future__ import annotations

from rollout_client import pb

# Fields only the streaming request has; the servicer reads each itself.
STREAM_ONLY = {"stream_options"}


def _fields(message) -> dict:
    return {
        f.name: (
            f.number,
            f.type,
            f.is_repeated,
            f.message_type.full_name if f.message_type else None,
            f.enum_type.full_name if f.enum_type else None,
            f.containing_oneof.name if f.containing_oneof else None,
        )
        for f in message.DESCRIPTOR.fields
    }


def test_every_generate_field_is_a_stream_field_with_the_same_number_and_type():
    unary, stream = _fields(pb.GenerateRequest), _fields(pb.GenerateStreamRequest)
    assert unary.keys() <= stream.keys(), (
        f"not in GenerateStreamRequest: {unary.keys() - stream.keys()}"
    )
    assert {n: stream[n] for n in unary} == unary


def test_the_stream_request_adds_only_what_the_servicer_reads_itself():
    unary, stream = _fields(pb.GenerateRequest), _fields(pb.GenerateStreamRequest)
    assert stream.keys() - unary.keys() == STREAM_ONLY
    numbers = [v[0] for v in stream.values()]
    assert len(numbers) == len(set(numbers))


def test_a_stream_request_reparsed_as_a_unary_one_keeps_every_shared_field():
    stream = pb.GenerateStreamRequest(
        request_id="r",
        prompt_token_ids=[1, 2],
        sampling_params=pb.SamplingParams(max_tokens=3, temperature=0.5),
        lora_adapter="a",
        required_weight_version="v",
        stream_options=pb.StreamOptions(omit_text=True),
    )
    unary = pb.GenerateRequest.FromString(stream.SerializeToString())
    for f in pb.GenerateRequest.DESCRIPTOR.fields:
        assert getattr(unary, f.name) == getattr(stream, f.name), f.name
