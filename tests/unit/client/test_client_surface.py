"""The Python client's surface, engine-free: what a failed call raises (its
reason read from the status details by grpcio-status), on both clients,
against a stand-in server in this process that refuses as the real one does
(rollout_service.status.errors builds the trailer); generate's typed options,
one per proto field, and the TypeError of a misspelled one."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from concurrent import futures

import grpc
import numpy as np
import pytest

from harness.serverproc import free_port
from rollout.v1 import rollout_pb2_grpc
from rollout_client import AsyncRolloutClient, RolloutClient, RolloutError, pb
from rollout_client.calls.generate_request import GenerateOptions, Sampling, StreamOptions
from rollout_service.status.trailers import details_trailer

REFUSAL = "weight version 'step-2' required, 'step-1' served"


class Refusing(rollout_pb2_grpc.RolloutServiceServicer):
    """Generate refuses as the server does for a wrong weight version (and
    keeps the request); Tokenize with a bare status, as gRPC or a proxy
    makes one."""

    def __init__(self) -> None:
        self.requests: list[pb.GenerateRequest] = []

    def Generate(self, request, context):
        self.requests.append(request)
        code = grpc.StatusCode.FAILED_PRECONDITION
        reason = pb.ERROR_REASON_WRONG_WEIGHT_VERSION
        context.set_trailing_metadata(details_trailer(code, REFUSAL, reason))
        context.abort(code, REFUSAL)

    def Tokenize(self, request, context):
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "no room")


@contextlib.contextmanager
def refusing(servicer: Refusing | None = None):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(servicer or Refusing(), server)
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


# Every option, as a user would write it (floats exact in float32).
OPTIONS = dict(
    prompt_token_ids=[5, 6, 7],
    request_id="r-1",
    lora_adapter="math",
    required_weight_version="step-2",
    max_tokens=8,
    temperature=0.5,
    top_p=0.75,
    top_k=5,
    min_p=0.125,
    seed=3,
    n=2,
    logprobs=1,
    stop=["\n"],
    stop_token_ids=[2],
    ignore_eos=True,
    repetition_penalty=1.25,
    presence_penalty=0.5,
    frequency_penalty=0.5,
    min_tokens=1,
    prompt_logprobs=0,
    structured_output=pb.StructuredOutput(regex="[0-9]+"),
    allowed_token_ids=[5, 6],
)


def test_every_field_of_the_request_is_a_typed_option():
    sampling = {f.name for f in pb.SamplingParams.DESCRIPTOR.fields}
    assert set(Sampling.__annotations__) == sampling
    assert sampling <= set(OPTIONS)
    own = set(GenerateOptions.__annotations__) - sampling
    request = {f.name for f in pb.GenerateRequest.DESCRIPTOR.fields}
    # sampling_params and chat_options are spread into their own options
    assert own == request - {"sampling_params", "chat_options"} | {"continue_final_message"}
    stream = set(StreamOptions.__annotations__) - own - sampling
    assert stream == {f.name for f in pb.StreamOptions.DESCRIPTOR.fields}


def test_both_clients_send_every_option_as_one_request():
    stand_in = Refusing()
    with refusing(stand_in) as target:
        refused_sync(target, "generate", **OPTIONS)
        refused_async(target, "generate", **OPTIONS)
    sync, asyncio_ = stand_in.requests
    assert sync == asyncio_
    sent = sync.sampling_params
    for name, value in OPTIONS.items():
        got = getattr(sent if name in Sampling.__annotations__ else sync, name)
        assert got == value or list(got) == value, name
    assert sent.HasField("prompt_logprobs")  # 0 is set, not unset


async def settled(result):
    """generate's coroutine awaited (generate_stream's iterator is not)."""
    return await result if inspect.isawaitable(result) else result


@pytest.mark.parametrize("method", ["generate", "generate_stream"])
def test_a_misspelled_option_raises_type_error_at_the_call(method):
    target = f"127.0.0.1:{free_port()}"  # nothing listens: no call may be made
    with RolloutClient(target) as c, pytest.raises(TypeError) as sync:
        getattr(c, method)(prompt_text="x", max_token=8)

    async def on_asyncio():
        async with AsyncRolloutClient(target) as c:
            with pytest.raises(TypeError) as e:
                await settled(getattr(c, method)(prompt_text="x", max_token=8, tempreture=0))
            return e.value

    text = "got an unexpected keyword argument 'max_token' (did you mean 'max_tokens'?)"
    assert str(sync.value) == text
    assert str(asyncio.run(on_asyncio())) == (
        "got unexpected keyword arguments 'max_token' (did you mean 'max_tokens'?), "
        "'tempreture' (did you mean 'temperature'?)"
    )


class Receiving(rollout_pb2_grpc.RolloutServiceServicer):
    """GetServerInfo with a manifest of one float32 tensor; UpdateWeights
    that keeps every message."""

    def __init__(self) -> None:
        self.streams: list[list[pb.UpdateWeightsRequest]] = []

    def GetServerInfo(self, request, context):
        spec = pb.TensorSpec(name="w", dtype=pb.D_TYPE_FLOAT32, shape=[64])
        return pb.GetServerInfoResponse(weight_version="initial", parameters=[spec])

    def UpdateWeights(self, request_iterator, context):
        self.streams.append(list(request_iterator))
        version = self.streams[-1][0].begin.weight_version
        return pb.UpdateWeightsResponse(weight_version=version)


def test_the_async_push_sends_the_sync_push_on_its_own_channel(monkeypatch):
    stand_in = Receiving()
    weights = {"w": np.arange(64, dtype=np.float32)}
    with refusing(stand_in) as target:
        with RolloutClient(target, timeout=30) as c:
            sync_ack = c.update_weights(weights, "v1", chunk_bytes=64)

        async def on_asyncio():
            async with AsyncRolloutClient(target, timeout=30) as c:
                return await c.update_weights(weights, "v1", chunk_bytes=64)

        # The asyncio push opens no blocking channel (it used to push through
        # a blocking client in a thread): grpc.aio's channel is all it has.
        def no_blocking_channel(*args, **kwargs):
            raise AssertionError("the asyncio push opened a blocking channel")

        monkeypatch.setattr(grpc, "insecure_channel", no_blocking_channel)
        async_ack = asyncio.run(on_asyncio())
    assert sync_ack.weight_version == async_ack.weight_version == "v1"
    sync, asyncio_ = stand_in.streams
    assert asyncio_ == sync  # one builder: the same messages
    kinds = [m.WhichOneof("kind") for m in sync]
    assert kinds == ["begin", "chunk", "chunk", "chunk", "chunk", "commit"], kinds
    assert b"".join(m.chunk.data for m in sync[1:-1]) == weights["w"].tobytes()


class Staging(Receiving):
    """The staged calls: BeginUpdate (same_host: a staging file under `root`),
    UploadChunks into a buffer (counting the streams), GetUpdateStatus with
    nothing missing, CommitUpdate keeping the bytes received."""

    def __init__(self, root) -> None:
        super().__init__()
        self.root = root
        self.updates: dict[str, tuple[list[int], bytearray | None]] = {}
        self.upload_streams = 0
        self.committed: list[bytes] = []

    def BeginUpdate(self, request, context):
        sizes = [4 * int(np.prod(t.shape)) for t in request.begin.tensors]
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        uid = f"u{len(self.updates)}"
        if not request.same_host:
            self.updates[uid] = (offsets, bytearray(sum(sizes)))
            return pb.BeginUpdateResponse(update_id=uid, total_bytes=sum(sizes))
        path = self.root / uid
        path.write_bytes(bytes(sum(sizes)))
        self.updates[uid] = (offsets, None)
        staging = pb.SharedStaging(path=str(path), tensor_offsets=offsets)
        return pb.BeginUpdateResponse(update_id=uid, total_bytes=sum(sizes), shared_staging=staging)

    def UploadChunks(self, request_iterator, context):
        self.upload_streams += 1
        for m in request_iterator:
            offsets, buf = self.updates[m.update_id]
            for c in m.chunks.chunks if m.HasField("chunks") else [m.chunk]:
                at = offsets[c.tensor_index] + c.offset
                buf[at : at + len(c.data)] = c.data
        return pb.UploadChunksResponse()

    def GetUpdateStatus(self, request, context):
        return pb.GetUpdateStatusResponse()

    def CommitUpdate(self, request, context):
        _, buf = self.updates[request.update_id]
        data = bytes(buf) if buf is not None else (self.root / request.update_id).read_bytes()
        self.committed.append(data)
        return pb.CommitUpdateResponse(result=pb.UpdateWeightsResponse(weight_version="v1"))


@pytest.mark.parametrize("way", [{"streams": 3}, {"same_host": True}], ids=["streams", "same_host"])
def test_staged_pushes_of_both_clients_deliver_the_same_bytes(way, tmp_path, monkeypatch):
    stand_in = Staging(tmp_path)
    weights = {"w": np.arange(64, dtype=np.float32)}
    with refusing(stand_in) as target:
        with RolloutClient(target, timeout=30) as c:
            c.update_weights(weights, "v1", chunk_bytes=32, **way)

        async def on_asyncio():
            async with AsyncRolloutClient(target, timeout=30) as c:
                return await c.update_weights(weights, "v1", chunk_bytes=32, **way)

        monkeypatch.setattr(grpc, "insecure_channel", None)  # no blocking channel
        ack = asyncio.run(on_asyncio())
    assert ack.weight_version == "v1"
    assert stand_in.committed == [weights["w"].tobytes()] * 2
    assert stand_in.upload_streams == (6 if "streams" in way else 0)


def test_a_misspelled_update_option_raises_type_error_at_the_call():
    target = f"127.0.0.1:{free_port()}"  # nothing listens: no call may be made
    weights = {"w": np.zeros(4, np.float32)}
    with RolloutClient(target) as c, pytest.raises(TypeError) as sync:
        c.update_weights(weights, "v1", stream=2)

    async def on_asyncio():
        async with AsyncRolloutClient(target) as c:
            with pytest.raises(TypeError) as e:
                await c.update_weights(weights, "v1", same_hots=True)
            return e.value

    assert (
        str(sync.value) == "got an unexpected keyword argument 'stream' (did you mean 'streams'?)"
    )
    assert str(asyncio.run(on_asyncio())) == (
        "got an unexpected keyword argument 'same_hots' (did you mean 'same_host'?)"
    )


class Serving(Receiving):
    """Receiving that serves each update it receives and reports it as its
    delta base, as the server does after a full update or a delta."""

    served = ""

    def GetServerInfo(self, request, context):
        info = super().GetServerInfo(request, context)
        info.delta_base_version = self.served
        return info

    def UpdateWeights(self, request_iterator, context):
        ack = super().UpdateWeights(request_iterator, context)
        self.served = ack.weight_version
        return ack


def test_delta_pushes_of_both_clients_send_the_same_delta(monkeypatch):
    first = np.arange(64, dtype=np.float32)
    second = first.copy()
    second[5] = -1.0  # one changed element: the second push is a delta
    streams = {}
    for way in ("sync", "async"):
        stand_in = Serving()
        with refusing(stand_in) as target:
            if way == "sync":
                with RolloutClient(target, timeout=30) as c:
                    for v, w in (("v1", first), ("v2", second)):
                        c.update_weights({"w": w}, v, delta="always")
                    history = c.pushed.costs.history
            else:

                async def on_asyncio():
                    async with AsyncRolloutClient(target, timeout=30) as c:
                        for v, w in (("v1", first), ("v2", second)):
                            await c.update_weights({"w": w}, v, delta="always")
                        return c.pushed.costs.history

                monkeypatch.setattr(grpc, "insecure_channel", None)  # no blocking channel
                history = asyncio.run(on_asyncio())
        assert [(r.version, r.way) for r in history] == [("v1", "full"), ("v2", "delta")], way
        streams[way] = stand_in.streams
    assert streams["async"] == streams["sync"]
    delta = streams["sync"][1]
    assert delta[0].begin.base_version == "v1"
    assert delta[0].begin.tensors[0].encoding != pb.TENSOR_ENCODING_RAW


class Holding(Serving):
    """Serving whose UpdateWeights, once the commit is in, holds its answer
    until the client goes away."""

    def __init__(self) -> None:
        super().__init__()
        self.committed = threading.Event()
        self.gone = threading.Event()

    def UpdateWeights(self, request_iterator, context):
        context.add_callback(self.gone.set)
        for m in request_iterator:
            if m.HasField("commit"):
                self.committed.set()
                self.gone.wait(30)
        return pb.UpdateWeightsResponse()


def test_a_cancelled_async_delta_push_stops_its_call_and_says_what_happened():
    stand_in = Holding()

    async def main(target):
        async with AsyncRolloutClient(target, timeout=30) as c:
            weights = {"w": np.arange(64, dtype=np.float32)}
            push = asyncio.create_task(c.update_weights(weights, "v1", delta=True))
            await asyncio.to_thread(stand_in.committed.wait, 30)
            push.cancel()
            with pytest.raises(asyncio.CancelledError) as e:
                await push
            # the call ends with the push, not when the client closes
            gone = await asyncio.to_thread(stand_in.gone.wait, 10)
            return e.value, gone

    with refusing(stand_in) as target:
        cancelled, gone = asyncio.run(main(target))
    assert type(cancelled) is asyncio.CancelledError
    notes = getattr(cancelled, "__notes__", [])
    assert any("may have been applied" in n for n in notes), notes
    assert gone
