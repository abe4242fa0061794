"""RolloutService: an adapter between rollout.v1 and the vLLM engine.

Each RPC hands its request to what serves it and returns the answer: the
generation RPCs to the pipeline (pipeline/generations.py), which validates,
converts, runs the engine and converts back; the update machinery is
update/'s.
"""

from __future__ import annotations

from rollout.v1 import rollout_pb2 as pb
from rollout.v1 import rollout_pb2_grpc
from rollout_service import __version__
from rollout_service.engine.protocol import Engine
from rollout_service.fairness.identity import caller_id
from rollout_service.generation import convert
from rollout_service.ops.auth import CALLER
from rollout_service.pipeline.calls import RunningCalls
from rollout_service.pipeline.generations import Generations
from rollout_service.pipeline.many import StreamLimits
from rollout_service.pipeline.serving import App
from rollout_service.pipeline.session_turns import SessionTurns
from rollout_service.rpc.handlers import Ending, streaming, unary
from rollout_service.rpc.session_rpcs import SessionRpcs
from rollout_service.rpc.update_rpcs import UpdateRpcs
from rollout_service.sessions.session_ids import SessionIds
from rollout_service.status.errors import InvalidArgument, Unavailable, engine_dead


class RolloutServicer(UpdateRpcs, SessionRpcs, rollout_pb2_grpc.RolloutServiceServicer):
    """Serves rollout.v1.RolloutService on one AsyncLLM."""

    def __init__(self, config) -> None:
        # Registered before the server starts (handlers cannot be added
        # later); the engine is attached once it is up.
        self.config = config
        self.engine: Engine | None = None
        self.calls = RunningCalls()
        # Every running call (handlers.py), for ending them if the engine dies.
        self.ending = Ending()

    def attach(self, app: App) -> None:
        """Starts serving on a running engine (app.py built what it holds)."""
        self.tok = app.tokenizing
        self.adapters = app.adapters
        self.sleeper = app.sleeper
        self.info = app.info
        self.gate = app.gate
        self.updater = app.updater
        self.sessions = app.sessions
        self.session_store = app.session_store
        self.fair = app.fair
        self.generations = Generations(
            app,
            self.calls,
            StreamLimits.for_server(
                self.config.max_generations_per_stream,
                self.config.max_stream_tokens,
                self.config.max_message_bytes,
                app.info.limits.max_model_len,
            ),
        )
        # This run's session ids, named for the address it listens on
        # (session_ids.py says why that, and not a random name).
        self.session_turns = SessionTurns(self.generations, SessionIds.listening(self.config))
        self.engine = app.engine

    def _check_ready(self) -> Engine:
        """The engine, once attached and alive; UNAVAILABLE before and after."""
        if self.engine is None:
            raise Unavailable(
                "the engine is starting; wait for health SERVING", reason=pb.ERROR_REASON_STARTING
            )
        # ending.why: the server saw the engine die and is ending every call;
        # one arriving now would otherwise wait on the dead engine until the
        # shutdown cancelled it (CANCELLED, which no retry policy retries).
        if self.engine.errored or self.ending.why is not None:
            raise engine_dead()
        return self.engine

    @unary
    async def Generate(self, request, context):
        self._check_ready()
        return await self.generations.generate(request, caller_id(context))

    @streaming
    def GenerateStream(self, request, context):
        self._check_ready()
        return self.generations.stream(request, caller_id(context))

    @streaming
    def GenerateMany(self, requests, context):
        self._check_ready()
        return self.generations.many(requests, caller_id(context))

    @unary
    async def Abort(self, request, context):
        engine = self._check_ready()
        if request.all and request.request_ids:
            raise InvalidArgument("request_ids", "must be empty when all is set")
        if not request.all and not request.request_ids:
            raise InvalidArgument("request_ids", "name at least one request, or set all")
        ids = None if request.all else list(request.request_ids)
        found = await self.calls.abort(ids, engine.abort, CALLER.get())
        return pb.AbortResponse(request_ids=found)

    @unary
    async def Tokenize(self, request, context):
        self._check_ready()
        return await self.tok.off_loop(self._tokenize, request)

    def _tokenize(self, request: pb.TokenizeRequest) -> pb.TokenizeResponse:
        """Tokenize's work, on the tokenizing thread; a text or chat longer
        than any prompt the model takes is refused before it is tokenized."""
        if bool(request.text) == bool(request.messages):
            raise InvalidArgument("text/messages", "exactly one must be set")
        limits = self.info.limits
        if request.messages:
            if request.add_special_tokens:
                raise InvalidArgument(
                    "add_special_tokens", "applies to text only (the template places them)"
                )
            rendered = convert.render_within(
                self.tok, request.messages, request.chat_options, limits
            )
            if rendered.images:
                raise InvalidArgument(
                    "messages", "images expand in the engine's processor; tokenize text only"
                )
            return pb.TokenizeResponse(token_ids=self.tok.chat_ids(rendered), text=rendered.text)
        ids = convert.encode_within(
            self.tok, request.text, "text", limits, request.add_special_tokens
        )
        return pb.TokenizeResponse(token_ids=ids)

    @unary
    async def Detokenize(self, request, context):
        self._check_ready()
        return await self.tok.off_loop(self._detokenize, request)

    def _detokenize(self, request: pb.DetokenizeRequest) -> pb.DetokenizeResponse:
        convert.check_vocabulary(request.token_ids, self.info.limits.vocab_size, "token_ids")
        return pb.DetokenizeResponse(
            text=self.tok.decode(request.token_ids, request.skip_special_tokens)
        )

    @unary
    async def GetServerInfo(self, request, context):
        engine = self._check_ready()
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
            engine_requests=engine.get_num_unfinished_requests(),
            parameter_groups=[
                pb.ParameterGroup(module=m, names=names) for m, names in self.info.groups.items()
            ],
            drain_timeout_seconds=self.updater.drain_timeout_seconds,
            logprobs_mode=self.info.logprobs_mode,
            tokenizer=self.tok.info(),
            lora_adapters=self.adapters.listing(),
            lora_limits=self.adapters.limits,
            supports_sleep=self.sleeper.available,
            sleeping=self.sleeper.sleeping,
            max_generations_per_stream=self.config.max_generations_per_stream,
            max_stream_tokens=self.config.max_stream_tokens,
            delta_base_version=self.updater.delta_base,
            delta_base_bytes=self.updater.base.nbytes if self.updater.base.enabled else 0,
            accepts_chunk_batches=True,
            session_limits=self.session_store.limits.to_proto(),
            open_sessions=len(self.session_store),
            fair_share=self.fair.to_proto(),
        )
