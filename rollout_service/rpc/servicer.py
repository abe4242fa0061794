"""RolloutService: an adapter between rollout.v1 and the vLLM engine.

Each RPC validates, converts, calls the engine and converts back; the
conversions live in `convert.py`, the update machinery in `updates.py`.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, cast

from vllm.sampling_params import RequestOutputKind

from rollout.v1 import rollout_pb2 as pb
from rollout.v1 import rollout_pb2_grpc
from rollout_service import __version__, vllm_compat
from rollout_service.errors import FailedPrecondition, InvalidArgument, Unavailable, engine_dead
from rollout_service.fairness.identity import CallerId, caller_id
from rollout_service.fairness.share import Slot
from rollout_service.gate import Ticket
from rollout_service.generation import convert
from rollout_service.ops import logs, metrics, tracing
from rollout_service.ops.auth import CALLER
from rollout_service.rpc import many
from rollout_service.rpc.calls import Call, RunningCalls
from rollout_service.rpc.handlers import Ending, streaming, unary
from rollout_service.rpc.serving import App
from rollout_service.rpc.session_rpcs import SessionRpcs
from rollout_service.rpc.update_rpcs import UpdateRpcs

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM


class RolloutServicer(UpdateRpcs, SessionRpcs, rollout_pb2_grpc.RolloutServiceServicer):
    """Serves rollout.v1.RolloutService on one AsyncLLM."""

    def __init__(self, config) -> None:
        # Registered before the server starts (handlers cannot be added
        # later); the engine is attached once it is up.
        self.config = config
        self.engine: AsyncLLM | None = None
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
        self.engine = cast("AsyncLLM", app.engine)

    def _check_ready(self) -> AsyncLLM:
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

    def _decoder(self, params):
        """Token ids to text, when vLLM was asked not to detokenize."""
        if params.detokenize or self.tok.tokenizer is None:
            return None
        return lambda ids: self.tok.decode(ids, skip_special_tokens=params.skip_special_tokens)

    async def _prepare(self, request: pb.GenerateRequest, kind: RequestOutputKind, stream=None):
        request_id = request.request_id or uuid.uuid4().hex
        logs.request_id.set(request_id)
        self._check_ready()
        self.updater.check_serving()
        if request.lora_adapter:
            self.adapters.check_known(request.lora_adapter)
        # Tokenizing, rendering and parsing grow with the request: off the loop.
        prompt, params = await self.tok.off_loop(self._convert, request, kind, stream)
        return request_id, prompt, params

    def _convert(self, request: pb.GenerateRequest, kind: RequestOutputKind, stream):
        prompt = convert.prompt_from_request(request, self.info.limits, self.tok)
        params = convert.sampling_params_from_proto(
            request.sampling_params, self.info.limits, prompt.num_tokens, kind, stream
        )
        return prompt, params

    @asynccontextmanager
    async def _admitted(
        self, slot: Slot, call: Call, required_version: str = ""
    ) -> AsyncIterator[Ticket]:
        """An engine seat of the caller's (fairness/; an Abort ends the wait
        for one), admission through the gate, then the degraded and version
        checks again: calls that waited at the gate while an update failed
        inside the engine (or installed another version) must not run on it."""
        async with slot.seat(call.abort_event), self.gate.admit() as ticket:
            self.updater.check_serving()
            if required_version and ticket.version != required_version:
                raise FailedPrecondition(
                    f"required_weight_version: this server serves "
                    f"{ticket.version!r:.200}, not {required_version!r:.200}",
                    reason=pb.ERROR_REASON_WRONG_WEIGHT_VERSION,
                )
            yield ticket

    async def _run(
        self, ticket: Ticket, call: Call, prompt, params, adapter: str, slot: Slot
    ) -> AsyncIterator:
        """Runs the engine request of an admitted call at its slot's priority
        (fairness/); cancellation of the call (client gone, deadline) aborts
        it inside AsyncLLM.generate. Nothing runs for a call aborted before
        it got here."""
        if call.aborted:
            return
        # Resolved after admission: an adapter update that the call waited
        # for at the gate has replaced (or removed) it by now.
        engine = self.engine
        assert engine is not None  # _prepare checked it (_check_ready)
        lora = self.adapters.request_for(adapter) if adapter else None
        ticket.adapter_version = self.adapters.version_of(adapter) if adapter else ""
        ticket.engine_id = call.engine_id = f"{call.request_id}-{uuid.uuid4().hex[:8]}"
        async for out in engine.generate(
            prompt.prompt,
            params,
            ticket.engine_id,
            lora_request=lora,
            # vLLM's llm_request span becomes a child of this RPC's span.
            trace_headers=tracing.headers(),
            priority=slot.priority,
        ):
            ticket.started = True
            if call.aborted and not out.finished:
                # Abort came before the engine knew the request: end it now.
                await engine.abort(ticket.engine_id)
            yield out

    def _live_spans(
        self, engine_id: str | None, index: int, start: int, count: int, fallback: str
    ) -> list[tuple[str, int, int]]:
        """Version spans of a running completion's tokens [start, start +
        count), from vLLM's own labels (the engine core tags each step's
        outputs with the weight version it ran on; only finished outputs
        carry the spans, so a stream reads them from the request's state)."""
        # engine_id is None only before the request reaches the engine (_run).
        spans = (
            vllm_compat.weight_version_spans(self.engine, engine_id, index) if engine_id else None
        )
        return convert.version_spans(spans, start, count, fallback)

    def _delta_spans(self, ticket: Ticket, c, start: int, count: int) -> list[tuple[str, int, int]]:
        """Version spans of a delta's tokens [start, start + count) of
        completion `c`: vLLM's own once it has finished; the admission
        version while no PAUSE_MODE_KEEP update applied since; else read live."""
        version = ticket.version
        if c.finished():
            return convert.version_spans(c.weight_versions, start, count, version)
        if ticket.keep_epoch == self.gate.keep_epoch:
            return convert.version_spans(None, start, count, version)
        return self._live_spans(ticket.engine_id, c.index, start, count, version)

    @unary
    async def Generate(self, request, context):
        self._check_ready()
        # Counted (and refused past the caller's cap) before any work.
        with self.fair.slot(caller_id(context)) as slot:
            request_id, prompt, params = await self._prepare(request, RequestOutputKind.FINAL_ONLY)
            with self.calls.running(request_id) as call:
                async with self._admitted(slot, call, request.required_weight_version) as ticket:
                    final = None
                    run = self._run(ticket, call, prompt, params, request.lora_adapter, slot)
                    async for out in run:
                        final = out
        if final is None:  # aborted before it reached the engine
            return convert.aborted_response(request_id, params.n, ticket.version)
        top_k = params.logprobs or 0
        decode = self._decoder(params)
        usage = convert.usage_to_proto(final)
        metrics.PROMPT_TOKENS.inc(usage.prompt_tokens)
        metrics.COMPLETION_TOKENS.inc(usage.completion_tokens)
        slot.count(usage.prompt_tokens, usage.completion_tokens)
        response = pb.GenerateResponse(
            request_id=request_id,
            completions=[
                convert.completion_to_proto(c, top_k, decode, ticket.version)
                for c in sorted(final.outputs, key=lambda c: c.index)
            ],
            weight_version=ticket.version,
            usage=usage,
            lora_adapter_version=ticket.adapter_version,
        )
        if prompt.echo_ids:
            response.prompt_token_ids.extend(final.prompt_token_ids or [])
        convert.prompt_logprobs_to_proto(final, params.prompt_logprobs or 0, response)
        return response

    @streaming
    def GenerateStream(self, request, context):
        return self._generation(request, caller_id(context))

    @streaming
    async def GenerateMany(self, requests, context):
        self._check_ready()
        limits = many.StreamLimits.for_server(
            self.config.max_generations_per_stream,
            self.config.max_stream_tokens,
            self.config.max_message_bytes,
            self.info.limits.max_model_len,
        )
        generation = functools.partial(self._generation, who=caller_id(context))
        async for response in many.multiplex(requests, generation, limits):
            yield response

    async def _generation(
        self, stream_request: pb.GenerateStreamRequest, who: CallerId
    ) -> AsyncIterator:
        """One GenerateStream's messages (GenerateMany runs many of these),
        counted against its caller (fairness/); a request that cannot run
        raises at the first step, before anything is started."""
        self._check_ready()
        with self.fair.slot(who) as slot:
            async for message in self._generation_in(stream_request, slot):
                yield message

    async def _generation_in(self, stream_request: pb.GenerateStreamRequest, slot: Slot):
        request = pb.GenerateRequest.FromString(stream_request.SerializeToString())
        options = stream_request.stream_options
        request_id, prompt, params = await self._prepare(request, RequestOutputKind.DELTA, options)
        top_k = params.logprobs or 0
        omit_text = options.omit_text
        usage = pb.Usage()
        delivered: dict[int, int] = {}  # tokens sent so far, by completion index
        first = True
        with self.calls.running(request_id) as call:
            async with self._admitted(slot, call, request.required_weight_version) as ticket:
                version = ticket.version
                t0 = time.perf_counter()
                async for out in self._run(
                    ticket, call, prompt, params, request.lora_adapter, slot
                ):
                    if t0:
                        metrics.TTFT.observe(time.perf_counter() - t0)
                        t0 = 0.0
                    if out.prompt_token_ids:
                        usage.prompt_tokens = len(out.prompt_token_ids)
                    deltas = []
                    for c in out.outputs:
                        if not (c.token_ids or c.finish_reason):
                            continue
                        start, count = delivered.get(c.index, 0), len(c.token_ids)
                        delivered[c.index] = start + count
                        spans = self._delta_spans(ticket, c, start, count)
                        d = convert.stream_delta_to_proto(
                            request_id, c, top_k, version, spans, omit_text, ticket.adapter_version
                        )
                        usage.completion_tokens += count
                        deltas.append(d)
                    if first and (deltas or out.finished):
                        first = False
                        if not deltas:
                            deltas.append(self._empty_delta(request_id, ticket))
                        if prompt.echo_ids:
                            deltas[0].prompt_token_ids.extend(out.prompt_token_ids or [])
                        convert.prompt_logprobs_to_proto(
                            out, params.prompt_logprobs or 0, deltas[0]
                        )
                    if out.finished:
                        usage.cached_prompt_tokens = out.num_cached_tokens or 0
                        if not deltas:
                            deltas.append(self._empty_delta(request_id, ticket))
                        deltas[-1].usage.CopyFrom(usage)
                        metrics.PROMPT_TOKENS.inc(usage.prompt_tokens)
                        metrics.COMPLETION_TOKENS.inc(usage.completion_tokens)
                        slot.count(usage.prompt_tokens, usage.completion_tokens)
                    for d in deltas:
                        yield d
                if ticket.engine_id is None:  # aborted before it reached the engine
                    for i in range(params.n):
                        yield pb.GenerateStreamResponse(
                            request_id=request_id,
                            index=i,
                            finish_reason=pb.FINISH_REASON_ABORT,
                            weight_version=version,
                            usage=usage if i == params.n - 1 else None,
                        )

    @staticmethod
    def _empty_delta(request_id: str, ticket: Ticket) -> pb.GenerateStreamResponse:
        return pb.GenerateStreamResponse(
            request_id=request_id,
            weight_version=ticket.version,
            lora_adapter_version=ticket.adapter_version,
        )

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
