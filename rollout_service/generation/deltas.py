"""A stream's messages, built from the engine's successive outputs.

GenerateStream (and each generation of GenerateMany) asks vLLM for
RequestOutputKind.DELTA outputs: each RequestOutput carries, per completion,
only what is new since the one before (tokens, their logprobs and text, a
finish reason once it ends). `StreamDeltas` turns each into the messages the
client reads:

- one per completion with new tokens or a finish, its tokens labelled with
  the weight versions that computed them, counted from where the completion's
  previous message ended;
- the first message of the stream also carries the prompt's ids (when the
  server made them) and the prompt logprobs, the last one the usage; an output
  that must carry one of these but has no completion to put it on gets a
  message of its own, without tokens.

A token's weight version comes by one of three routes, cheapest first:
1. a finished completion carries vLLM's own spans (`weight_versions`);
2. while no PAUSE_MODE_KEEP update has applied since the call was admitted
   (the gate's keep epoch is still the ticket's), every token has the
   admission version: nothing else could have computed it;
3. otherwise a running completion's spans are read from the engine's request
   state, through the function handed in (the servicer's, over
   `vllm_compat.weight_version_spans`): only finished outputs carry them.

Nothing here touches the engine, so it is tested with hand-built outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.engine.gate import Ticket
from rollout_service.generation import outputs

if TYPE_CHECKING:
    from vllm.outputs import CompletionOutput, RequestOutput

# Completion index -> vLLM's version spans (WeightVersionSpan) over that
# running completion's tokens so far, or None when the engine has none.
SpanReader = Callable[[int], Sequence[Any] | None]


def delta_spans(
    c: CompletionOutput, start: int, count: int, version: str, kept: bool, live: SpanReader
) -> list[tuple[str, int, int]]:
    """Version spans (outputs.version_spans) of completion `c`'s tokens
    [start, start + count): vLLM's own once it has finished; `version` (the
    admission's) unless a PAUSE_MODE_KEEP update applied since (`kept`);
    else read live. Tokens no span labels get `version`."""
    if c.finished():
        return outputs.version_spans(c.weight_versions, start, count, version)
    if not kept:
        return outputs.version_spans(None, start, count, version)
    return outputs.version_spans(live(c.index), start, count, version)


class StreamDeltas:
    """One stream's messages, from its engine outputs in order (`step`)."""

    def __init__(
        self,
        request_id: str,
        ticket: Ticket,
        live: SpanReader,
        *,
        top_k: int = 0,
        prompt_top_k: int = 0,
        omit_text: bool = False,
        echo_prompt: bool = False,
    ) -> None:
        """`ticket`: the call's admission (its version, keep epoch and, once
        the request runs, the adapter's version); `live`: reads a running
        completion's spans (route 3); `top_k` and `prompt_top_k`: top
        logprobs per token and per prompt position; `echo_prompt`: the first
        message returns the prompt's ids."""
        self.request_id = request_id
        self.ticket = ticket
        self.live = live
        self.top_k = top_k
        self.prompt_top_k = prompt_top_k
        self.omit_text = omit_text
        self.echo_prompt = echo_prompt
        # Counted as the outputs come; complete once one has finished.
        self.usage = pb.Usage()
        # Tokens sent so far, by completion index: where the next delta starts.
        self._delivered: dict[int, int] = {}
        self._first = True

    def step(self, out: RequestOutput, keep_epoch: int) -> list[pb.GenerateStreamResponse]:
        """The messages of one engine output (none when it carries nothing
        new); `keep_epoch`: the served one now (engine/served.py)."""
        if out.prompt_token_ids:
            self.usage.prompt_tokens = len(out.prompt_token_ids)
        kept = keep_epoch != self.ticket.keep_epoch
        deltas = [self._delta(c, kept) for c in out.outputs if c.token_ids or c.finish_reason]
        if self._first and (deltas or out.finished):
            self._first = False
            if not deltas:
                deltas.append(self._empty())
            if self.echo_prompt:
                deltas[0].prompt_token_ids.extend(out.prompt_token_ids or [])
            outputs.prompt_logprobs_to_proto(out, self.prompt_top_k, deltas[0])
        if out.finished:
            self.usage.cached_prompt_tokens = out.num_cached_tokens or 0
            if not deltas:
                deltas.append(self._empty())
            deltas[-1].usage.CopyFrom(self.usage)
        return deltas

    def aborted(self, n: int) -> list[pb.GenerateStreamResponse]:
        """The messages of a call aborted before it reached the engine: each
        of its `n` completions ends with ABORT, the last carries the usage."""
        return [
            pb.GenerateStreamResponse(
                request_id=self.request_id,
                index=i,
                finish_reason=pb.FINISH_REASON_ABORT,
                weight_version=self.ticket.version,
                usage=self.usage if i == n - 1 else None,
            )
            for i in range(n)
        ]

    def _delta(self, c: CompletionOutput, kept: bool) -> pb.GenerateStreamResponse:
        start, count = self._delivered.get(c.index, 0), len(c.token_ids)
        self._delivered[c.index] = start + count
        self.usage.completion_tokens += count
        ticket = self.ticket
        spans = delta_spans(c, start, count, ticket.version, kept, self.live)
        return outputs.stream_delta_to_proto(
            self.request_id,
            c,
            self.top_k,
            ticket.version,
            spans,
            self.omit_text,
            # Read per message: the request sets it once it runs (servicer._run).
            ticket.adapter_version,
        )

    def _empty(self) -> pb.GenerateStreamResponse:
        return pb.GenerateStreamResponse(
            request_id=self.request_id,
            weight_version=self.ticket.version,
            lora_adapter_version=self.ticket.adapter_version,
        )
