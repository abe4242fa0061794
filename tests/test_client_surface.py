"""The Python client's surface, engine-free: what a failed call raises (its
reason read from the status details by grpcio-status), on both clients,
against a stand-in server in this process that refuses as the real one does
(rollout_service.status.errors builds the trailer)."""

from __future__ import annotations

import asyncio
import contextlib
from concurrent import futures

import grpc
import pytest

from rollout.v1 import rollout_pb2_grpc
from rollout_client import AsyncRolloutClient, RolloutClient, RolloutError, pb
from rollout_service.status import errors

REFUSAL = "weight version 'step-2' required, 'step-1' served"


class Refusing(rollout_pb2_grpc.RolloutServiceServicer):
    """Generate refuses as the server does for a wrong weight version;
    Tokenize with a bare status, as gRPC or a proxy makes one."""

    def Generate(self, request, context):
        code = grpc.StatusCode.FAILED_PRECONDITION
        reason = pb.ERROR_REASON_WRONG_WEIGHT_VERSION
        context.set_trailing_metadata(errors.details_trailer(code, REFUSAL, reason))
        context.abort(code, REFUSAL)

    def Tokenize(self, request, context):
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "no room")


@contextlib.contextmanager
def refusing():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(Refusing(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def refused_sync(target: str, method: str, **kwargs: str) -> RolloutError:
    with RolloutClient(target, timeout=30) as c, pytest.raises(RolloutError) as e:
        getattr(c, method)(**kwargs)
    return e.value


def refused_async(target: str, method: str, **kwargs: str) -> RolloutError:
    async def main() -> RolloutError:
        async with AsyncRolloutClient(target, timeout=30) as c:
            with pytest.raises(RolloutError) as e:
                await getattr(c, method)(**kwargs)
            return e.value

    return asyncio.run(main())


@pytest.mark.parametrize("refused", [refused_sync, refused_async], ids=["sync", "async"])
def test_a_refusal_carries_its_code_reason_and_message(refused):
    with refusing() as target:
        e = refused(target, "generate", prompt_text="x")
        bare = refused(target, "tokenize", text="x")
    assert (e.code, e.reason, e.details) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "WRONG_WEIGHT_VERSION",
        REFUSAL,
    )
    assert str(e) == f"FAILED_PRECONDITION: {REFUSAL}"
    # a status gRPC or a proxy made: no details, no reason
    assert (bare.code, bare.reason, bare.details) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "",
        "no room",
    )
