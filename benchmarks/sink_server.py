"""The raw ceiling for UpdateWeights: a grpc.aio server that receives the same
stream over the same kind of channel and discards every byte."""

from __future__ import annotations

import argparse
import asyncio

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from rollout.v1 import rollout_pb2 as pb
from rollout.v1 import rollout_pb2_grpc
from rollout_service.server import ServerConfig


class Sink(rollout_pb2_grpc.RolloutServiceServicer):
    async def UpdateWeights(self, request_iterator, context):
        received = 0
        async for msg in request_iterator:
            received += len(msg.chunk.data)
        return pb.UpdateWeightsResponse(bytes_received=received)


async def main(port: int) -> None:
    limit = ServerConfig().max_message_bytes
    server = grpc.aio.server(
        options=[
            ("grpc.max_send_message_length", limit),
            ("grpc.max_receive_message_length", limit),
        ]
    )
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(Sink(), server)
    h = health.aio.HealthServicer()
    await h.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(h, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    asyncio.run(main(ap.parse_args().port))
