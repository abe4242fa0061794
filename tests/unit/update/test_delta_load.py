"""Loading a delta while it is decoded (rollout_service/update/delta_load.py),
on a recording engine: each group is decoded before the engine loads it and
while the engine loads the group before; a tensor refused after the engine
was touched puts the base back and has the engine load it again, and one
refused in the first group never touches the engine. The real engine's side
(several update_weights calls in one reload, the served weights after a
refusal) is tests/engine/weights/test_delta.py's."""

from __future__ import annotations

import asyncio

import crc32c
import numpy as np
import pytest

from rollout.v1 import rollout_pb2 as pb
from rollout_codecs import delta
from rollout_service.handoff.region import StagingRegion
from rollout_service.handoff.staged_tensor import StagedTensor
from rollout_service.status.errors import InvalidArgument
from rollout_service.update.delta_base import DeltaBase, DeltaPlan, DeltaTensor
from rollout_service.update.delta_load import decode_while_loading, groups
from rollout_service.update.quiesce import EngineRestored

NAMES = [f"layers.{i}.weight" for i in range(8)]
WORDS = 64 << 10  # bf16 words a tensor: 128 KiB


@pytest.fixture
def base():
    manifest = {n: pb.TensorSpec(name=n, dtype=pb.D_TYPE_BFLOAT16, shape=[WORDS]) for n in NAMES}
    staging, incoming = StagingRegion(), StagingRegion()
    b = DeltaBase(manifest, staging, incoming, decode_threads=1)
    rng = np.random.default_rng(3)
    staging.ensure(b.nbytes)[: b.nbytes] = rng.integers(0, 1 << 16, b.nbytes // 2, "<u2").tobytes()
    yield b
    b.close()
    staging.close()
    incoming.close()


def slot(b: DeltaBase, name: str) -> np.ndarray:
    return np.frombuffer(b.staging.ensure(0), "<u2", WORDS, b.offsets[name])


def delta_to_new(b: DeltaBase, wrong: str | None = None) -> tuple[DeltaPlan, dict[str, bytes]]:
    """A delta changing every tensor; `wrong` declares another CRC-32C."""
    news, payloads = {}, {}
    for i, n in enumerate(NAMES):
        new = slot(b, n).copy()
        new[i::97] ^= 0x0101
        news[n] = new.tobytes()
        payloads[n] = delta.encode_sparse(slot(b, n), new).tobytes()
    wire = b.incoming.ensure(sum(map(len, payloads.values())))
    tensors, at = [], 0
    for i, n in enumerate(NAMES):
        data = payloads[n]
        wire[at : at + len(data)] = data
        crc = crc32c.crc32c(news[n]) ^ (1 if n == wrong else 0)
        tensors.append(DeltaTensor(i, n, delta.SPARSE, at, len(data), b.offsets[n], 2 * WORDS, crc))
        at += len(data)
    plan = DeltaPlan(base_version="v0", tensors=tensors)
    b.check(plan)
    return plan, news


def load_list(b: DeltaBase) -> list[StagedTensor]:
    return [StagedTensor(n, "bfloat16", (WORDS,), b.offsets[n], 2 * WORDS) for n in NAMES]


class Engine:
    """Records the weight-update calls and the bytes each loaded tensor had."""

    def __init__(self, b: DeltaBase) -> None:
        self.base = b
        self.calls: list[tuple[str, list[str]]] = []
        self.seen: list[dict[str, bytes]] = []
        self.loading = False

    async def start_weight_update(self) -> None:
        self.calls.append(("start", []))

    async def finish_weight_update(self) -> None:
        self.calls.append(("finish", []))

    async def collective_rpc(self, method: str) -> None:
        self.calls.append((method, []))

    async def send(self, tensors: list[StagedTensor]) -> None:
        self.calls.append(("load", [t.name for t in tensors]))
        self.seen.append({t.name: slot(self.base, t.name).tobytes() for t in tensors})
        self.loading = True
        await asyncio.sleep(0.05)  # the engine's load: decoding goes on meanwhile
        self.loading = False


def run(b: DeltaBase, plan: DeltaPlan, engine: Engine) -> float:
    return asyncio.run(decode_while_loading(b, plan, load_list(b), engine, engine.send))


def test_groups_keep_the_load_order_and_start_small(base):
    plan, _ = delta_to_new(base)
    cut = groups(plan, load_list(base), count=4)
    assert [t.name for g in cut for t in g.load] == NAMES
    assert [t.name for g in cut for t in g.decode] == NAMES
    assert [len(g.load) for g in cut[:3]] == [1, 1, 2], "a quarter of a share first"


def test_every_group_is_decoded_before_the_engine_loads_it_and_while_it_loads_the_one_before(
    base, monkeypatch
):
    plan, news = delta_to_new(base)
    engine = Engine(base)
    overlapped: list[bool] = []
    decode = base.decode

    def spying(p, tensors, borrow=True):
        overlapped.append(engine.loading)
        return decode(p, tensors, borrow)

    monkeypatch.setattr(base, "decode", spying)
    assert run(base, plan, engine) > 0
    assert engine.calls[0] == ("start", []) and all(c == "load" for c, _ in engine.calls[1:])
    assert [n for _, names in engine.calls[1:] for n in names] == NAMES
    assert all(seen == {n: news[n] for n in seen} for seen in engine.seen), "loaded undecoded"
    assert len(overlapped) == len(engine.calls) - 1 > 2
    assert not overlapped[0] and all(overlapped[1:]), overlapped


def test_a_tensor_refused_after_the_engine_was_touched_puts_back_base_and_engine(base):
    before = {n: slot(base, n).tobytes() for n in NAMES}
    plan, _ = delta_to_new(base, wrong=NAMES[-1])
    engine = Engine(base)
    with pytest.raises(EngineRestored) as e:
        run(base, plan, engine)
    assert isinstance(e.value.error, InvalidArgument)
    assert e.value.error.field == f"begin.tensors[{len(NAMES) - 1}].crc32c"
    assert {n: slot(base, n).tobytes() for n in NAMES} == before, "the base is put back"
    # The half reload abandoned, then a new one of every tensor, from the
    # restored base, finished.
    assert engine.calls[-4:] == [
        ("rollout_abandon_weight_update", []),
        ("start", []),
        ("load", NAMES),
        ("finish", []),
    ]
    assert engine.seen[-1] == before


def test_a_tensor_refused_in_the_first_group_never_touches_the_engine(base):
    before = {n: slot(base, n).tobytes() for n in NAMES}
    plan, _ = delta_to_new(base, wrong=NAMES[0])
    engine = Engine(base)
    with pytest.raises(EngineRestored) as e:
        run(base, plan, engine)
    assert e.value.error.field == "begin.tensors[0].crc32c"
    assert engine.calls == []
    base.undo(plan)  # the caller's (base_weights.py), as after any failure
    assert {n: slot(base, n).tobytes() for n in NAMES} == before
