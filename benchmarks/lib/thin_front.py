"""The thinnest gRPC front end on the same engine: a ceiling for this
service's own layer that is not our code.

A grpc.aio server with two raw-bytes methods (no protobuf, no admission gate,
no metrics, no interceptor, nothing of rollout_service on the request path)
in front of AsyncLLM, built, placed and warmed up exactly as benchmarks.inprocess
builds it, asked for the same SamplingParams the servicer would build, and
its start-up heap frozen for the garbage collector as the service does.
Whatever separates it from the in-process loop is what any Python gRPC front
end costs on this machine (gRPC's per-call and per-message work, and a load
client in another process); whatever separates this service from it is the
service's own layer.

    .venv/bin/python -m benchmarks.lib.thin_front --port N -- --model tiny-qwen2 ...

Arguments after -- go to `rollout-service serve`'s parser. It prints
`thin front ready on 127.0.0.1:PORT` when it answers.

A third method, GenerateMany, is the raw-bytes twin of this service's: one
bidi stream carries many requests, and every delta ready when the server
sends goes out in one message (a message per send instead of a message per
completion per engine step). Its batching is written out here, not taken
from rollout_service.rpc.many, so that the ceiling stays free of our code.

The wire (little-endian): a request is int32 max_tokens, delta_tokens,
omit_text, float32 temperature, then the prompt's token ids. A reply (the unary one, or each
stream message: one per vLLM output) is int32 n, n token ids, n float32
logprobs of the sampled tokens, then the new text in UTF-8 (none with
omit_text). GenerateMany: a request is int32 tag, then a request as above;
a message is one or more records: int32 tag, n, finished, n token ids, n
float32 logprobs, int32 text bytes, the text.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import struct
import sys
import time
import uuid

import grpc
import numpy as np

from benchmarks.lib.loadgen import OneStreamDriver, Record

SERVICE = "thin.Thin"
UNARY, STREAM, MANY = "Generate", "GenerateStream", "GenerateMany"
_HEADER = struct.Struct("<3if")
_TAG = struct.Struct("<i")
_RECORD = struct.Struct("<3i")  # tag, n, finished


def encode_request(
    prompt: list[int], max_tokens: int, delta_tokens=0, omit_text=False, temperature=0.0
) -> bytes:
    header = _HEADER.pack(max_tokens, delta_tokens, int(omit_text), temperature)
    return header + np.asarray(prompt, "<i4").tobytes()


def decode_request(data: bytes) -> tuple[list[int], int, int, bool, float]:
    """(prompt, max_tokens, delta_tokens, omit_text, temperature)"""
    max_tokens, delta_tokens, omit_text, temperature = _HEADER.unpack_from(data)
    prompt = np.frombuffer(data, "<i4", offset=_HEADER.size).tolist()
    return prompt, max_tokens, delta_tokens, bool(omit_text), temperature


def encode_reply(token_ids, logprobs: list[float], text: str) -> bytes:
    n = len(token_ids)
    return b"".join(
        (
            struct.pack("<i", n),
            np.asarray(token_ids, "<i4").tobytes(),
            np.asarray(logprobs, "<f4").tobytes(),
            text.encode(),
        )
    )


def reply_tokens(data: bytes) -> int:
    """How many tokens a reply carries."""
    return struct.unpack_from("<i", data)[0]


def decode_reply(data: bytes) -> tuple[list[int], list[float], str]:
    n = reply_tokens(data)
    ids = np.frombuffer(data, "<i4", count=n, offset=4).tolist()
    logprobs = np.frombuffer(data, "<f4", count=n, offset=4 + 4 * n).tolist()
    return ids, logprobs, data[4 + 8 * n :].decode()


def encode_record(tag: int, token_ids, logprobs: list[float], text: str, finished: bool) -> bytes:
    """One completion's delta in a GenerateMany message."""
    text_bytes = text.encode()
    return b"".join(
        (
            _RECORD.pack(tag, len(token_ids), int(finished)),
            np.asarray(token_ids, "<i4").tobytes(),
            np.asarray(logprobs, "<f4").tobytes(),
            _TAG.pack(len(text_bytes)),
            text_bytes,
        )
    )


def _walk(data: bytes):
    """(tag, n, finished, offset of its token ids, text bytes) per record of a
    GenerateMany message."""
    offset = 0
    while offset < len(data):
        tag, n, finished = _RECORD.unpack_from(data, offset)
        body = offset + _RECORD.size
        size = _TAG.unpack_from(data, body + 8 * n)[0]
        yield tag, n, bool(finished), body, size
        offset = body + 8 * n + _TAG.size + size


def record_counts(data: bytes):
    """(tag, tokens, finished) of every record in a GenerateMany message."""
    for tag, n, finished, _, _ in _walk(data):
        yield tag, n, finished


def decode_records(data: bytes) -> list[tuple[int, list[int], list[float], str, bool]]:
    """Every record of a GenerateMany message, whole."""
    out = []
    for tag, n, finished, body, size in _walk(data):
        ids = np.frombuffer(data, "<i4", count=n, offset=body).tolist()
        lps = np.frombuffer(data, "<f4", count=n, offset=body + 4 * n).tolist()
        text_at = body + 8 * n + _TAG.size
        out.append((tag, ids, lps, data[text_at : text_at + size].decode(), finished))
    return out


def _id() -> str:
    return uuid.uuid4().hex


def _sampled_logprobs(completion, start: int = 0) -> list[float]:
    """The sampled tokens' logprobs (vLLM's per-position dicts, from `start`)."""
    lps = completion.logprobs or ()
    ids = completion.token_ids
    return [lps[i][ids[i]].logprob for i in range(start, len(lps))]


class ThinFront:
    """The two handlers, on one AsyncLLM."""

    def __init__(self, engine, limits):
        from vllm.sampling_params import RequestOutputKind

        from benchmarks.inprocess import service_params
        from rollout.v1 import rollout_pb2 as pb

        self.engine, self.limits = engine, limits
        self.tokenizer = engine.get_tokenizer()
        self._kinds = (RequestOutputKind.FINAL_ONLY, RequestOutputKind.DELTA)
        self._service_params, self._options = service_params, pb.StreamOptions

    def _params(self, data: bytes, stream: bool):
        prompt, max_tokens, delta_tokens, omit_text, temperature = decode_request(data)
        options = self._options(delta_tokens=delta_tokens, omit_text=omit_text) if stream else None
        params = self._service_params(
            self.limits, len(prompt), max_tokens, temperature, self._kinds[stream], options
        )
        return prompt, params, omit_text

    async def generate(self, data: bytes, context) -> bytes:
        prompt, params, _ = self._params(data, False)
        final = None
        async for out in self.engine.generate({"prompt_token_ids": prompt}, params, _id()):
            final = out
        c = final.outputs[0]
        # As the servicer: vLLM was asked not to detokenize; the text once, at the end.
        text = c.text or self.tokenizer.decode(c.token_ids, skip_special_tokens=True)
        return encode_reply(c.token_ids, _sampled_logprobs(c), text)

    async def generate_stream(self, data: bytes, context):
        prompt, params, omit_text = self._params(data, True)
        async for out in self.engine.generate({"prompt_token_ids": prompt}, params, _id()):
            c = out.outputs[0]
            if c.token_ids:
                yield encode_reply(c.token_ids, _sampled_logprobs(c), "" if omit_text else c.text)

    async def generate_many(self, requests, context):
        """Each request runs in a task of its own; whatever deltas are ready
        when the previous message has gone out leave in the next one."""
        ready: asyncio.Queue = asyncio.Queue()
        tasks: set[asyncio.Task] = set()

        async def run(tag: int, data: bytes) -> None:
            prompt, params, omit_text = self._params(data, True)
            async for out in self.engine.generate({"prompt_token_ids": prompt}, params, _id()):
                c = out.outputs[0]
                if c.token_ids or out.finished:
                    text = "" if omit_text else c.text
                    lps = _sampled_logprobs(c)
                    ready.put_nowait(encode_record(tag, c.token_ids, lps, text, out.finished))

        async def read() -> None:
            async for data in requests:
                task = asyncio.create_task(run(_TAG.unpack_from(data)[0], data[_TAG.size :]))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.gather(*tasks)
            ready.put_nowait(None)  # the client is done and every request ended

        reader = asyncio.create_task(read())
        try:
            while (record := await ready.get()) is not None:
                batch = [record]
                while not ready.empty() and (record := ready.get_nowait()) is not None:
                    batch.append(record)
                yield b"".join(batch)
                if record is None:
                    return
        finally:
            reader.cancel()
            for task in list(tasks):
                task.cancel()

    def handlers(self):
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                UNARY: grpc.unary_unary_rpc_method_handler(self.generate),
                STREAM: grpc.unary_stream_rpc_method_handler(self.generate_stream),
                MANY: grpc.stream_stream_rpc_method_handler(self.generate_many),
            },
        )


class ThinDriver:
    """benchmarks.lib.loadgen's driver for the thin front: raw bytes, one channel,
    the same connection the service's GrpcDriver opens."""

    def __init__(self, target: str, stream: bool, temperature: float = 0.0, options=None):
        self.stream, self.temperature = stream, temperature
        self.delta_tokens = options.delta_tokens if options is not None else 0
        self.omit_text = bool(options is not None and options.omit_text)
        self.channel = grpc.aio.insecure_channel(
            target, options=[("grpc.use_local_subchannel_pool", 1)]
        )
        method = STREAM if stream else UNARY
        make = self.channel.unary_stream if stream else self.channel.unary_unary
        self.call = make(f"/{SERVICE}/{method}")

    async def __call__(self, prompt: list[int], max_tokens: int) -> Record:
        request = encode_request(
            prompt, max_tokens, self.delta_tokens, self.omit_text, self.temperature
        )
        rec = Record(start=time.perf_counter())
        try:
            if self.stream:
                async for msg in self.call(request, timeout=600):
                    rec.tokens_arrived(reply_tokens(msg))
            else:
                rec.tokens = reply_tokens(await self.call(request, timeout=600))
        except grpc.aio.AioRpcError as e:
            rec.error = e.code().name
        rec.end = time.perf_counter()
        return rec

    async def close(self) -> None:
        await self.channel.close()


class ManyDriver(OneStreamDriver):
    """benchmarks.lib.loadgen's driver for GenerateMany: every concurrent call
    of the load shares one bidi stream, tagged."""

    def __init__(self, target: str, temperature: float = 0.0, options=None):
        super().__init__(
            grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        )
        self.temperature = temperature
        self.delta_tokens = options.delta_tokens if options is not None else 0
        self.omit_text = bool(options is not None and options.omit_text)

    def open(self):
        return self.channel.stream_stream(f"/{SERVICE}/{MANY}")(timeout=3600)

    def request(self, tag: int, prompt: list[int], max_tokens: int) -> bytes:
        request = encode_request(
            prompt, max_tokens, self.delta_tokens, self.omit_text, self.temperature
        )
        return _TAG.pack(tag) + request

    def events(self, data: bytes):
        for tag, n, finished in record_counts(data):
            yield tag, n, finished, None


async def serve(port: int, serve_args: list[str]) -> None:
    from benchmarks.inprocess import start_engine
    from rollout_service.engine.startup import settle, warm_up

    engine, limits = start_engine(serve_args)
    server = None
    try:
        await warm_up(engine)
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((ThinFront(engine, limits).handlers(),))
        port = server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        # As the service does (rollout_service.engine.startup.settle): the start-up
        # heap frozen for the collector, vLLM's settings read once.
        settle()
        print(f"thin front ready on 127.0.0.1:{port}", flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await server.stop(0)
    finally:
        engine.shutdown()
        # As benchmarks.inprocess: collected now, not at interpreter exit.
        del engine, server
        gc.collect()


def main() -> int:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # as `rollout-service serve`
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(prog="python -m benchmarks.lib.thin_front", description=__doc__)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv[:split])
    asyncio.run(serve(args.port, argv[split + 1 :]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
