"""The asyncio client's update over its own grpc.aio channel: the messages
of push.update_weights_steps (the blocking push's, step for step), each
made in a worker thread, since reading a tensor's bytes may block (a file, a
device copy, a conversion) and the event loop must not. Retried like the
blocking push (core.retry_delay).

Cancelled (a timeout, Ctrl-C under asyncio.run), the call is cancelled with
the task and the steps stop before the commit; interrupts.noted tells the
caller whether the commit had been sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from rollout.v1 import rollout_pb2 as pb
from rollout_client import core, push, stubs
from rollout_client.connection import ConnectionOptions


async def _requests(u: push.Update) -> AsyncIterator[bytes]:
    for step in push.update_weights_steps(u):
        yield await asyncio.to_thread(step)


async def one_stream(channel: grpc.aio.Channel, u: push.Update) -> pb.UpdateWeightsResponse:
    """UpdateWeights: begin, every chunk in order, commit, on one call."""
    call: stubs.AsyncStreamUnary[bytes, pb.UpdateWeightsResponse] = channel.stream_unary(
        push.UPDATE_WEIGHTS,
        request_serializer=None,  # the requests are serialized already
        response_deserializer=pb.UpdateWeightsResponse.FromString,
    )
    return await call(_requests(u), timeout=u.timeout, metadata=u.metadata)


async def send(
    u: push.Update, channel: grpc.aio.Channel, options: ConnectionOptions
) -> pb.UpdateWeightsResponse:
    """`u` on one stream, again after UNAVAILABLE as often as `options` says
    (core.send_update says why a whole update is safe to send again)."""
    delays = iter(options.delays())
    try:
        while True:
            try:
                return await one_stream(channel, u)
            except grpc.RpcError as e:
                await asyncio.sleep(core.retry_delay(e, delays))
    finally:
        if u.progress is not None:
            u.progress.close()
