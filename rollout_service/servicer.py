"""RolloutService: an adapter between rollout.v1 and the vLLM engine.

Each RPC validates, converts, calls the engine and converts back; the
conversions live in `convert.py`, the update machinery in `updates.py`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from vllm.sampling_params import RequestOutputKind

from rollout.v1 import rollout_pb2 as pb
from rollout.v1 import rollout_pb2_grpc
from rollout_service import __version__, convert, logs, metrics
from rollout_service.engine import EngineInfo
from rollout_service.errors import InvalidArgument, Unavailable
from rollout_service.gate import AdmissionGate, Ticket
from rollout_service.rpc_handlers import streaming, unary
from rollout_service.update_rpcs import UpdateRpcs
from rollout_service.update_sessions import UpdateSessions
from rollout_service.updates import WeightUpdater


class RolloutServicer(UpdateRpcs, rollout_pb2_grpc.RolloutServiceServicer):
    """Serves rollout.v1.RolloutService on one AsyncLLM."""

    def __init__(self, config) -> None:
        # Registered before the server starts (handlers cannot be added
        # later); the engine is attached once it is up.
        self.config = config
        self.engine = None
        self._tokenizer = None

    def attach(
        self,
        engine,
        info: EngineInfo,
        gate: AdmissionGate,
        updater: WeightUpdater,
        sessions: UpdateSessions,
    ) -> None:
        """Starts serving on a running engine."""
        self.info = info
        self.gate = gate
        self.updater = updater
        self.sessions = sessions
        self.engine = engine

    def _check_ready(self) -> None:
        if self.engine is None:
            raise Unavailable("the engine is starting; wait for health SERVING")
        if self.engine.errored:
            raise Unavailable("the engine has died; the server is shutting down")

    def _tokenizer_or_none(self):
        if self._tokenizer is None:
            self._tokenizer = self.engine.get_tokenizer()
        return self._tokenizer

    def _tokenize(self, text: str) -> list[int]:
        tokenizer = self._tokenizer_or_none()
        if tokenizer is None:
            raise InvalidArgument("prompt_text", "the model has no tokenizer; send token ids")
        return tokenizer.encode(text)

    def _decoder(self, params):
        """Token ids to text, when vLLM was asked not to detokenize."""
        tokenizer = self._tokenizer_or_none()
        if params.detokenize or tokenizer is None:
            return None
        return lambda ids: tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)

    def _prepare(self, request: pb.GenerateRequest, kind: RequestOutputKind):
        request_id = request.request_id or uuid.uuid4().hex
        logs.request_id.set(request_id)
        self._check_ready()
        self.updater.check_serving()
        prompt = convert.prompt_from_request(request, self.info.limits, self._tokenize)
        params = convert.sampling_params_from_proto(
            request.sampling_params, self.info.limits, prompt.num_tokens, kind
        )
        return request_id, prompt, params

    @asynccontextmanager
    async def _admitted(self) -> AsyncIterator[Ticket]:
        """Admission through the gate, then the degraded check again: calls
        that waited at the gate while an update failed inside the engine must
        not run on it."""
        async with self.gate.admit() as ticket:
            self.updater.check_serving()
            yield ticket

    async def _run(self, ticket: Ticket, request_id: str, prompt, params) -> AsyncIterator:
        """Runs the engine request of an admitted call; cancellation of the
        call (client gone, deadline) aborts it inside AsyncLLM.generate."""
        ticket.engine_id = f"{request_id}-{uuid.uuid4().hex[:8]}"
        async for out in self.engine.generate(prompt.prompt, params, ticket.engine_id):
            ticket.started = True
            yield out

    @unary
    async def Generate(self, request, context):
        request_id, prompt, params = self._prepare(request, RequestOutputKind.FINAL_ONLY)
        async with self._admitted() as ticket:
            final = None
            async for out in self._run(ticket, request_id, prompt, params):
                final = out
        top_k = params.logprobs or 0
        decode = self._decoder(params)
        usage = convert.usage_to_proto(final)
        metrics.TOKENS.labels("prompt").inc(usage.prompt_tokens)
        metrics.TOKENS.labels("completion").inc(usage.completion_tokens)
        return pb.GenerateResponse(
            request_id=request_id,
            completions=[
                convert.completion_to_proto(c, top_k, decode)
                for c in sorted(final.outputs, key=lambda c: c.index)
            ],
            weight_version=ticket.version,
            usage=usage,
        )

    @streaming
    async def GenerateStream(self, request, context):
        as_unary = pb.GenerateRequest.FromString(request.SerializeToString())
        request_id, prompt, params = self._prepare(as_unary, RequestOutputKind.DELTA)
        top_k = params.logprobs or 0
        usage = pb.Usage()
        async with self._admitted() as ticket:
            version = ticket.version
            t0 = time.perf_counter()
            async for out in self._run(ticket, request_id, prompt, params):
                if t0:
                    metrics.TTFT.observe(time.perf_counter() - t0)
                    t0 = 0.0
                if out.prompt_token_ids:
                    usage.prompt_tokens = len(out.prompt_token_ids)
                deltas = [
                    convert.stream_delta_to_proto(request_id, c, top_k, version)
                    for c in out.outputs
                    if c.token_ids or c.finish_reason
                ]
                for d in deltas:
                    usage.completion_tokens += len(d.token_ids)
                if out.finished:
                    usage.cached_prompt_tokens = out.num_cached_tokens or 0
                    if not deltas:
                        deltas.append(
                            pb.GenerateStreamResponse(request_id=request_id, weight_version=version)
                        )
                    deltas[-1].usage.CopyFrom(usage)
                    metrics.TOKENS.labels("prompt").inc(usage.prompt_tokens)
                    metrics.TOKENS.labels("completion").inc(usage.completion_tokens)
                for d in deltas:
                    yield d

    @unary
    async def GetServerInfo(self, request, context):
        self._check_ready()
        return pb.GetServerInfoResponse(
            model=self.info.model,
            max_model_len=self.info.limits.max_model_len,
            vocab_size=self.info.limits.vocab_size,
            weight_version=self.gate.version,
            supports_images=self.info.limits.supports_images,
            parameters=list(self.info.manifest.values()),
            max_message_bytes=self.config.max_message_bytes,
            recommended_chunk_bytes=self.config.recommended_chunk_bytes,
            max_update_bytes=self.updater.max_update_bytes,
            max_logprobs=self.info.limits.max_logprobs,
            server_version=__version__,
            degraded=self.updater.degraded,
            engine_requests=self.engine.output_processor.get_num_unfinished_requests(),
            parameter_groups=[
                pb.ParameterGroup(module=m, names=names) for m, names in self.info.groups.items()
            ],
            drain_timeout_seconds=self.updater.drain_timeout_seconds,
        )
