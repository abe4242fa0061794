"""benchmarks.lib.thin_front's wire: what its client sends is what its server
reads, and a reply's token count is what the load counts (the ceiling
benchmarks.compare measures this service against)."""

import pytest

from benchmarks.lib.thin_front import (
    decode_records,
    decode_reply,
    decode_request,
    encode_record,
    encode_reply,
    encode_request,
    record_counts,
    reply_tokens,
)


def test_request_round_trips():
    data = encode_request([10, 511, 42], 64, delta_tokens=8, omit_text=True, temperature=0.5)
    assert decode_request(data) == ([10, 511, 42], 64, 8, True, 0.5)
    assert decode_request(encode_request([7], 3)) == ([7], 3, 0, False, 0.0)


@pytest.mark.parametrize("text", ["", "héllo wörld"])
def test_reply_round_trips_and_counts_its_tokens(text):
    data = encode_reply([3, 1, 4], [-0.5, -1.25, -2.0], text)
    assert reply_tokens(data) == 3
    assert decode_reply(data) == ([3, 1, 4], [-0.5, -1.25, -2.0], text)
    assert reply_tokens(encode_reply([], [], "")) == 0


def test_many_records_round_trip_and_count_per_completion():
    message = b"".join(
        (
            encode_record(7, [3, 1], [-0.5, -1.0], "hé", False),
            encode_record(2, [], [], "", True),
            encode_record(7, [9], [-2.0], "", True),
        )
    )
    assert list(record_counts(message)) == [(7, 2, False), (2, 0, True), (7, 1, True)]
    assert decode_records(message) == [
        (7, [3, 1], [-0.5, -1.0], "hé", False),
        (2, [], [], "", True),
        (7, [9], [-2.0], "", True),
    ]
