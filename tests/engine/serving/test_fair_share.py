"""Fair share between callers, against real servers.

The noisy neighbour (harness/noisy_neighbour.py): on the secure server, caller
A (one generate token) submits 600 unary Generate calls of 256 tokens at once;
once they are all on the server, caller B (another generate token) sends one
16-token greedy call. First come, first served, B waits behind the flood: it
is answered after at least the 472 of A's calls the engine queued before it
(measured: 8.5 s against 41 ms idle, `--no-fair-share` in
benchmarks/fair_share.py). Fairly shared it is answered before any of them.
Latency targets (B within 5x of its idle latency; measured 3.5x to 4.4x here)
live in that benchmark, not in this test: they depend on the machine. A's
flood loses no request. The server's flags (tests/conftest.py) cap a caller at
600 generations in flight: A's 601st is refused with a retry hint, B is not.

The front shares itself too: gRPC accepts each method's calls in a queue of
its own (rpc/handlers.py), so B's control calls are not accepted behind a
burst of A's other calls. Streaming floods' latencies (B's first token,
GetServerInfo, an Abort's lateness) are benchmarks/fair_share.py's.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from harness import noisy_neighbour
from rollout_client import AsyncRolloutClient, RolloutClient, RolloutError, pb
from tests.support.tokens import ADMIN, GENERATE, GENERATE_B

FLOOD = 600  # the secure server's --max-requests-per-caller


@pytest.mark.timeout(240)
def test_a_flooding_caller_does_not_starve_another_and_is_capped(shared_secure):
    tls = shared_secure.tls
    target = shared_secure.proc.target
    seen: dict = {}
    flooded = asyncio.Event()

    async def under_the_flood(a: AsyncRolloutClient) -> None:
        async with AsyncRolloutClient(target, token=ADMIN, **tls) as admin:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                fair = (await admin.server_info()).fair_share
                if fair.callers and fair.callers[0].in_flight == FLOOD:
                    break
                await asyncio.sleep(0.02)
            seen["fair"] = fair
            # A's flood is all in flight: one more is refused, before any work
            try:
                await a.generate(prompt_token_ids=[1, 2, 3], max_tokens=1)
            except RolloutError as e:
                seen["refused"] = e
            flooded.set()

    out = asyncio.run(
        noisy_neighbour.run(
            target,
            {"token": GENERATE, **tls},
            {"token": GENERATE_B, **tls},
            flood_calls=FLOOD,
            meanwhile=under_the_flood,
            until=flooded.wait,
        )
    )
    print(
        f"B idle {out.idle * 1000:.1f} ms, behind A's flood {out.probe_seconds * 1000:.1f} ms "
        f"({out.ratio:.1f}x), after {out.flood_done_before_probe} of A's calls; "
        f"A: {out.flood_ok} of {FLOOD} in {out.flood_seconds:.1f} s"
    )
    assert out.flood_ok == FLOOD, out.flood_failed[:3]
    assert out.flood_tokens == FLOOD * 256
    # B was not queued behind A's flood (first come, first served: >= 472)
    assert out.flood_done_before_probe < FLOOD // 4, out.flood_done_before_probe
    fair = seen["fair"]
    assert fair.enabled and fair.max_requests_per_caller == FLOOD
    assert dict(fair.shares) == {"admin": 2}
    (a,) = fair.callers  # B's idle calls had ended; A alone, all 600 in flight
    assert a.caller.startswith("generate:") and a.in_flight == FLOOD and a.share == 1
    # A holds at most its seats of the engine: the rest stay free for others
    assert 0 < fair.engine_seats_per_caller < FLOOD
    assert 0 < a.in_engine <= fair.engine_seats_per_caller
    refused = seen["refused"]
    assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused.reason == "CALLER_QUEUE_FULL" and "--max-requests-per-caller" in refused.details


def test_a_tenant_names_a_caller_without_auth_and_a_bad_one_is_refused(server):
    with (
        RolloutClient(server.target, tenant="eval-job", timeout=60) as tenant,
        RolloutClient(server.target, timeout=60) as other,
    ):
        # The looking caller connected first: the lookup is one call while
        # the stream runs (400 tokens once ended first on a fast host; 2000
        # ended once while the lookup's channel connected on a loaded one).
        other.server_info()
        stream = tenant.generate_stream(
            prompt_token_ids=[1, 2, 3], max_tokens=2000, ignore_eos=True
        )
        next(stream)  # running
        callers = {c.caller: c.in_flight for c in other.server_info().fair_share.callers}
        assert callers.get("tenant:eval-job") == 1
        stream.close()
    with RolloutClient(server.target, tenant="x" * 65, timeout=60) as bad:
        with pytest.raises(RolloutError) as refused:
            bad.generate(prompt_token_ids=[1, 2, 3], max_tokens=1)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details.startswith("metadata rollout-tenant:")


def test_an_aborted_call_waiting_for_a_seat_ends_at_once(server):
    """A caller past its engine seats: its next call waits in the server, and
    Abort ends it at once, as it ends one queued in the engine."""

    async def main():
        opts = {"tenant": "seats", "timeout": 120, "retries": 0}
        async with (
            AsyncRolloutClient(server.target, **opts) as c,
            AsyncRolloutClient(server.target, timeout=60) as other,
        ):
            seats = (await other.server_info()).fair_share.engine_seats_per_caller
            done: list[int] = []

            async def long(i: int):
                r = await c.generate(
                    prompt_token_ids=[5, 6, i % 50 + 7], max_tokens=400, ignore_eos=True
                )
                done.append(i)
                return r

            flood = [asyncio.ensure_future(long(i)) for i in range(seats)]
            while True:
                callers = {x.caller: x for x in (await other.server_info()).fair_share.callers}
                if (x := callers.get("tenant:seats")) and x.in_engine == seats:
                    break
                await asyncio.sleep(0.02)
            waiting = asyncio.ensure_future(
                c.generate(prompt_token_ids=[5, 6, 7], max_tokens=400, request_id="seatless")
            )
            while callers["tenant:seats"].in_flight < seats + 1:
                callers = {x.caller: x for x in (await other.server_info()).fair_share.callers}
                await asyncio.sleep(0.02)
            assert callers["tenant:seats"].in_engine == seats  # it waits for a seat
            assert list((await other.abort(request_ids=["seatless"])).request_ids) == ["seatless"]
            r = await asyncio.wait_for(waiting, 30)
            ended_before = len(done)
            await asyncio.gather(*flood)
        return r, ended_before, seats

    r, ended_before, seats = asyncio.run(main())
    assert r.completions[0].finish_reason == pb.FINISH_REASON_ABORT
    assert len(r.completions[0].token_ids) == 0
    # ... at once: before any of the calls holding the seats ended
    assert ended_before == 0 and seats > 0


def test_a_burst_of_another_callers_calls_does_not_hold_a_control_call(server):
    """A sends 300 Tokenize calls at once; B's GetServerInfo and Abort, sent
    just after, are answered before most of them: with one accept queue for
    every method (the generic handler alone) both were answered after
    all 300 of A's (twice; registered: 16)."""
    burst = 300

    async def main():
        async with (
            AsyncRolloutClient(server.target, tenant="burst-a", timeout=120) as a,
            AsyncRolloutClient(server.target, tenant="burst-b", timeout=120) as b,
        ):
            await asyncio.gather(a.tokenize(text="warm"), b.server_info())
            done: list[int] = []

            async def one(i: int) -> None:
                await a.tokenize(text=f"the burst's call {i}")
                done.append(i)

            calls = asyncio.gather(*(one(i) for i in range(burst)))
            await asyncio.sleep(0.005)  # A's calls are sent first
            info = asyncio.ensure_future(b.server_info())
            aborted = asyncio.ensure_future(b.abort(request_ids=["nothing-of-b"]))
            seen = {}
            info.add_done_callback(lambda _: seen.setdefault("info", len(done)))
            aborted.add_done_callback(lambda _: seen.setdefault("abort", len(done)))
            await asyncio.gather(calls, info, aborted)
            assert list(aborted.result().request_ids) == []
            return seen

    seen = asyncio.run(main())
    print(f"of A's {burst} calls, answered before B's GetServerInfo and Abort: {seen}")
    assert seen["info"] < burst // 2 and seen["abort"] < burst // 2, seen
