"""Loading a delta while it is decoded: the engine loads one group of tensors
from their slots while the next group is decoded into theirs.

A delta's tensors are decoded into the base (delta_base.py), then loaded from
the slots like a full update's. One after the other, the decode (the XOR and
the CRC-32C of every reconstructed tensor, memory-bound) added to the
engine's load: 0.08 s of a 0.57 s delta of the 0.31 GB model here, 0.55-0.68 s
of 4 s on the 2.2 GB one (BENCHMARKS.md, stop 46). Here the tensors the
engine loads (manifest order, the order of the slots) are cut into about
GROUPS runs of equal bytes, the first one smaller: it is decoded with the
engine idle, then each next group is decoded on the server's own cores while
the engine loads the one before (vLLM's layerwise reload takes a layer's
tensors over several update_weights calls and processes the layer once all
of them have arrived).

Entries that do not decode are refused before the engine is touched
(DeltaBase.check). What can still refuse a delta after it was touched is a
tensor whose reconstruction has another CRC-32C than the declared one (or a
zstd frame that does not decode). The groups before it are loaded by then:
the base is undone, the engine's half reload abandoned and every tensor of
the update loaded again from the slots, which hold the served bytes again.
The engine then holds exactly the weights it served (the same bytes through
the same loader, no forward pass in between), so no cache is stale and no
version changes: the refusal goes out as EngineRestored (quiesce.py). If
that reload fails, the server is degraded, as after any failed load.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rollout_service.handoff.staged_tensor import StagedTensor
from rollout_service.status.errors import InvalidArgument
from rollout_service.update.delta_base import DeltaBase, DeltaPlan, DeltaTensor
from rollout_service.update.quiesce import EngineRestored

# Groups of about equal bytes; the first is a quarter of the others (it is
# the part of the decode nothing hides). Each group is one update_weights
# call, about 9 ms of fixed cost on the 0.31 GB model here: 16 groups made
# its delta slower than decoding first (apply 0.475 s against 0.39), 2 to 8
# faster (0.33-0.34 s; BENCHMARKS.md, stop 47).
GROUPS = 8

Send = Callable[[list[StagedTensor]], Awaitable[None]]


@dataclass(frozen=True)
class Group:
    """Tensors the engine loads in one call, and those of them to decode first."""

    load: list[StagedTensor]
    decode: list[DeltaTensor]


def groups(plan: DeltaPlan, tensors: list[StagedTensor], count: int = GROUPS) -> list[Group]:
    """`tensors` (what the engine loads) in order, cut into at most `count`
    groups of about equal bytes, the first a quarter of the others; each
    with the delta's tensors among them."""
    by_name = {t.name: t for t in plan.tensors}
    total = sum(t.nbytes for t in tensors)
    share = max(1, total // max(1, count))
    out: list[Group] = []
    load: list[StagedTensor] = []
    at = 0
    bound = share // 4
    for t in tensors:
        load.append(t)
        at += t.nbytes
        if at >= bound:
            out.append(_group(load, by_name))
            load = []
            bound = (at // share + 1) * share
    if load or not out:
        out.append(_group(load, by_name))
    return out


def _group(load: list[StagedTensor], by_name: dict[str, DeltaTensor]) -> Group:
    return Group(load, [by_name[t.name] for t in load if t.name in by_name])


async def decode_while_loading(
    base: DeltaBase, plan: DeltaPlan, tensors: list[StagedTensor], engine, send: Send
) -> float:
    """Decodes `plan` into the base and has the engine load `tensors` (a
    weight update the caller finishes); returns the seconds spent decoding.
    A refused tensor raises EngineRestored (its InvalidArgument) once the
    engine holds the served weights: in the first group before the engine is
    touched (the caller undoes the base), later once the base is undone and
    loaded again. Called inside the quiesce."""
    cut = groups(plan, tensors)
    decoding = 0.0

    async def decoded(g: Group, borrow: bool) -> None:
        nonlocal decoding
        t = time.perf_counter()
        try:
            await asyncio.to_thread(base.decode, plan, g.decode, borrow)
        finally:
            decoding += time.perf_counter() - t

    try:
        await decoded(cut[0], borrow=True)
    except InvalidArgument as refused:  # the engine untouched
        raise EngineRestored(refused) from None
    await engine.start_weight_update()
    for k, g in enumerate(cut):
        loading = asyncio.ensure_future(send(g.load))
        ahead = [asyncio.ensure_future(decoded(cut[k + 1], False))] if k + 1 < len(cut) else []
        # Both end before either is looked at: the undo below must not
        # write slots the engine is reading, nor race a decode.
        await asyncio.wait([loading, *ahead])
        loading.result()  # a failure inside the engine: the caller's
        try:
            for a in ahead:
                a.result()
        except InvalidArgument as refused:
            await _restore(base, plan, tensors, engine, send)
            raise EngineRestored(refused) from None
    return decoding


async def _restore(
    base: DeltaBase, plan: DeltaPlan, tensors: list[StagedTensor], engine, send: Send
) -> None:
    """Puts the base back and the engine on it: the half reload abandoned
    (worker_ext.py: its unfinished layers back on what they served), then a
    new one of every tensor of the update."""
    await asyncio.to_thread(base.undo, plan)
    await engine.collective_rpc("rollout_abandon_weight_update")
    await engine.start_weight_update()
    await send(tensors)
    await engine.finish_weight_update()
