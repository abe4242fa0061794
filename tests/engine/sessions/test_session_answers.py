"""What a session call answers when its session is not there, and how a
turn that fills the budget ends, against real servers: a malformed id, an
id of another running server and an id from before a real restart at the
same port each get NOT_FOUND with the reason that is true (only the last is
SESSION_LOST, the one a Fleet takes for a restarted replica), and a turn
whose last token fills the budget finishes FINISH_REASON_BUDGET even when
its max_tokens asked for exactly what was left."""

from __future__ import annotations

import grpc
import pytest

from harness.serverproc import ServerProcess
from rollout_client import RolloutClient, RolloutError, pb
from rollout_client.fleet import Fleet

GREEDY = {"temperature": 0, "ignore_eos": True}
SHAPE = "s<8 hex digits>-<8 hex digits>-<24 hex digits>"


class Restartable:
    """own_server, or the server that replaced it at its port."""

    def __init__(self, proc: ServerProcess) -> None:
        self.proc = proc

    def restart(self) -> None:
        """Stops the server and starts a new one at the same address, as a
        supervisor restarts a crashed one."""
        port = self.proc.port
        self.proc.stop()
        self.proc = ServerProcess(port=port)
        self.proc.wait_ready()

    def client(self) -> RolloutClient:
        return RolloutClient(self.proc.target, timeout=120)


@pytest.fixture(scope="module")
def own(own_server):
    r = Restartable(own_server)
    yield r
    if r.proc is not own_server:
        r.proc.stop(wait=False)


def refused(call, reason: str) -> RolloutError:
    with pytest.raises(RolloutError) as e:
        call()
    assert (e.value.code, e.value.reason) == (grpc.StatusCode.NOT_FOUND, reason), e.value
    return e.value


def every_call(client: RolloutClient, session_id: str):
    """Each session RPC that names a session, on `session_id`."""
    s = client.session(session_id)
    return [
        lambda: s.generate(max_tokens=1),
        lambda: list(s.generate_stream(max_tokens=1)),
        lambda: s.append(token_ids=[5]),
        s.trajectory,
        s.close,
    ]


def test_a_malformed_id_is_not_found_and_says_what_ids_look_like(own):
    with own.client() as c:
        for bad in ("no-such-session", "", "s" + "0" * 40, "../etc/passwd"):
            for call in every_call(c, bad):
                e = refused(call, "SESSION_NOT_FOUND")
                assert "not a session id this server issues" in e.details, e.details
                assert SHAPE in e.details


def test_an_id_of_another_server_is_not_found_and_names_that_server(server, own):
    """Not SESSION_LOST: the other server never restarted, and a Fleet
    told SESSION_LOST would take this replica for a restarted one."""
    with RolloutClient(server.target, timeout=120) as elsewhere, own.client() as c:
        with elsewhere.open_session(prompt_token_ids=[5, 6]) as theirs:
            for call in every_call(c, theirs.id):
                foreign = refused(call, "SESSION_NOT_FOUND")
                assert "opened on another server" in foreign.details, foreign.details
                assert theirs.id[1:9] in foreign.details  # the tag the id carries
            assert len(theirs.trajectory().token_ids) == 2  # still open where it is
    with Fleet([own.proc.target], probe_seconds=None, timeout=120) as f:
        f.refresh()
        before = f.status()
        f.failed(f.replicas[0], foreign, f.version or "")  # what a FleetSession would report
        assert f.status() == before, f.status()


def test_a_turn_that_fills_the_budget_ends_on_the_budget(own):
    with own.client() as c:
        with c.open_session(prompt_token_ids=[5, 17, 42, 99], max_total_tokens=12) as s:
            short = s.generate(max_tokens=3, **GREEDY)  # 5 left after it
            assert short.completion.finish_reason == pb.FINISH_REASON_LENGTH
            exact = s.generate(max_tokens=5, **GREEDY)  # exactly what is left
            assert len(exact.completion.token_ids) == 5
            assert exact.completion.finish_reason == pb.FINISH_REASON_BUDGET
            assert exact.state.budget_remaining == 0
            turns = [seg.finish_reason for seg in s.trajectory().segments[1:]]
            assert turns == [pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_BUDGET]
        with c.open_session(prompt_token_ids=[5, 17, 42, 99], max_total_tokens=10) as s:
            last = list(s.generate_stream(max_tokens=6, **GREEDY))[-1]
            assert last.delta.finish_reason == pb.FINISH_REASON_BUDGET
            assert last.state.budget_remaining == 0


def test_after_a_restart_only_this_servers_own_ids_are_lost(server, own):
    with RolloutClient(server.target, timeout=120) as elsewhere:
        theirs = elsewhere.open_session(prompt_token_ids=[5, 6])
        try:
            with own.client() as c:
                mine = c.open_session(prompt_token_ids=[5, 6, 7]).id
            own.restart()
            with own.client() as c:
                e = refused(c.session(mine).trajectory, "SESSION_LOST")
                assert mine in e.details and "restarted" in e.details, e.details
                e = refused(c.session(theirs.id).trajectory, "SESSION_NOT_FOUND")
                assert "opened on another server" in e.details, e.details
                with c.open_session(prompt_token_ids=[5]) as fresh:  # serves sessions again
                    assert fresh.generate(max_tokens=1).completion.token_ids
        finally:
            theirs.close()
