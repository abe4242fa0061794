"""The asyncio client's update over grpc.aio channels, the three ways of
push.py (one stream, parallel uploads, the same-host handoff) with push.py's
messages and steps: each message is made, and the staging region filled, in
a worker thread, since reading a tensor's bytes may block (a file, a device
copy, a conversion) and the event loop must not. Retried like the blocking
push (updates.retry_delay).

Cancelled (a timeout, Ctrl-C under asyncio.run), the calls are cancelled
with the task, the push is stopped before its commit and a staged update is
aborted; interrupts.noted tells the caller whether the commit had been sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

import grpc

from rollout.v1 import rollout_pb2 as pb
from rollout.v1 import rollout_pb2_grpc
from rollout_client.calls.connection import ConnectionOptions
from rollout_client.weights import push, updates
from rollout_client.weights.interrupts import Stopped


async def _requests(u: push.Update) -> AsyncIterator[bytes]:
    for step in push.update_weights_steps(u):
        yield await asyncio.to_thread(step)


async def one_stream(channel: grpc.aio.Channel, u: push.Update) -> pb.UpdateWeightsResponse:
    """UpdateWeights: begin, every chunk in order, commit, on one call."""
    call: grpc.aio.StreamUnaryMultiCallable[bytes, pb.UpdateWeightsResponse] = channel.stream_unary(
        push.UPDATE_WEIGHTS,
        request_serializer=None,  # the requests are serialized already
        response_deserializer=pb.UpdateWeightsResponse.FromString,
    )
    return await call(_requests(u), timeout=u.timeout, metadata=u.metadata)


async def parallel(
    channels: Sequence[grpc.aio.Channel], u: push.Update, resume_attempts: int = 2
) -> pb.UpdateWeightsResponse:
    """push.parallel on grpc.aio: BeginUpdate, one UploadChunks stream per
    channel, the missing ranges again, CommitUpdate; aborted on error."""
    stub = rollout_pb2_grpc.RolloutServiceStub(channels[0])
    request = pb.BeginUpdateRequest(begin=u.begin)
    opened = await stub.BeginUpdate(request, timeout=u.timeout, metadata=u.metadata)
    uid = opened.update_id
    try:
        todo = push.groups(u, push.pieces(u))
        for attempt in range(resume_attempts + 1):
            errors = await _upload(channels, u, uid, todo)
            status = await stub.GetUpdateStatus(
                pb.GetUpdateStatusRequest(update_id=uid), timeout=u.timeout, metadata=u.metadata
            )
            if not status.missing:
                break
            if attempt == resume_attempts:
                raise errors[0] if errors else RuntimeError("upload incomplete")
            todo = push.missing_groups(u, status)
        return await _commit(stub, uid, u)
    except BaseException as e:
        await _abort(stub, uid, u, e)
        raise


async def _upload(
    channels: Sequence[grpc.aio.Channel], u: push.Update, uid: str, todo: Iterator[list[push.Piece]]
) -> list[grpc.RpcError]:
    """One UploadChunks stream per channel, all drawing from `todo` (the
    event loop's one thread draws: no lock)."""
    errors: list[grpc.RpcError] = []

    async def requests() -> AsyncIterator[bytes]:
        while not u.state.stopped and (group := next(todo, None)) is not None:
            yield await asyncio.to_thread(push.upload_step, u, uid, group)

    async def run(channel: grpc.aio.Channel) -> None:
        call: grpc.aio.StreamUnaryMultiCallable[bytes, pb.UploadChunksResponse] = (
            channel.stream_unary(
                push.UPLOAD_CHUNKS,
                request_serializer=None,
                response_deserializer=pb.UploadChunksResponse.FromString,
            )
        )
        try:
            await call(requests(), timeout=u.timeout, metadata=u.metadata)
        except grpc.RpcError as e:
            errors.append(e)

    await asyncio.gather(*(run(ch) for ch in channels))
    return errors


async def same_host(
    channel: grpc.aio.Channel, u: push.Update, regions: push.Regions | None = None
) -> pb.UpdateWeightsResponse:
    """push.same_host on grpc.aio: BeginUpdate(same_host), the region filled
    in a worker thread, CommitUpdate; aborted on error."""
    stub = rollout_pb2_grpc.RolloutServiceStub(channel)
    request = pb.BeginUpdateRequest(begin=u.begin, same_host=True)
    opened = await stub.BeginUpdate(request, timeout=u.timeout, metadata=u.metadata)
    try:
        await asyncio.to_thread(push.fill_region, u, opened.shared_staging, regions)
        return await _commit(stub, opened.update_id, u)
    except BaseException as e:
        await _abort(stub, opened.update_id, u, e)
        raise


async def _commit(
    stub: rollout_pb2_grpc.RolloutServiceAsyncStub, uid: str, u: push.Update
) -> pb.UpdateWeightsResponse:
    if not u.state.committing():
        raise Stopped
    request = pb.CommitUpdateRequest(update_id=uid)
    done = await stub.CommitUpdate(request, timeout=u.timeout, metadata=u.metadata)
    result: pb.UpdateWeightsResponse = done.result
    return result


async def _abort(
    stub: rollout_pb2_grpc.RolloutServiceAsyncStub, uid: str, u: push.Update, e: BaseException
) -> None:
    if isinstance(e, asyncio.CancelledError):
        u.state.stop()  # the worker thread stops filling before the abort
    try:
        request = pb.AbortUpdateRequest(update_id=uid)
        await stub.AbortUpdate(request, timeout=10, metadata=u.metadata)
    except grpc.RpcError:
        pass  # gone already, or the server is: nothing to abort


async def send(
    u: push.Update,
    channel: grpc.aio.Channel,
    options: ConnectionOptions,
    new_channel: Callable[[], grpc.aio.Channel],
    streams: int = 1,
    on_host: bool = False,
    regions: push.Regions | None = None,
) -> pb.UpdateWeightsResponse:
    """push.send on grpc.aio, again after UNAVAILABLE as often as `options`
    says (updates.send_update says why a whole update is safe to send again)."""
    delays = iter(options.delays())
    try:
        while True:
            try:
                return await _send_once(u, channel, new_channel, streams, on_host, regions)
            except grpc.RpcError as e:
                await asyncio.sleep(updates.retry_delay(e, delays))
    finally:
        if u.progress is not None:
            u.progress.close()


async def _send_once(
    u: push.Update,
    channel: grpc.aio.Channel,
    new_channel: Callable[[], grpc.aio.Channel],
    streams: int,
    on_host: bool,
    regions: push.Regions | None,
) -> pb.UpdateWeightsResponse:
    if on_host:
        return await same_host(channel, u, regions)
    if streams <= 1:
        return await one_stream(channel, u)
    channels = [new_channel() for _ in range(streams)]
    try:
        return await parallel(channels, u)
    finally:
        for ch in channels:
            await ch.close()
