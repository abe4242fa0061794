"""RolloutService: an adapter between rollout.v1 and the vLLM engine.

Each RPC validates, converts, calls the engine and converts back; the
conversions live in `convert.py` (in) and `outputs.py` (out), a stream's
messages are built from the engine's outputs in `deltas.py` (all three in
generation/, tested without an engine), the update machinery in update/.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from vllm.sampling_params import RequestOutputKind

from rollout.v1 import rollout_pb2 as pb
from rollout.v1 import rollout_pb2_grpc
from rollout_service import __version__
from rollout_service.engine import vllm_compat
from rollout_service.engine.gate import Ticket
from rollout_service.engine.protocol import Engine
from rollout_service.fairness.identity import CallerId, caller_id
from rollout_service.fairness.share import Slot
from rollout_service.generation import convert, deltas, outputs
from rollout_service.ops import logs, metrics, tracing
from rollout_service.ops.auth import CALLER
from rollout_service.rpc import many
from rollout_service.rpc.calls import Call, RunningCalls
from rollout_service.rpc.handlers import Ending, streaming, unary
from rollout_service.rpc.serving import App
from rollout_service.rpc.session_rpcs import SessionRpcs
from rollout_service.rpc.update_rpcs import UpdateRpcs
from rollout_service.status.errors import (
    FailedPrecondition,
    InvalidArgument,
    Unavailable,
    engine_dead,
)


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

    def _live_spans(self, ticket: Ticket, index: int) -> list | None:
        """vLLM's version spans of running completion `index`'s tokens so
        far, read from the request's state (deltas.py's route 3); None
        before the request reaches the engine (_run)."""
        if ticket.engine_id is None:
            return None
        return vllm_compat.weight_version_spans(self.engine, ticket.engine_id, index)

    def _delta_spans(self, ticket: Ticket, c, start: int, count: int) -> list[tuple[str, int, int]]:
        """Version spans of a delta's tokens [start, start + count) of
        completion `c` (a session's turn; a stream's come from StreamDeltas)."""
        kept = ticket.keep_epoch != self.gate.keep_epoch
        live = functools.partial(self._live_spans, ticket)
        return deltas.delta_spans(c, start, count, ticket.version, kept, live)

    def _count(self, slot: Slot, usage: pb.Usage) -> None:
        """A finished generation's tokens: into the metrics and its caller's share."""
        metrics.PROMPT_TOKENS.inc(usage.prompt_tokens)
        metrics.COMPLETION_TOKENS.inc(usage.completion_tokens)
        slot.count(usage.prompt_tokens, usage.completion_tokens)

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
            return outputs.aborted_response(request_id, params.n, ticket.version)
        top_k = params.logprobs or 0
        decode = self._decoder(params)
        usage = outputs.usage_to_proto(final)
        self._count(slot, usage)
        response = pb.GenerateResponse(
            request_id=request_id,
            completions=[
                outputs.completion_to_proto(c, top_k, decode, ticket.version)
                for c in sorted(final.outputs, key=lambda c: c.index)
            ],
            weight_version=ticket.version,
            usage=usage,
            lora_adapter_version=ticket.adapter_version,
        )
        if prompt.echo_ids:
            response.prompt_token_ids.extend(final.prompt_token_ids or [])
        outputs.prompt_logprobs_to_proto(final, params.prompt_logprobs or 0, response)
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
        """Admits the request, runs it and yields what StreamDeltas makes of
        each engine output (generation/deltas.py)."""
        request = pb.GenerateRequest.FromString(stream_request.SerializeToString())
        options = stream_request.stream_options
        request_id, prompt, params = await self._prepare(request, RequestOutputKind.DELTA, options)
        with self.calls.running(request_id) as call:
            async with self._admitted(slot, call, request.required_weight_version) as ticket:
                stream = deltas.StreamDeltas(
                    request_id,
                    ticket,
                    functools.partial(self._live_spans, ticket),
                    top_k=params.logprobs or 0,
                    prompt_top_k=params.prompt_logprobs or 0,
                    omit_text=options.omit_text,
                    echo_prompt=prompt.echo_ids,
                )
                t0 = time.perf_counter()
                run = self._run(ticket, call, prompt, params, request.lora_adapter, slot)
                async for out in run:
                    if t0:
                        metrics.TTFT.observe(time.perf_counter() - t0)
                        t0 = 0.0
                    messages = stream.step(out, self.gate.keep_epoch)
                    if out.finished:
                        self._count(slot, stream.usage)
                    for message in messages:
                        yield message
                if ticket.engine_id is None:  # aborted before it reached the engine
                    for message in stream.aborted(params.n):
                        yield message

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
