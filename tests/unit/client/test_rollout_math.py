"""The client's rollout arithmetic: per-token versions from version spans,
and the training-inference mismatch figures."""

from __future__ import annotations

import math

import pytest

from rollout_client import pb
from rollout_client.calls.versions import token_versions
from rollout_client.mismatch import mismatch


def completion(n: int, *spans: tuple[str, int, int]) -> pb.Completion:
    return pb.Completion(
        token_ids=list(range(n)),
        version_spans=[pb.VersionSpan(weight_version=v, start=s, count=c) for v, s, c in spans],
    )


def test_token_versions_expand_spans_and_refuse_gaps():
    assert token_versions(completion(5, ("a", 0, 2), ("b", 2, 3))) == list("aabbb")
    with pytest.raises(ValueError, match="starts at token 3"):
        token_versions(completion(5, ("a", 0, 2), ("b", 3, 2)))
    with pytest.raises(ValueError, match="cover 2 of 5"):
        token_versions(completion(5, ("a", 0, 2)))


def test_mismatch_figures():
    m = mismatch([-1.0, -2.0, -3.0], [-1.0, -2.5, -2.0])
    assert m.tokens == 3
    assert m.mean_abs == pytest.approx(0.5)
    assert m.max_abs == pytest.approx(1.0)
    # k3 = e^d - d - 1 per token, d = trainer - service: 0, e^-.5+.5-1, e^1-1-1.
    assert m.kl == pytest.approx((0 + math.exp(-0.5) - 0.5 + math.e - 2) / 3)
    assert mismatch([], []).tokens == 0
    with pytest.raises(ValueError, match="2 service logprobs against 1"):
        mismatch([-1.0, -1.0], [-1.0])
    with pytest.raises(ValueError, match="not finite"):
        mismatch([-math.inf], [-1.0])
