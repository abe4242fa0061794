"""Receiving updates: one UpdateWeights stream, or a staged update (begin,
any number of concurrent upload streams or a same-host write, commit).

Both are the chain of updates.py: begin becomes a plan (WeightUpdater.plan),
a Upload writes the bytes into the staging region and checks them before
the engine is touched, and the received update ends in WeightUpdater.apply.
At most one update is open or applying at a time: the staging region is
single, and a second update waiting behind the first would only apply stale
weights later, so it is refused at once (ABORTED).

Except its twin: a client whose call was cancelled after its commit (a
network blip) cannot tell whether it applied and sends the same update
again, often while the first is still applying. A begin that may be the same
update as the one applying (could_be_twins) waits for it to end, then goes
on as if it had come after: its bytes are received and compared, and it is
answered `replayed` if the twin applied (base_weights.py), or applied itself if
the twin failed; nothing of it touches the region before then. CommitUpdate
of the update applying waits for it and returns its outcome.

An open update that nobody touches for `idle_timeout_seconds` (a stalled or
vanished trainer) is aborted, so it cannot hold updates back for ever; the
same bound applies between two messages of an UpdateWeights stream. One whose
commit was refused (bytes missing or corrupt) stays open for them, but no
longer holds the slot: the next update to begin discards it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid

from rollout.v1 import rollout_pb2 as pb
from rollout_codecs.wire import RawChunk
from rollout_service.status import static_rules
from rollout_service.status.errors import (
    Aborted,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
)
from rollout_service.update.received import ReceivedUpdate
from rollout_service.update.timings import Arrival
from rollout_service.update.updates import WeightUpdater
from rollout_service.update.upload import Upload

log = logging.getLogger(__name__)


class State(enum.Enum):
    """Where an update transfer is: OPEN -> COMMITTING -> DONE, or OPEN ->
    ABORTED; CommitUpdate passes through CHECKING (its bytes checked, uploads
    refused), and back to OPEN if they are refused."""

    OPEN = "open"
    CHECKING = "checking"
    COMMITTING = "committing"
    DONE = "done"
    ABORTED = "aborted"


class WeightTransfer:
    """One open update."""

    def __init__(self, receiver: Upload, same_host: bool, started: float) -> None:
        self.id = uuid.uuid4().hex
        self.receiver = receiver
        self.begin = receiver.plan.begin
        self.same_host = same_host
        self.started = started
        self.touched = time.monotonic()
        self.state = State.OPEN
        self.expiry: asyncio.Future | None = None
        # The apply, while committing: twins wait for it.
        self.applying: asyncio.Future | None = None
        # A CommitUpdate of it was refused: it no longer holds the slot.
        self.refused = False

    def touch(self) -> None:
        self.touched = time.monotonic()


class WeightTransfers:
    """The open update, if any, and the calls that drive it."""

    def __init__(self, updater: WeightUpdater, idle_timeout_seconds: float = 300.0) -> None:
        self.updater = updater
        self.idle_timeout_seconds = idle_timeout_seconds
        self._current: WeightTransfer | None = None
        # An update is being begun (planned, its region reserved): it holds
        # the slot before it is an WeightTransfer.
        self._opening = False
        # The last committed update: CommitUpdate retried returns its ack.
        self._committed: tuple[str, pb.UpdateWeightsResponse] | None = None

    async def begin(self, begin: pb.UpdateWeightsBegin, same_host: bool = False) -> WeightTransfer:
        """Opens an update: validates begin and takes the staging region."""
        static_rules.check(begin, "begin")  # the contract's ranges, before any state
        await self._wait_for_twin(begin)
        self._take_slot()
        # Taken before the first await, so that a concurrent begin is refused.
        self._opening = True
        started = time.perf_counter()
        reserving = None
        try:
            plan = await self.updater.plan(begin)
            # Growing the region takes time that grows with the update: in a
            # thread, which ends before the slot is given up even if the
            # call is cancelled, so the next update never finds it half-grown.
            reserving = asyncio.ensure_future(asyncio.to_thread(plan.reserve))
            buf = await asyncio.shield(reserving)
        except BaseException:
            if reserving is not None and not reserving.done():
                await asyncio.wait([reserving])
            raise
        finally:
            self._opening = False
        # The served model's slots it writes into are marked stale by the
        # updater as their first bytes come (the plan stays pure).
        upload = Upload(plan, buf, same_host=same_host, writing=self.updater.stale_slots)
        transfer = self._current = WeightTransfer(upload, same_host, started)
        # Referenced from the transfer: the loop keeps only weak references.
        transfer.expiry = asyncio.ensure_future(self._expire_when_idle(transfer))
        return transfer

    async def _wait_for_twin(self, begin: pb.UpdateWeightsBegin) -> None:
        """Until no update that may be this one is applying (whatever its
        outcome: this one then goes on as if it had come after)."""
        while (s := self._current) is not None and s.state == State.COMMITTING:
            if not could_be_twins(s.begin, begin):
                return
            log.info("update %r waits for its twin %s to be applied", begin.weight_version, s.id)
            assert s.applying is not None
            await asyncio.wait([s.applying])

    def _take_slot(self) -> None:
        """Refuses a new update while another is open or applying, except one
        whose commit was refused: that one is discarded instead, so that a
        client that never comes back for it holds nothing until its idle
        timeout."""
        if self._opening:
            raise Aborted("another update is open; only one runs at a time")
        s = self._current
        if s is None:
            return
        if s.state == State.OPEN and s.refused:
            self.abort(s, "replaced by a new update after its commit was refused")
            return
        what = "being applied" if s.state == State.COMMITTING else "open"
        raise Aborted(f"another update is {what}; only one runs at a time")

    def get(self, update_id: str) -> WeightTransfer:
        """The open update named `update_id`."""
        s = self._current
        if s is None or s.id != update_id:
            raise FailedPrecondition(
                f"update_id: {update_id!r} is not open (never begun, committed, aborted, "
                "replaced after a refused commit, or expired after the idle timeout)",
                reason=pb.ERROR_REASON_UPDATE_NOT_OPEN,
            )
        if s.state != State.OPEN:
            raise FailedPrecondition(
                f"update_id: {update_id!r} is being applied", reason=pb.ERROR_REASON_UPDATE_NOT_OPEN
            )
        s.touch()
        return s

    def upload(self, transfer: WeightTransfer, msg: RawChunk | pb.UploadChunksRequest) -> int:
        """Writes an UploadChunksRequest's chunk or chunks; returns their size."""
        if transfer.state != State.OPEN:
            raise FailedPrecondition(
                f"update_id: {transfer.id!r} is no longer open",
                reason=pb.ERROR_REASON_UPDATE_NOT_OPEN,
            )
        transfer.touch()
        if isinstance(msg, RawChunk):
            transfer.receiver.add_chunk(msg.tensor_index, msg.offset, msg.data)
            return len(msg.data)
        if msg.HasField("chunks"):
            if msg.HasField("chunk"):
                raise InvalidArgument("chunks", "set chunk or chunks, not both")
            transfer.receiver.add_chunks(msg.chunks.chunks)
            return sum(len(c.data) for c in msg.chunks.chunks)
        transfer.receiver.add_chunk(msg.chunk.tensor_index, msg.chunk.offset, msg.chunk.data)
        return len(msg.chunk.data)

    def status(self, transfer: WeightTransfer) -> pb.GetUpdateStatusResponse:
        a = transfer.receiver
        return pb.GetUpdateStatusResponse(
            bytes_received=a.bytes_received,
            total_bytes=a.total_bytes,
            missing=[pb.ByteRange(tensor_index=i, offset=o, length=n) for i, o, n in a.missing()],
        )

    async def commit(self, update_id: str) -> pb.UpdateWeightsResponse:
        """Applies the open update; a retry of the last commit gets its ack,
        one while it applies its outcome (its ack, or its failure)."""
        if self._committed is not None and self._committed[0] == update_id:
            return _replayed(self._committed[1])
        s = self._current
        if s is not None and s.id == update_id and s.state == State.COMMITTING:
            assert s.applying is not None
            return _replayed(await asyncio.shield(s.applying))
        transfer = self.get(update_id)
        if transfer.same_host:
            transfer.receiver.mark_written()
        transfer.state = State.CHECKING
        return await asyncio.shield(self._check_and_apply(transfer, stream=False))

    async def _check_and_apply(
        self, transfer: WeightTransfer, stream: bool
    ) -> pb.UpdateWeightsResponse:
        """The commit is in: its bytes are checked, then it is applied, to the
        end even if the call that committed goes away (shielded by callers).
        The checksums take time that grows with the update: in a thread,
        while uploads to it are refused (State.CHECKING)."""
        committed_at = time.perf_counter()
        # What a KEEP should keep: the generations running at the commit.
        running = self.updater.quiescer.running_requests()
        try:
            update = await asyncio.to_thread(transfer.receiver.finish, require_commit=stream)
        except BaseException:
            transfer.state = State.OPEN
            if stream:
                self.abort(transfer, "refused at its commit")
            else:
                # Incomplete or corrupt: refused, and the update stays open
                # for the missing bytes (GetUpdateStatus names them; corrupt
                # ones count as missing), until another update begins.
                transfer.refused = True
            raise
        arrival = Arrival(
            receive_s=committed_at - transfer.started,
            committed_at=committed_at,
            checked_at=time.perf_counter(),
            running=running,
        )
        return await self._apply(transfer, update, arrival)

    def abort(self, transfer: WeightTransfer, why: str = "aborted") -> None:
        if transfer.state == State.OPEN and self._current is transfer:
            transfer.state = State.ABORTED
            self._current = None
            received = transfer.receiver.bytes_received
            log.info("update %s %s after %d bytes", transfer.id, why, received)

    async def _apply(
        self, transfer: WeightTransfer, update: ReceivedUpdate, arrival: Arrival
    ) -> pb.UpdateWeightsResponse:
        transfer.state = State.COMMITTING
        apply = transfer.applying = asyncio.ensure_future(self.updater.apply(update, arrival))

        def done(f: asyncio.Future) -> None:
            transfer.state = State.DONE
            if self._current is transfer:
                self._current = None
            if not f.cancelled() and f.exception() is None:
                # Even when the caller went away: its retry gets this ack.
                self._committed = (transfer.id, f.result())

        apply.add_done_callback(done)
        # Runs inside the commit's shield: the caller going away does not
        # cancel it, and the transfer stays busy until it has finished.
        return await apply

    async def _expire_when_idle(self, transfer: WeightTransfer) -> None:
        while transfer.state in (State.OPEN, State.CHECKING) and self._current is transfer:
            idle = time.monotonic() - transfer.touched
            if idle >= self.idle_timeout_seconds and transfer.state == State.OPEN:
                self.abort(transfer, f"expired after {idle:.0f}s without a call")
                return
            # (While checking it is not idle: looked at again shortly.)
            await asyncio.sleep(max(self.idle_timeout_seconds - idle, 0.5))

    async def update_stream(self, messages) -> pb.UpdateWeightsResponse:
        """One UpdateWeights stream: begin, chunks, commit, then the apply.
        Before its commit is in, an error or a cancelled call aborts it."""
        transfer = None
        try:
            try:
                transfer = await self._receive(messages)
            except TimeoutError:
                raise DeadlineExceeded(
                    f"UpdateWeights: no message for {self.idle_timeout_seconds:.0f}s "
                    "(--update-idle-timeout-seconds); the update is discarded"
                ) from None
            # From here the update runs to its end even if the call is
            # cancelled: the server has its commit.
            transfer.state = State.CHECKING
            return await asyncio.shield(self._check_and_apply(transfer, stream=True))
        finally:
            if transfer is not None:
                self.abort(transfer, "ended without being applied")

    async def _receive(self, messages) -> WeightTransfer:
        loop = asyncio.get_running_loop()
        transfer = None
        # One timer for the whole stream, pushed back at every message
        # (cheaper than a timeout per message).
        try:
            async with asyncio.timeout(None) as idle:
                async for msg in messages:
                    idle.reschedule(loop.time() + self.idle_timeout_seconds)
                    if transfer is None:
                        kind = "chunk" if isinstance(msg, RawChunk) else msg.WhichOneof("kind")
                        if kind != "begin":
                            raise InvalidArgument(kind or "kind", "the first message must be begin")
                        # Waiting for a twin's apply is the server's time,
                        # not the client's idleness.
                        idle.reschedule(None)
                        transfer = await self.begin(msg.begin)
                        idle.reschedule(loop.time() + self.idle_timeout_seconds)
                    else:
                        transfer.touch()
                        transfer.receiver.feed(msg)
        except BaseException:
            if transfer is not None:
                self.abort(transfer, "ended without being applied")
            raise
        if transfer is None:
            raise InvalidArgument("begin", "the stream ended before begin")
        return transfer


def could_be_twins(a: pb.UpdateWeightsBegin, b: pb.UpdateWeightsBegin) -> bool:
    """Whether `b` may be the same update as `a`, from their begins: the same
    version, target and tensors (names, dtypes, shapes, in order), and equal
    checksums where both declare one. The bytes decide after (updates.py)."""
    if (a.weight_version, a.HasField("adapter"), a.base_version) != (
        b.weight_version,
        b.HasField("adapter"),
        b.base_version,
    ):
        return False
    if a.adapter != b.adapter or len(a.tensors) != len(b.tensors):
        return False
    return all(
        (x.name, x.dtype, list(x.shape), x.encoding) == (y.name, y.dtype, list(y.shape), y.encoding)
        and not (x.HasField("crc32c") and y.HasField("crc32c") and x.crc32c != y.crc32c)
        for x, y in zip(a.tensors, b.tensors)
    )


def _replayed(ack: pb.UpdateWeightsResponse) -> pb.UpdateWeightsResponse:
    """A copy of `ack` marked as returned again."""
    out = pb.UpdateWeightsResponse()
    out.CopyFrom(ack)
    out.replayed = True
    return out
