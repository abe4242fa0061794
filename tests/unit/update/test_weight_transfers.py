"""The open-update bookkeeping alone (no engine): the contract's rules where
begin enters, idle expiry, one at a time, a stalled UpdateWeights stream, and
the served model's slots marked stale by the transfer (the plan holds no
delta base), from their first byte or a same-host update's begin."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rollout.v1 import rollout_pb2 as pb
from rollout_service.status.errors import (
    Aborted,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
)
from rollout_service.update.plan import Placement, Target, plan_update
from rollout_service.update.transfers import WeightTransfers

SPEC = pb.TensorSpec(name="a", dtype=pb.D_TYPE_BFLOAT16, shape=[4])
BEGIN = pb.UpdateWeightsBegin(weight_version="v1", tensors=[SPEC])


class _Staging:
    size = 0

    def ensure(self, nbytes, prefault=False, room=0):
        return memoryview(bytearray(max(nbytes, 1)))


class _Updater:
    def __init__(self, staging=None, slots=None) -> None:
        self.staging = staging or _Staging()
        self.slots = slots  # {"a": 0}: full updates write into the served model's slot
        self.planned = 0
        self.stale: list[set[str]] = []

    async def plan(self, begin):
        self.planned += 1
        placement = Placement(self.staging, self.slots)
        return plan_update(begin, Target({"a": SPEC}, "v0"), placement, 1 << 20)

    def stale_slots(self, names: set[str]) -> None:
        self.stale.append(names)


class _Growing(_Staging):
    """A region whose growth takes until `grown` is set (a delta larger
    than any before it: allocating and faulting in gigabytes)."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.grown = threading.Event()

    def ensure(self, nbytes, prefault=False, room=0):
        self.threads.append(threading.current_thread())
        assert self.grown.wait(10)
        return super().ensure(nbytes)


def test_the_region_grows_off_the_event_loop_and_a_cancelled_begin_waits_for_it():
    region = _Growing()

    async def main():
        sessions = WeightTransfers(_Updater(region))
        begun = asyncio.ensure_future(sessions.begin(BEGIN))
        await asyncio.sleep(0.2)  # the loop goes on meanwhile
        assert region.threads and region.threads[0] is not threading.current_thread()
        begun.cancel()
        await asyncio.sleep(0.2)
        assert not begun.done(), "the begin ends with the growth, not before"
        with pytest.raises(Aborted):
            await sessions.begin(BEGIN)  # the region is still this update's
        region.grown.set()
        with pytest.raises(asyncio.CancelledError):
            await begun
        region.threads.clear()
        assert (await sessions.begin(BEGIN)).receiver is not None  # then free

    asyncio.run(main())


def test_an_idle_update_expires_and_frees_the_region():
    async def main():
        sessions = WeightTransfers(_Updater(), idle_timeout_seconds=1.0)
        s = await sessions.begin(BEGIN)
        with pytest.raises(Aborted):
            await sessions.begin(BEGIN)
        for _ in range(3):  # 1.5 s in all, but never 1 s without a call naming it
            await asyncio.sleep(0.5)
            assert sessions.get(s.id) is s
        await asyncio.sleep(2.0)
        with pytest.raises(FailedPrecondition, match="expired"):
            sessions.get(s.id)
        await sessions.begin(BEGIN)  # the region is free again

    asyncio.run(main())


def test_a_stalled_stream_is_cut_after_the_idle_timeout():
    async def main():
        sessions = WeightTransfers(_Updater(), idle_timeout_seconds=0.2)

        async def stalled():
            yield pb.UpdateWeightsRequest(begin=BEGIN)
            await asyncio.sleep(10)

        with pytest.raises(DeadlineExceeded, match="no message"):
            await sessions.update_stream(stalled())
        await sessions.begin(BEGIN)  # nothing left open

    asyncio.run(main())


def _begin(**kw) -> pb.UpdateWeightsBegin:
    return pb.UpdateWeightsBegin(**{"weight_version": "v1", "tensors": [SPEC], **kw})


@pytest.mark.parametrize(
    ("begin", "field"),
    [
        (_begin(weight_version=""), "begin.weight_version"),
        (_begin(weight_version="v" * 257), "begin.weight_version"),
        (_begin(drain_timeout_seconds=0), "begin.drain_timeout_seconds"),
        (_begin(drain_timeout_seconds=float("nan")), "begin.drain_timeout_seconds"),
        (_begin(pause_mode=77), "begin.pause_mode"),
        (
            _begin(tensors=[pb.TensorSpec(name="a", dtype=SPEC.dtype, shape=[4], encoding=99)]),
            "begin.tensors[0].encoding",
        ),
        (_begin(adapter=pb.AdapterTarget(name="x", action=99)), "begin.adapter.action"),
    ],
)
def test_a_begin_outside_the_contracts_rules_is_refused_before_it_is_planned(begin, field):
    """The rules the proto states (static_rules) hold for every update,
    staged or streamed: WeightTransfers.begin is where each begins."""

    async def main():
        updater = _Updater()
        sessions = WeightTransfers(updater)
        with pytest.raises(InvalidArgument) as e:
            await sessions.begin(begin)
        assert e.value.field == field and updater.planned == 0
        s = await sessions.begin(BEGIN)  # nothing held
        sessions.abort(s)

    asyncio.run(main())


def test_the_transfer_marks_a_slot_stale_at_its_first_byte():
    """A full update into the served model's slots: the updater hears of a
    slot when the first byte is written into it, not at begin (an update
    aborted before any keeps the delta base); a same-host update's at its
    begin, since its client writes unseen; a packed update's never."""

    async def main():
        updater = _Updater(slots={"a": 0})
        transfers = WeightTransfers(updater)
        transfer = await transfers.begin(BEGIN)
        assert transfer.receiver.plan.writes_slots and updater.stale == []
        transfer.receiver.add_chunk(0, 0, b"x")
        transfer.receiver.add_chunk(0, 1, b"y")
        assert updater.stale == [{"a"}]
        transfers.abort(transfer)

        same_host = _Updater(slots={"a": 0})
        await WeightTransfers(same_host).begin(BEGIN, same_host=True)
        assert same_host.stale == [{"a"}]

        packed = _Updater()  # no slots: packed in begin's order
        (await WeightTransfers(packed).begin(BEGIN)).receiver.add_chunk(0, 0, b"x")
        assert packed.stale == []

    asyncio.run(main())
