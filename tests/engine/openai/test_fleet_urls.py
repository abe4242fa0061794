"""A Fleet's session as an OpenAI base URL (docs/openai.md, "Across a
fleet"), on two real replicas each with --http-port: Fleet.open_session
hands out the URL of the replica that holds the session; an agent's turns
through the official `openai` SDK there are the session's; once that
replica is gone, the SDK's next call fails with APIConnectionError, the
trainer's `sync()` re-opens the session on the other replica from the
fleet's copy, and the agent, given the new URL, goes on with the same
messages: the new replica's GetSession holds the old history, token for
token, and the new turn after it. A session whose history restarted
(history_rule "restart": the agent compacted its conversation) moves too,
and the new URL takes the compacted conversation as the context it holds."""

from __future__ import annotations

import openai
import pytest

from rollout_client import RolloutClient, pb
from rollout_client.fleet import Fleet

USER = {"role": "user", "content": "Plan a trip to Oslo."}
# A harness's compaction of the conversation: not an extension of it.
COMPACTED = [{"role": "user", "content": "Summary: a trip to Oslo. What next?"}]
# Six tokens a turn, every turn: an immediate end of text would leave a turn empty.
TURN = {
    "max_tokens": 6,
    "temperature": 0,
    "extra_body": {"return_token_ids": True, "ignore_eos": True},
}


@pytest.fixture(scope="module")
def replicas(own_server, second_own_server):
    """Two replicas with the HTTP front (conftest's own_server and
    second_own_server), as {gRPC target: (server, HTTP root URL)}."""
    return {p.target: (p, f"http://{p.http_target}") for p in (own_server, second_own_server)}


def _sdk(base_url: str) -> openai.OpenAI:
    # No retries: the lost replica's error comes at once.
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)


def _chain(e: BaseException | None):
    """An exception and those it was raised from."""
    while e is not None:
        yield e
        e = e.__cause__ or e.__context__


def _turn(sdk: openai.OpenAI, messages: list) -> tuple[dict, list[int], list[int]]:
    """One turn on the session's URL: the message as the SDK returned it,
    the ids the turn followed and the ids it sampled (return_token_ids)."""
    r = sdk.chat.completions.create(model="tiny-qwen2", messages=messages, **TURN)
    message = r.choices[0].message.model_dump(exclude_none=True)
    return message, r.model_extra["prompt_token_ids"], r.choices[0].model_extra["token_ids"]


def test_a_lost_replicas_session_goes_on_at_the_url_the_fleet_hands_out(replicas):
    with Fleet(list(replicas), timeout=120, probe_seconds=None) as fleet:
        s = fleet.open_session(messages=[USER], max_total_tokens=1024)
        holder, root = replicas[s.replica.target]
        assert s.base_url == f"{root}/sessions/{s.id}/v1"
        # A second session on the same replica (the fewest sessions, then the
        # least recently picked), whose URL restarts a diverging history.
        filler = fleet.open_session(messages=[USER], max_total_tokens=256)
        r = fleet.open_session(messages=[USER], max_total_tokens=1024, history_rule="restart")
        filler.close()
        assert r.replica.target == holder.target
        with _sdk(r.base_url) as sdk:
            _turn(sdk, [USER])
            r_second, _, _ = _turn(sdk, COMPACTED)  # a new context
        r_copy = r.sync()
        assert [g.restarts_context for g in r_copy.segments].count(True) == 1

        messages = [USER]
        with _sdk(s.base_url) as sdk:
            first, _, _ = _turn(sdk, messages)
            messages += [first, {"role": "user", "content": "And the day after?"}]
            second, prompt2, ids2 = _turn(sdk, messages)
        # The trainer's copy takes in the turns made on the URL.
        copy = s.sync()
        assert list(copy.token_ids) == prompt2 + ids2
        with RolloutClient(s.replica.target) as c:
            assert c.session(s.id).trajectory() == copy

        holder.stop()  # the replica that holds the session is gone
        messages += [second, {"role": "user", "content": "Where do we stay?"}]
        with _sdk(s.base_url) as sdk, pytest.raises(openai.APIConnectionError) as lost:
            _turn(sdk, messages)
        assert any(isinstance(e, ConnectionRefusedError) for e in _chain(lost.value))

        # The trainer re-opens it from the copy and hands out the new URL.
        moved = s.sync()
        [(old_target, new_target, _)] = s.moves
        assert old_target == holder.target and new_target == s.replica.target != old_target
        _, new_root = replicas[new_target]
        assert s.base_url == f"{new_root}/sessions/{s.id}/v1"
        assert list(moved.token_ids) == list(copy.token_ids)

        # The agent, given only the new URL, sends the same messages again.
        with _sdk(s.base_url) as sdk:
            _, prompt3, ids3 = _turn(sdk, messages)
        with RolloutClient(new_target) as c:
            held = c.session(s.id).trajectory()
        n = len(copy.token_ids)
        assert held.resumed_tokens == n
        assert list(held.token_ids[:n]) == list(copy.token_ids)  # the history, token for token
        assert list(held.sources[:n]) == list(copy.sources)
        assert list(held.token_ids) == prompt3 + ids3  # the new turn follows it
        assert prompt3[:n] == list(copy.token_ids)
        assert held.segments[-1].source == pb.TOKEN_SOURCE_SAMPLED and len(ids3) == 6
        assert s.sync() == held
        s.close()

        # The restarted session moves with the messages of its new context.
        assert list(r.sync().token_ids) == list(r_copy.token_ids)
        [(_, r_target, _)] = r.moves
        assert r_target == new_target
        r_messages = [*COMPACTED, r_second, {"role": "user", "content": "Which museum?"}]
        with _sdk(r.base_url) as sdk:
            _, prompt_r, ids_r = _turn(sdk, r_messages)
        with RolloutClient(new_target) as c:
            held_r = c.session(r.id).trajectory()
        n = len(r_copy.token_ids)
        assert list(held_r.token_ids[:n]) == list(r_copy.token_ids)
        # Taken as the context it holds (no second restart), the turn follows it.
        [restart] = [g for g in held_r.segments if g.restarts_context]
        assert list(held_r.token_ids[restart.start :]) == prompt_r + ids_r
        assert held_r.segments[-1].source == pb.TOKEN_SOURCE_SAMPLED and len(ids_r) == 6
        r.close()
