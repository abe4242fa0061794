"""The generation RPCs (Generate, GenerateStream, GenerateMany, Abort) and
what the engine tells about itself (Tokenize, Detokenize, GetServerInfo):
adapters that hand each request to the pipeline (pipeline/generations.py),
which validates, converts, runs the engine and converts back."""

from __future__ import annotations

from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service import __version__
from rollout_service.fairness.identity import caller_id
from rollout_service.generation import convert
from rollout_service.ops.auth import CALLER
from rollout_service.pipeline.serving import App
from rollout_service.rpc.handlers import streaming, unary
from rollout_service.rpc.readiness import Serving
from rollout_service.status.errors import InvalidArgument


class GenerationRpcs:
    """Generation and the engine's facts, over one Serving."""

    def __init__(self, serving: Serving) -> None:
        self.serving = serving
        self.ending = serving.ending
        self.config: Any = serving.config

    @unary
    async def Generate(self, request, context):
        generations = self.serving.ready.generations
        return await generations.generate(request, caller_id(context))

    @streaming
    def GenerateStream(self, request, context):
        return self.serving.ready.generations.stream(request, caller_id(context))

    @streaming
    def GenerateMany(self, requests, context):
        return self.serving.ready.generations.many(requests, caller_id(context))

    @unary
    async def Abort(self, request, context):
        app = self.serving.ready.app
        if request.all and request.request_ids:
            raise InvalidArgument("request_ids", "must be empty when all is set")
        if not request.all and not request.request_ids:
            raise InvalidArgument("request_ids", "name at least one request, or set all")
        ids = None if request.all else list(request.request_ids)
        found = await self.serving.calls.abort(ids, app.engine.abort, CALLER.get())
        return pb.AbortResponse(request_ids=found)

    @unary
    async def Tokenize(self, request, context):
        app = self.serving.ready.app
        return await app.tokenizing.off_loop(_tokenize, app, request)

    @unary
    async def Detokenize(self, request, context):
        app = self.serving.ready.app
        return await app.tokenizing.off_loop(_detokenize, app, request)

    @unary
    async def GetServerInfo(self, request, context):
        app = self.serving.ready.app
        info, updater, adapters, sleeper = app.info, app.updater, app.adapters, app.sleeper
        return pb.GetServerInfoResponse(
            model=info.model,
            max_model_len=info.limits.max_model_len,
            vocab_size=info.limits.vocab_size,
            weight_version=app.served.version,
            supports_images=info.limits.supports_images,
            parameters=list(info.manifest.values()),
            max_message_bytes=self.config.max_message_bytes,
            recommended_chunk_bytes=self.config.recommended_chunk_bytes,
            max_update_bytes=updater.weights.max_update_bytes,
            max_logprobs=info.limits.max_logprobs,
            server_version=__version__,
            degraded=app.served.degraded,
            engine_requests=app.engine.get_num_unfinished_requests(),
            parameter_groups=[
                pb.ParameterGroup(module=m, names=names) for m, names in info.groups.items()
            ],
            drain_timeout_seconds=updater.quiescer.drain_timeout_seconds,
            logprobs_mode=info.logprobs_mode,
            tokenizer=app.tokenizing.info(),
            lora_adapters=adapters.listing(),
            lora_limits=adapters.limits,
            supports_sleep=sleeper.available,
            sleeping=sleeper.sleeping,
            max_generations_per_stream=self.config.max_generations_per_stream,
            max_stream_tokens=self.config.max_stream_tokens,
            delta_base_version=updater.delta_base,
            delta_base_bytes=updater.weights.base.nbytes if updater.weights.base.enabled else 0,
            accepts_chunk_batches=True,
            session_limits=app.session_store.limits.to_proto(),
            open_sessions=len(app.session_store),
            fair_share=app.fair.to_proto(),
        )


def _tokenize(app: App, request: pb.TokenizeRequest) -> pb.TokenizeResponse:
    """Tokenize's work, on the tokenizing thread; a text or chat longer
    than any prompt the model takes is refused before it is tokenized."""
    if bool(request.text) == bool(request.messages):
        raise InvalidArgument("text/messages", "exactly one must be set")
    limits = app.info.limits
    if request.messages:
        if request.add_special_tokens:
            raise InvalidArgument(
                "add_special_tokens", "applies to text only (the template places them)"
            )
        rendered = convert.render_within(
            app.tokenizing, request.messages, request.chat_options, limits
        )
        if rendered.images:
            raise InvalidArgument(
                "messages", "images expand in the engine's processor; tokenize text only"
            )
        return pb.TokenizeResponse(token_ids=app.tokenizing.chat_ids(rendered), text=rendered.text)
    ids = convert.encode_within(
        app.tokenizing, request.text, "text", limits, request.add_special_tokens
    )
    return pb.TokenizeResponse(token_ids=ids)


def _detokenize(app: App, request: pb.DetokenizeRequest) -> pb.DetokenizeResponse:
    convert.check_vocabulary(request.token_ids, app.info.limits.vocab_size, "token_ids")
    return pb.DetokenizeResponse(
        text=app.tokenizing.decode(request.token_ids, request.skip_special_tokens)
    )
