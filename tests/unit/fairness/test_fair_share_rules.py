"""Fair share's pure pieces, without an engine: priorities that interleave
callers by their shares, the per-caller cap and its retry hint, engine seats,
the ledger's bound, and who a call counts against."""

from __future__ import annotations

import asyncio
from contextlib import ExitStack

import pytest

from rollout_client import pb
from rollout_client.calls.connection import ConnectionOptions
from rollout_service.fairness.identity import CallerId, caller_id, tenant_of
from rollout_service.fairness.share import FairShare, parse_shares
from rollout_service.ops.auth import CALLER, Caller
from rollout_service.status.errors import InvalidArgument, ResourceExhausted
from rollout_service.status.trailers import details_trailer

A = CallerId("token:a", "generate", "generate:a")
B = CallerId("token:b", "generate", "generate:b")
ADMIN = CallerId("token:c", "admin", "admin:c")


def priorities(fair: FairShare, order: list[CallerId], stack: ExitStack) -> list[int]:
    return [stack.enter_context(fair.slot(who)).priority for who in order]


def test_a_flood_does_not_push_another_callers_request_back():
    fair = FairShare(True, {}, None)
    with ExitStack() as stack:
        flood = priorities(fair, [A] * 5, stack)
        (late,) = priorities(fair, [B], stack)
        # vLLM runs lower values first, ties in arrival order: B's one request
        # is second in line, not sixth.
        assert flood == [0, 1, 2, 3, 4] and late == 0
        assert fair.to_proto().callers[0] == pb.CallerLoad(
            caller="generate:a", share=1, in_flight=5
        )
    # a caller with nothing in flight is forgotten: the ledger holds only
    # callers with requests in flight (it is bounded by them)
    assert fair.callers == {}


def test_shares_weight_the_interleaving_and_off_is_first_come_first_served():
    fair = FairShare(True, parse_shares("admin=2, generate=1"), None)
    with ExitStack() as stack:
        assert priorities(fair, [ADMIN] * 4 + [A] * 2, stack) == [0, 0, 1, 1, 0, 1]
    off = FairShare(False, {}, None)
    with ExitStack() as stack:
        assert priorities(off, [A] * 3 + [B], stack) == [0, 0, 0, 0]
    assert off.seats is None and off.to_proto().enabled is False


def test_past_its_cap_a_caller_is_refused_with_a_retry_hint_and_others_are_not():
    fair = FairShare(True, {}, 2)
    with ExitStack() as stack:
        priorities(fair, [A, A], stack)
        with pytest.raises(ResourceExhausted) as refused:
            priorities(fair, [A], stack)
        assert refused.value.reason == pb.ERROR_REASON_CALLER_QUEUE_FULL
        assert "--max-requests-per-caller" in refused.value.message
        assert refused.value.retry_after and refused.value.retry_after > 0
        assert fair.callers["token:a"].in_flight == 2  # the refused one is not counted
        priorities(fair, [B], stack)  # another caller is not affected
    from google.rpc import error_details_pb2, status_pb2

    ((_, raw),) = details_trailer(
        refused.value.code, refused.value.message, refused.value.reason, None, 1.5
    )
    details = status_pb2.Status.FromString(raw).details
    retry = error_details_pb2.RetryInfo()
    assert any(d.Unpack(retry) for d in details) and retry.retry_delay.ToMilliseconds() == 1500


def test_a_caller_holds_at_most_its_seats_in_the_engine_in_arrival_order():
    async def main():
        fair = FairShare(True, {}, None, seats=2)
        inside: list[int] = []
        release = asyncio.Event()

        async def request(i: int, who: CallerId) -> None:
            with fair.slot(who) as slot:
                async with slot.seat(asyncio.Event()):
                    inside.append(i)
                    await release.wait()

        tasks = [asyncio.ensure_future(request(i, A)) for i in range(4)]
        tasks.append(asyncio.ensure_future(request(9, B)))
        await asyncio.sleep(0.05)
        assert inside == [0, 1, 9]  # A waits for a seat; B gets one at once
        a = fair.callers["token:a"]
        assert (a.in_flight, a.in_engine) == (4, 2)
        release.set()
        await asyncio.gather(*tasks)
        assert inside == [0, 1, 9, 2, 3]

    asyncio.run(main())
    assert FairShare.default_seats(256) == 224 and FairShare.default_seats(1) == 1


@pytest.mark.parametrize(
    "spec",
    ["generate", "root=2", "admin=0", "admin=1001", "admin=1.5", "tenant:x=-1", "=3"],
)
def test_bad_share_specs_are_refused_at_start(spec):
    with pytest.raises(ValueError, match="--caller-shares"):
        parse_shares(spec)


class _Context:
    def __init__(self, metadata=(), peer="ipv4:127.0.0.1:5000"):
        self._metadata = metadata
        self._peer = peer

    def invocation_metadata(self):
        return self._metadata

    def peer(self):
        return self._peer


def test_a_caller_is_its_token_else_its_tenant_else_its_connection():
    tenant = (("rollout-tenant", "eval"),)
    token = CALLER.set(Caller(owner="0123456789abcdef", admin=False))
    try:
        # with auth on, the token decides: a tenant header cannot pose as another
        assert caller_id(_Context(tenant)) == CallerId(
            "token:0123456789abcdef", "generate", "generate:0123456789ab"
        )
    finally:
        CALLER.reset(token)
    assert caller_id(_Context(tenant)) == CallerId("tenant:eval", "tenant:eval", "tenant:eval")
    one, other = caller_id(_Context()), caller_id(_Context(peer="ipv4:127.0.0.1:5001"))
    assert one.key != other.key and one.label == other.label == "connection"
    assert ConnectionOptions(tenant="eval").metadata() == tenant


@pytest.mark.parametrize("value", ["", "x" * 65, "caf\u00e9", "a\nb"])
def test_a_bad_tenant_is_refused_naming_the_metadata(value):
    with pytest.raises(InvalidArgument) as refused:
        tenant_of((("rollout-tenant", value),))
    assert refused.value.field == "metadata rollout-tenant"


def test_a_call_that_fails_or_is_cancelled_gives_its_place_back():
    async def main():
        fair = FairShare(True, {}, 1, seats=1)

        async def hold(who: CallerId, ready: asyncio.Event) -> None:
            with fair.slot(who) as slot:
                async with slot.seat(asyncio.Event()):
                    ready.set()
                    await asyncio.sleep(60)

        ready = asyncio.Event()
        held = asyncio.ensure_future(hold(A, ready))
        await ready.wait()
        with pytest.raises(ResourceExhausted):
            await hold(A, asyncio.Event())
        held.cancel()  # its client went away
        with pytest.raises(asyncio.CancelledError):
            await held
        with pytest.raises(RuntimeError), fair.slot(A):
            raise RuntimeError("the engine failed it")
        again = asyncio.Event()
        task = asyncio.ensure_future(hold(A, again))
        await asyncio.wait_for(again.wait(), 5)  # the cap and the seat are free
        task.cancel()
        assert fair.callers["token:a"].in_flight == 1

    asyncio.run(main())


def test_an_aborted_call_waiting_for_a_seat_ends_at_once_and_takes_none():
    async def main():
        fair = FairShare(True, {}, None, seats=1)
        release = asyncio.Event()
        outcomes: list[bool] = []

        async def request(abandon: asyncio.Event) -> None:
            with fair.slot(A) as slot:
                async with slot.seat(abandon) as seated:
                    outcomes.append(seated)
                    if seated:
                        await release.wait()

        first = asyncio.ensure_future(request(asyncio.Event()))
        await asyncio.sleep(0.01)
        aborted = asyncio.Event()
        waiting = asyncio.ensure_future(request(aborted))
        await asyncio.sleep(0.01)
        assert outcomes == [True] and not waiting.done()
        aborted.set()  # Abort: the waiting call ends without its turn
        await asyncio.wait_for(waiting, 1)
        assert outcomes == [True, False]
        release.set()
        await first
        # the seat is free again (the aborted call did not take it)
        third = asyncio.ensure_future(request(asyncio.Event()))
        await asyncio.wait_for(third, 1)
        assert outcomes == [True, False, True]
        assert fair.callers == {}

    asyncio.run(main())
