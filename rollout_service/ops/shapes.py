"""gRPC method handlers built by shape: the servicer's registration
(rpc/handlers.py) and the interceptors that wrap or replace handlers (auth,
metrics, tracing) make them alike."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

_State = TypeVar("_State")

_FACTORIES = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def make_handler(
    request_streaming: bool, response_streaming: bool, behavior, deserializer, serializer
) -> grpc.RpcMethodHandler:
    """A method handler of the given shape around `behavior`."""
    return _FACTORIES[(request_streaming, response_streaming)](
        behavior, request_deserializer=deserializer, response_serializer=serializer
    )


def like(handler: grpc.RpcMethodHandler, behavior) -> grpc.RpcMethodHandler:
    """A handler of the same shape and (de)serializers as `handler`."""
    return make_handler(
        handler.request_streaming,
        handler.response_streaming,
        behavior,
        handler.request_deserializer,
        handler.response_serializer,
    )


def around(
    handler: grpc.RpcMethodHandler,
    start: Callable[[], _State],
    end: Callable[[_State, grpc.aio.ServicerContext, bool], None],
) -> grpc.RpcMethodHandler:
    """`handler` with every call run between `state = start()` and
    `end(state, context, cancelled)` (the interceptors' shared shape; a
    streaming call ends when its last item is sent, or it is cancelled)."""
    if handler.response_streaming:
        # grpc.aio's behaviours are async; types-grpcio types the sync server's.
        inner: Any = handler.unary_stream or handler.stream_stream

        async def stream_wrapper(request, context):
            state = start()
            cancelled = False
            try:
                async for item in inner(request, context):
                    yield item
            except asyncio.CancelledError:
                cancelled = True
                raise
            finally:
                end(state, context, cancelled)

        return like(handler, stream_wrapper)
    inner = handler.unary_unary or handler.stream_unary

    async def unary_wrapper(request, context):
        state = start()
        cancelled = False
        try:
            return await inner(request, context)
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            end(state, context, cancelled)

    return like(handler, unary_wrapper)
