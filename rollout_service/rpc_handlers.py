"""Building gRPC method handlers by shape, shared by the servicer's
registration and the interceptors that replace handlers."""

from __future__ import annotations

import grpc

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
