"""The generation pipeline: one request from its caller's slot to its
outputs, written once, for every front (the gRPC handlers, and any other
that serves the same engine in this process).

One generation, in order:

1. **slot**: counted against its caller (fairness/), refused past the
   caller's cap before any work;
2. **prepare**: a request id, the engine alive and not degraded, a named
   adapter known; then, on the tokenizing thread, validated, converted and
   tokenized (generation/convert.py) into a `Prepared`;
3. **register**: findable by Abort under its request id (calls.py);
4. **engine seat** of its caller's, then **gate** admission (a ticket on
   the served version), then the degraded and version checks again;
5. **run** on the engine at the slot's priority;
6. **count** its tokens, and build its outputs (version spans and all).

Steps 1 and 2 (`ready`) and steps 3 to 6 (`answer`, `streamed`) are
apart, the value `Ready` between them: a front that runs several
generations as one (a batch of prompts, http/batch.py) has every one ready
before it runs any, so a prompt refused starts none of them. `generate` and
`stream` are the two joined, for one generation.

Errors are the project's RpcErrors (status/errors.py): each front maps
them to its own statuses.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from vllm.sampling_params import RequestOutputKind

from rollout.v1 import rollout_pb2 as pb
from rollout_service.engine import vllm_compat
from rollout_service.engine.gate import Ticket
from rollout_service.fairness.identity import CallerId
from rollout_service.fairness.share import Slot
from rollout_service.generation import convert, deltas, outputs
from rollout_service.ops import logs, metrics, tracing
from rollout_service.pipeline import many
from rollout_service.pipeline.calls import Call, RunningCalls
from rollout_service.pipeline.context import Admitted, Prepared, Ready
from rollout_service.pipeline.serving import App
from rollout_service.status import static_rules
from rollout_service.status.errors import FailedPrecondition, engine_dead

# A request of token ids this small converts in microseconds: on the loop it
# saves the thread hop (a hand-off, a wake-up of the loop through its
# self-pipe) that costs more than the conversion (BENCHMARKS.md, against
# `vllm serve --grpc`). Text and chat messages (tokenized) and images
# (decoded) always go off the loop.
INLINE_REQUEST_BYTES = 2048


def _converts_inline(request: pb.GenerateRequest) -> bool:
    return (
        not request.prompt_text
        and not request.messages
        and not request.images
        and request.ByteSize() <= INLINE_REQUEST_BYTES
    )


class Generations:
    """The pipeline over one App (module docstring). `calls` is the Abort
    registry every front shares; `many_limits` bounds one `many` stream."""

    def __init__(self, app: App, calls: RunningCalls, many_limits: many.StreamLimits) -> None:
        self.app = app
        self.calls = calls
        self.many_limits = many_limits

    def check_alive(self) -> None:
        """UNAVAILABLE once the engine has died (it cannot be revived here)."""
        if self.app.engine.errored:
            raise engine_dead()

    async def prepare(
        self, request: pb.GenerateRequest, kind: RequestOutputKind, stream=None
    ) -> Prepared:
        """Step 2: the request ready for the engine, or the error naming
        what is wrong with it."""
        app = self.app
        request_id = request.request_id or uuid.uuid4().hex
        logs.request_id.set(request_id)
        self.check_alive()
        app.served.check_serving()
        if request.lora_adapter:
            app.adapters.check_known(request.lora_adapter)
        if _converts_inline(request):
            prompt, params = self._convert(request, kind, stream)
        else:
            # Tokenizing, rendering and parsing grow with the request: off the loop.
            prompt, params = await app.tokenizing.off_loop(self._convert, request, kind, stream)
        return Prepared(
            request_id, prompt, params, request.lora_adapter, request.required_weight_version
        )

    def _convert(self, request: pb.GenerateRequest, kind: RequestOutputKind, stream):
        static_rules.check(request)  # the contract's ranges, before any tokenizing
        limits = self.app.info.limits
        prompt = convert.prompt_from_request(request, limits, self.app.tokenizing)
        params = convert.sampling_params_from_proto(
            request.sampling_params, limits, prompt.num_tokens, kind, stream
        )
        if prompt.num_tokens is not None:  # token ids: rendered here, not on vLLM's thread
            rendered = vllm_compat.rendered_prompt(self.app.engine, prompt.prompt)
            prompt = dataclasses.replace(prompt, prompt=rendered)
        return prompt, params

    @contextmanager
    def registered(self, request_id: str) -> Iterator[Call]:
        """Step 3: Abort finds the call from here on, waiting or running."""
        with self.calls.running(request_id) as call:
            yield call

    @asynccontextmanager
    async def seated(self, slot: Slot, call: Call, required_version: str) -> AsyncIterator[Ticket]:
        """Step 4: an engine seat of the caller's (fairness/; an Abort ends
        the wait for one), admission through the gate, then the degraded and
        version checks again: calls that waited at the gate while an update
        failed inside the engine (or installed another version) must not
        run on it."""
        async with slot.seat(call.abort_event), self.app.gate.admit() as ticket:
            self.app.served.check_serving()
            if required_version and ticket.version != required_version:
                raise FailedPrecondition(
                    f"required_weight_version: this server serves "
                    f"{ticket.version!r:.200}, not {required_version!r:.200}",
                    reason=pb.ERROR_REASON_WRONG_WEIGHT_VERSION,
                )
            yield ticket

    @asynccontextmanager
    async def admitted(self, slot: Slot, prepared: Prepared) -> AsyncIterator[Admitted]:
        """Steps 3 and 4 for a generation: registered, then seated."""
        with self.registered(prepared.request_id) as call:
            async with self.seated(slot, call, prepared.required_version) as ticket:
                yield Admitted(prepared, slot, call, ticket)

    async def run(self, g: Admitted) -> AsyncIterator[Any]:
        """Step 5: the engine request of an admitted call at its slot's
        priority (fairness/); cancellation of the call (client gone,
        deadline) aborts it inside AsyncLLM.generate. Nothing runs for a
        call aborted before it got here."""
        call, ticket, p = g.call, g.ticket, g.prepared
        if call.aborted:
            return
        # Resolved after admission: an adapter update that the call waited
        # for at the gate has replaced (or removed) it by now.
        engine, adapters = self.app.engine, self.app.adapters
        gives_way = self.app.fair.gives_way
        lora = adapters.request_for(p.adapter) if p.adapter else None
        ticket.adapter_version = adapters.version_of(p.adapter) if p.adapter else ""
        ticket.engine_id = call.engine_id = f"{call.request_id}-{uuid.uuid4().hex[:8]}"
        metrics.ENGINE_REQUESTS.inc()
        async for out in engine.generate(
            p.prompt.prompt,
            p.params,
            ticket.engine_id,
            lora_request=lora,
            # vLLM's llm_request span becomes a child of this call's span.
            trace_headers=tracing.headers(),
            priority=g.slot.priority,
        ):
            ticket.started = True
            if call.aborted and not out.finished:
                # Abort came before the engine knew the request: end it now.
                await engine.abort(ticket.engine_id)
            if gives_way(g.slot):
                # One engine step wakes every running request at once: the
                # messages of a caller past its share wait one pass of the
                # loop, so another caller's (its first token) go out first.
                await asyncio.sleep(0)
            yield out

    async def run_whole(self, g: Admitted) -> AsyncIterator[Any]:
        """Step 5 for a call answered at its end that keeps what it sampled
        however it ends (a session's whole turn, whose engine request sends
        its first output and its last): as `run`, each output handed on as
        it comes (a running one's version spans are read then), but a
        cancellation (client gone, deadline) aborts the engine request here
        rather than inside AsyncLLM.generate, which would drop the abort's
        last output, and that output (every token sampled since the one
        before, with its logprobs and versions) is still handed on before
        the cancellation goes on."""
        arrived: asyncio.Queue[Any] = asyncio.Queue()

        async def consume() -> None:
            async for out in self.run(g):
                arrived.put_nowait(out)

        task = asyncio.ensure_future(consume())
        task.add_done_callback(lambda _: arrived.put_nowait(None))
        cancelled = False
        try:
            while True:
                try:
                    out = await arrived.get()
                except asyncio.CancelledError:
                    if cancelled:
                        raise
                    cancelled = True
                    await self.abort(g.call)  # its last output comes, then the end
                    continue
                if out is None:
                    break
                yield out
            task.result()  # the engine's error, if it failed
        finally:
            if not task.done():  # the caller stopped reading: nobody keeps the rest
                task.cancel()
        if cancelled:
            raise asyncio.CancelledError

    async def abort(self, call: Call) -> None:
        """Ends a registered call: it never reaches the engine, or its engine
        request is aborted (whose last output still comes to `run`)."""
        call.aborted = True
        if call.engine_id is not None:
            await self.app.engine.abort([call.engine_id])

    def live_spans(self, ticket: Ticket, index: int) -> list | None:
        """vLLM's version spans of running completion `index`'s tokens so
        far, read from the request's state (deltas.py's route 3); None
        before the request reaches the engine (`run`)."""
        if ticket.engine_id is None:
            return None
        return vllm_compat.weight_version_spans(self.app.engine, ticket.engine_id, index)

    def delta_spans(self, ticket: Ticket, c, start: int, count: int) -> list[tuple[str, int, int]]:
        """Version spans of a delta's tokens [start, start + count) of
        completion `c` (a session's turn; a stream's come from StreamDeltas)."""
        kept = ticket.keep_epoch != self.app.served.keep_epoch
        live = functools.partial(self.live_spans, ticket)
        return deltas.delta_spans(c, start, count, ticket.version, kept, live)

    @staticmethod
    def count(slot: Slot, prompt_tokens: int, completion_tokens: int) -> None:
        """Step 6: a finished generation's tokens, into the metrics and its
        caller's share."""
        metrics.PROMPT_TOKENS.inc(prompt_tokens)
        metrics.COMPLETION_TOKENS.inc(completion_tokens)
        slot.count(prompt_tokens, completion_tokens)

    @asynccontextmanager
    async def ready(
        self, request: pb.GenerateRequest | pb.GenerateStreamRequest, who: CallerId
    ) -> AsyncIterator[Ready]:
        """Steps 1 and 2: the caller's slot (held until the context ends),
        then the request prepared, for `answer` (a GenerateRequest) or for
        `streamed` (a GenerateStreamRequest). Nothing is registered or
        started on the engine."""
        self.check_alive()
        # Counted (and refused past the caller's cap) before any work.
        with self.app.fair.slot(who) as slot:
            if isinstance(request, pb.GenerateStreamRequest):
                options = request.stream_options
                request = pb.GenerateRequest.FromString(request.SerializeToString())
                p = await self.prepare(request, RequestOutputKind.DELTA, options)
                yield Ready(slot, p, options)
            else:
                yield Ready(slot, await self.prepare(request, RequestOutputKind.FINAL_ONLY), None)

    async def generate(self, request: pb.GenerateRequest, who: CallerId) -> pb.GenerateResponse:
        """One generation, its outputs at the end (Generate)."""
        async with self.ready(request, who) as r:
            return await self.answer(r)

    async def answer(self, r: Ready) -> pb.GenerateResponse:
        """Steps 3 to 6 of a generation `ready` prepared from a GenerateRequest."""
        slot, p = r.slot, r.prepared
        final = None
        async with self.admitted(slot, p) as g:
            async for out in self.run(g):
                final = out
        ticket = g.ticket
        if final is None:  # aborted before it reached the engine
            return outputs.aborted_response(p.request_id, p.params.n, ticket.version)
        usage = outputs.usage_to_proto(final)
        self.count(slot, usage.prompt_tokens, usage.completion_tokens)
        return self._response(p, ticket, final, usage)

    def _response(self, p: Prepared, ticket: Ticket, final, usage: pb.Usage) -> pb.GenerateResponse:
        params = p.params
        top_k = params.logprobs or 0
        decode = self._decoder(params)
        response = pb.GenerateResponse(
            request_id=p.request_id,
            completions=[
                outputs.completion_to_proto(c, top_k, decode, ticket.version)
                for c in sorted(final.outputs, key=lambda c: c.index)
            ],
            weight_version=ticket.version,
            usage=usage,
            lora_adapter_version=ticket.adapter_version,
        )
        if p.prompt.echo_ids:
            response.prompt_token_ids.extend(final.prompt_token_ids or [])
        outputs.prompt_logprobs_to_proto(final, params.prompt_logprobs or 0, response)
        return response

    def _decoder(self, params):
        """Token ids to text, when vLLM was asked not to detokenize."""
        tok = self.app.tokenizing
        if params.detokenize or tok.tokenizer is None:
            return None
        return lambda ids: tok.decode(ids, skip_special_tokens=params.skip_special_tokens)

    async def stream(
        self, stream_request: pb.GenerateStreamRequest, who: CallerId
    ) -> AsyncIterator[pb.GenerateStreamResponse]:
        """One generation's messages as the engine makes them
        (GenerateStream; `many` runs many of these); a request that cannot
        run raises at the first step, before anything is started."""
        async with self.ready(stream_request, who) as r:
            async for message in self.streamed(r):
                yield message

    async def streamed(self, r: Ready) -> AsyncIterator[pb.GenerateStreamResponse]:
        """Steps 3 to 6 of a generation `ready` prepared from a
        GenerateStreamRequest, its messages built by StreamDeltas
        (generation/deltas.py) as the engine makes its outputs."""
        slot, p, options = r.slot, r.prepared, r.stream
        if options is None:
            raise TypeError("streamed runs what ready prepared from a GenerateStreamRequest")
        async with self.admitted(slot, p) as g:
            ticket = g.ticket
            stream = deltas.StreamDeltas(
                p.request_id,
                ticket,
                functools.partial(self.live_spans, ticket),
                top_k=p.params.logprobs or 0,
                prompt_top_k=p.params.prompt_logprobs or 0,
                omit_text=options.omit_text,
                echo_prompt=p.prompt.echo_ids,
            )
            served = self.app.served
            t0 = time.perf_counter()
            async for out in self.run(g):
                if t0:
                    metrics.TTFT.observe(time.perf_counter() - t0)
                    t0 = 0.0
                messages = stream.step(out, served.keep_epoch)
                if out.finished:
                    usage = stream.usage
                    self.count(slot, usage.prompt_tokens, usage.completion_tokens)
                for message in messages:
                    yield message
            if ticket.engine_id is None:  # aborted before it reached the engine
                for message in stream.aborted(p.params.n):
                    yield message

    def many(self, requests, who: CallerId) -> AsyncIterator[pb.GenerateManyResponse]:
        """Many generations on one stream (GenerateMany, many.py), each run
        as `stream` runs one, each counted against `who`."""
        self.check_alive()
        generation = functools.partial(self.stream, who=who)
        return many.multiplex(requests, generation, self.many_limits)
