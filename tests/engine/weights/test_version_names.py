"""A version names one set of weights for the server's lifetime (issue: the
server accepted `step-1` again after `step-2` with other weights, so one name
meant two models in every token a trainer attributes). On the real server:
a reused version with other weights is refused and nothing changes; with the
very weights it named, it is applied again; one that cannot be the same
weights is refused at begin; the starting version takes the checkpoint back."""

from __future__ import annotations

import grpc
import pytest

from harness.weights_util import random_weights, version
from rollout_client import RolloutError, pb
from tests.support.served_weights import served_checkpoint


def _refused(call) -> RolloutError:
    with pytest.raises(RolloutError) as e:
        call()
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION, e.value
    assert e.value.reason == "VERSION_REUSED", e.value
    return e.value


def _greedy(client) -> list[int]:
    r = client.generate(prompt_token_ids=list(range(1, 30)), max_tokens=8, temperature=0)
    return list(r.completions[0].token_ids)


def test_a_reused_version_needs_the_weights_it_named(client, info):
    one, two = version(), version()
    w1 = random_weights(info.parameters, seed=61)
    w2 = random_weights(info.parameters, seed=62)
    client.update_weights(w1, one)
    on_one = _greedy(client)
    client.update_weights(w2, two)
    on_two = _greedy(client)
    e = _refused(lambda: client.update_weights(w2, one))
    assert "push these weights under a new version" in str(e)
    assert client.server_info().weight_version == two and _greedy(client) == on_two
    # The very weights `one` named: applied again.
    ack = client.update_weights(w1, one)
    assert (ack.weight_version, ack.previous_weight_version) == (one, two) and not ack.replayed
    assert _greedy(client) == on_one


def test_a_reuse_that_cannot_be_the_same_weights_is_refused_at_begin(client, info):
    head = [p for p in info.parameters if p.name == "lm_head.weight"]
    partial, full, now = version(), version(), version()
    client.update_weights(random_weights(head, seed=63), partial)
    client.update_weights(random_weights(info.parameters, seed=64), full)
    client.update_weights(random_weights(info.parameters, seed=65), now)
    # A subset under a full version's name, refused at begin: no update opens.
    begin = pb.UpdateWeightsBegin(weight_version=full, tensors=head)
    with pytest.raises(grpc.RpcError) as e:
        client.stub.BeginUpdate(pb.BeginUpdateRequest(begin=begin))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, e.value.details()
    assert "served earlier" in e.value.details()
    # A full update under a subset's name: what it named depends on what came before.
    _refused(lambda: client.update_weights(random_weights(info.parameters, seed=63), partial))
    assert client.server_info().weight_version == now


def test_the_starting_version_takes_the_checkpoint_back_and_nothing_else(client, info):
    start, checkpoint = info.weight_version, served_checkpoint(client)
    if client.server_info().weight_version == start:
        client.update_weights(random_weights(info.parameters, seed=66), version())
    client.update_weights(checkpoint, start)
    on_start = _greedy(client)
    client.update_weights(random_weights(info.parameters, seed=67), version())
    _refused(lambda: client.update_weights(random_weights(info.parameters, seed=68), start))
    client.update_weights(checkpoint, start)
    assert client.server_info().weight_version == start and _greedy(client) == on_start
