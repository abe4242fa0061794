"""One generation's state, as the values the pipeline's steps hand each
other: `Prepared` (what the engine will be asked), `Ready` (that, with its
caller's slot: every check passed, nothing started yet) and `Admitted`
(that, once it holds its Abort registration and its gate ticket). Each
step takes the value the step before made, so a reader follows one request
down one call stack instead of through side dictionaries."""

from __future__ import annotations

from dataclasses import dataclass

from vllm import SamplingParams

from rollout.v1 import rollout_pb2 as pb
from rollout_service.engine.gate import Ticket
from rollout_service.fairness.share import Slot
from rollout_service.generation.convert import EnginePrompt
from rollout_service.pipeline.calls import Call


@dataclass(frozen=True)
class Prepared:
    """A request validated, converted and tokenized: ready for the engine."""

    request_id: str
    prompt: EnginePrompt
    params: SamplingParams
    # The LoRA adapter it names ("" for the base model), resolved to an
    # engine request only after admission (an update may replace it).
    adapter: str
    # The weight version it must run on ("" for any).
    required_version: str


@dataclass(frozen=True)
class Ready:
    """A prepared request counted against its caller (`slot`): refused now
    only by what happens after it (the gate, its engine request), and
    nothing of it registered or on the engine yet. `stream`: a streamed
    generation's options (None: one answered whole)."""

    slot: Slot
    prepared: Prepared
    stream: pb.StreamOptions | None


@dataclass(frozen=True)
class Admitted:
    """A prepared request past every guard: counted against its caller
    (`slot`), findable by Abort (`call`), admitted through the gate on the
    ticket's version (`ticket`)."""

    prepared: Prepared
    slot: Slot
    call: Call
    ticket: Ticket
