"""benchmarks.thin_front's wire: what its client sends is what its server
reads, and a reply's token count is what the load counts (the ceiling
benchmarks.compare measures this service against)."""

import pytest

from benchmarks.thin_front import (
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
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
