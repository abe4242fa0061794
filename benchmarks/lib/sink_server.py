"""The ceiling for weight sync: a grpc.aio server with one client-streaming
method that takes raw bytes (no protobuf, no project code) and counts them.
Its process CPU time is printed on request, for a per-GB figure."""

from __future__ import annotations

import argparse
import asyncio
import os

import grpc

METHOD = "/sink.Sink/Bytes"


async def _bytes(request_iterator, context) -> bytes:
    received = 0
    async for chunk in request_iterator:
        received += len(chunk)
    return str(received).encode()


async def main(port: int, max_message: int) -> None:
    server = grpc.aio.server(
        options=[
            ("grpc.max_send_message_length", max_message),
            ("grpc.max_receive_message_length", max_message),
        ]
    )
    handler = grpc.stream_unary_rpc_method_handler(_bytes)  # no (de)serializers: raw bytes
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("sink.Sink", {"Bytes": handler}),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print(f"sink ready pid {os.getpid()}", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--max-message", type=int, default=64 << 20)
    args = ap.parse_args()
    asyncio.run(main(args.port, args.max_message))
