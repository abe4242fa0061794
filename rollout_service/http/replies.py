"""How a route answers a generation: its result, or the generation cancelled
(its engine request aborted) when the client goes away first; a stream as
server-sent events whose first message is awaited before the response
starts. Shared by /v1/chat/completions, /v1/completions and a session's
chat completions (session_routes.py)."""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import Request
from fastapi.responses import StreamingResponse

from rollout_service.http.errors import HttpError, error_body
from rollout_service.http.streaming import sse_error

# The weight version of a response's tokens (its first, for a stream).
VERSION_HEADER = "rollout-weight-version"


async def until_disconnected(request: Request, generation):
    """The generation's result; cancelled (its engine request aborted) if
    the client goes away first, as a gRPC call's cancellation does."""
    task = asyncio.ensure_future(generation)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        raise HttpError(499, "the client closed the request")
    return task.result()


async def streamed(messages, builder, app, route: str):
    """Server-sent events of the pipeline's stream. Its first message is
    awaited here, before the response starts: a request the pipeline refuses
    (the caller's cap, a wrong weight version, bad input) gets its HTTP
    status, not a 200 whose stream says so."""
    try:
        first = await anext(messages)
    except StopAsyncIteration:
        first = None

    async def events():
        version = first.weight_version if first is not None else ""
        try:
            if first is not None:
                yield "".join(await app.tokenizing.off_loop(builder.step, first))
            async for message in messages:
                version = message.weight_version or version
                yield "".join(await app.tokenizing.off_loop(builder.step, message))
            yield "".join(builder.end(version))
        except Exception as e:  # after the headers: an error event, as vLLM sends
            status, body, _ = error_body(e, route)
            yield sse_error(body)
        finally:
            with contextlib.suppress(Exception):
                await messages.aclose()

    headers = {VERSION_HEADER: first.weight_version if first is not None else ""}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)
