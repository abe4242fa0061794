"""The quiesce (quiesce.py) and the door to vLLM's internals (vllm_compat.py),
on a stand-in engine that records what it is asked: the order of the
sequence, KEEP, failures, Sleep and WakeUp (which vLLM's CPU platform cannot
run end to end), drains. Last, the vLLM internals that vllm_compat reads are
checked to exist in the installed vLLM, so an upgrade that moves them fails
here first."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from rollout_client import pb
from rollout_service.engine import vllm_compat
from rollout_service.engine.gate import AdmissionGate
from rollout_service.engine.served import Served
from rollout_service.handoff.region import StagingRegion
from rollout_service.status.errors import FailedPrecondition
from rollout_service.update.delta_base import DeltaBase
from rollout_service.update.quiesce import EngineFailure, Quiescer
from rollout_service.update.sleep import Sleeper
from rollout_service.update.updates import build_updater


class _Core:
    def __init__(self, engine: _Engine) -> None:
        self.engine = engine

    async def pause_scheduler_async(self, mode, clear_cache):
        self.engine.log("pause", mode, clear_cache)


class _Engine:
    """Records each call with whether the gate was open at that moment."""

    def __init__(self, gate: AdmissionGate, prefix_resets: bool = True) -> None:
        self.gate = gate
        self.prefix_resets = prefix_resets
        self.calls: list[tuple] = []
        self.engine_core = _Core(self)
        self.output_processor = SimpleNamespace(external_req_ids={}, request_states={})

    def log(self, *call) -> None:
        self.calls.append((*call, "open" if self.gate.is_open else "closed"))

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    async def resume_generation(self):
        self.log("resume")

    async def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        self.log("prefix", reset_running_requests)
        return self.prefix_resets

    async def reset_mm_cache(self):
        self.log("mm")

    async def reset_encoder_cache(self):
        self.log("encoder")

    async def abort(self, ids):
        self.log("abort", list(ids))
        for i in ids:
            self.output_processor.external_req_ids.pop(i, None)

    async def sleep(self, level):
        self.log("sleep", level)

    async def wake_up(self):
        self.log("wake_up")

    async def collective_rpc(self, method):
        self.log("abandon" if method == "rollout_abandon_weight_update" else method)


class _Served(Served):
    """Logs when a version is installed, beside the engine's calls."""

    engine: _Engine

    async def install(self, version):
        self.engine.log("install", version)
        await super().install(version)


def _quiescer(**kw) -> tuple[Quiescer, _Engine, AdmissionGate]:
    served = _Served("v0")
    gate = AdmissionGate(served)
    engine = served.engine = _Engine(gate, kw.pop("prefix_resets", True))
    return Quiescer(engine, gate, **kw), engine, gate


async def _running_call(gate: AdmissionGate, engine: _Engine, engine_id: str):
    """An admitted call whose engine request is running; exit it when done."""
    admit = gate.admit()
    ticket = await admit.__aenter__()
    ticket.engine_id, ticket.started = engine_id, True
    engine.output_processor.external_req_ids[engine_id] = [engine_id + "-0"]
    return admit


def test_the_sequence_in_order_with_the_gate_closed_throughout():
    quiescer, engine, gate = _quiescer()

    async def go():
        async with quiescer.quiesced(installs="v1") as q:
            engine.log("work")
            await quiescer.reset(q)
        waiting = gate.admit()
        ticket = await waiting.__aenter__()
        await waiting.__aexit__(None, None, None)
        return q, ticket

    q, ticket = asyncio.run(go())
    assert engine.calls == [
        ("pause", "abort", False, "closed"),
        ("work", "closed"),
        ("prefix", False, "closed"),
        ("mm", "closed"),
        ("encoder", "closed"),
        ("resume", "closed"),
        ("install", "v1", "closed"),
    ]
    assert gate.is_open and ticket.version == "v1"
    assert [r.cache for r in q.results] == [
        pb.CACHE_KIND_PREFIX,
        pb.CACHE_KIND_MULTIMODAL,
        pb.CACHE_KIND_ENCODER,
    ]
    assert q.aborted == 0 and q.t0 <= q.t_reset


def test_keep_drains_nothing_pauses_in_keep_mode_and_preempts_on_reset():
    quiescer, engine, gate = _quiescer(drain_timeout_seconds=0.0)

    async def go():
        call = await _running_call(gate, engine, "r1")
        async with quiescer.quiesced(pb.PAUSE_MODE_KEEP) as q:
            await quiescer.reset(q)
        await call.__aexit__(None, None, None)
        return q

    q = asyncio.run(go())
    assert q.aborted == 0 and "abort" not in engine.names()
    assert engine.calls[0] == ("pause", "keep", False, "closed")
    assert ("prefix", True, "closed") in engine.calls


@pytest.mark.parametrize("mode", [pb.PAUSE_MODE_WAIT, pb.PAUSE_MODE_ABORT])
def test_a_running_call_is_drained_by_abort_past_the_deadline(mode):
    quiescer, engine, gate = _quiescer(drain_timeout_seconds=0.05)

    async def go():
        call = await _running_call(gate, engine, "r1")
        async with quiescer.quiesced(mode) as q:
            await quiescer.reset(q)
        await call.__aexit__(None, None, None)
        return q

    q = asyncio.run(go())
    assert q.aborted == 1
    assert engine.names()[:2] == ["abort", "pause"]


def test_a_failed_load_degrades_while_paused_then_resumes_and_reopens():
    quiescer, engine, gate = _quiescer()

    async def go():
        async with quiescer.quiesced(installs="v1"):
            raise ValueError("load failed")

    with pytest.raises(EngineFailure, match="'v1' failed inside the engine") as e:
        asyncio.run(go())
    assert isinstance(e.value.__cause__, ValueError)
    # the workers' half-loaded state is cleared while the engine is paused,
    # and no version is claimed: not the old one, not the new one
    assert engine.names() == ["pause", "abandon", "resume"]
    assert gate.is_open and gate.served.version == "" and quiescer.served.degraded


def test_work_that_ends_without_the_reset_is_not_installed_and_raises():
    quiescer, engine, gate = _quiescer()

    async def go():
        async with quiescer.quiesced(installs="v1"):
            engine.log("work")

    with pytest.raises(EngineFailure, match="'v1' failed inside the engine"):
        asyncio.run(go())
    # no cache reset, so no version claimed: degraded, as a failed load
    assert "prefix" not in engine.names() and "install" not in engine.names()
    assert gate.is_open and gate.served.version == "" and quiescer.served.degraded


def test_without_a_hook_the_failure_itself_is_raised_and_a_refused_reset_too():
    quiescer, engine, gate = _quiescer()

    async def go():
        async with quiescer.quiesced():
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        asyncio.run(go())
    assert engine.names() == ["pause", "resume"] and gate.is_open

    quiescer, engine, gate = _quiescer(prefix_resets=False)

    async def reset_only():
        async with quiescer.quiesced() as q:
            await quiescer.reset(q)

    with pytest.raises(RuntimeError, match="refused to reset the prefix cache"):
        asyncio.run(reset_only())
    assert engine.names() == ["pause", "prefix", "resume"] and gate.is_open


def test_one_quiesce_at_a_time():
    quiescer, engine, _ = _quiescer()

    async def one(name):
        async with quiescer.quiesced() as q:
            engine.log(name + " in")
            await asyncio.sleep(0.01)
            engine.log(name + " out")
            await quiescer.reset(q)

    async def go():
        await asyncio.gather(one("a"), one("b"))

    asyncio.run(go())
    inside = [n for n in engine.names() if n.endswith((" in", " out"))]
    assert inside == ["a in", "a out", "b in", "b out"]


def test_sleep_holds_the_gate_closed_until_woken_and_touches_no_pause_or_cache():
    quiescer, engine, gate = _quiescer()

    async def go():
        async with quiescer.quiesced(sleep=True):
            await engine.sleep(1)
        assert quiescer.asleep and not gate.is_open
        with pytest.raises(FailedPrecondition, match="asleep"):
            quiescer.check_awake()
        async with quiescer.woken():
            await engine.wake_up()

    asyncio.run(go())
    assert engine.names() == ["sleep", "wake_up"]
    assert not quiescer.asleep and gate.is_open


def test_a_failed_sleep_reopens_and_a_failed_wake_up_stays_asleep():
    quiescer, _, gate = _quiescer()

    async def failing_sleep():
        async with quiescer.quiesced(sleep=True):
            raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        asyncio.run(failing_sleep())
    assert not quiescer.asleep and gate.is_open

    async def failing_wake():
        async with quiescer.quiesced(sleep=True):
            pass
        async with quiescer.woken():
            raise RuntimeError("still asleep")

    with pytest.raises(RuntimeError):
        asyncio.run(failing_wake())
    assert quiescer.asleep and not gate.is_open


def test_sleeper_level_2_wakes_degraded_and_refuses_resets_meanwhile():
    served = Served("v0")
    gate = AdmissionGate(served)
    engine = _Engine(gate)
    engine.model_config = SimpleNamespace(enable_sleep_mode=True)
    engine.vllm_config = SimpleNamespace(lora_config=None)
    base = DeltaBase({}, StagingRegion(), StagingRegion())
    updater = build_updater(engine, gate, {}, 1, base)
    try:
        sleeper = Sleeper(engine, updater.quiescer, served)
        sleeper.refusal = None  # vLLM's CPU platform has no sleep mode

        async def go():
            await sleeper.sleep(2)
            assert sleeper.sleeping
            with pytest.raises(FailedPrecondition, match="asleep"):
                await updater.reset_caches()
            return await sleeper.wake_up()

        woke = asyncio.run(go())
    finally:
        updater.close()
    assert woke.needs_weights and not sleeper.sleeping
    assert gate.is_open and served.version == "" and served.degraded


# -- vllm_compat -------------------------------------------------------------


def test_compat_pauses_through_the_core_client_or_the_public_call():
    gate = AdmissionGate(Served("v0"))
    engine = _Engine(gate)
    asyncio.run(vllm_compat.pause_scheduler(engine, "keep"))
    assert engine.calls == [("pause", "keep", False, "open")]

    calls = []

    async def pause_generation(mode, clear_cache):
        calls.append((mode, clear_cache))

    asyncio.run(
        vllm_compat.pause_scheduler(SimpleNamespace(pause_generation=pause_generation), "abort")
    )
    assert calls == [("abort", False)]


def test_compat_reads_a_running_requests_spans_by_completion_index():
    state = SimpleNamespace(request_index=1, _weight_version_spans=lambda: ["spans"])
    other = SimpleNamespace(request_index=0, _weight_version_spans=lambda: ["other"])
    outputs = SimpleNamespace(
        external_req_ids={"r1": ["a", "b"]}, request_states={"a": other, "b": state}
    )
    engine = SimpleNamespace(output_processor=outputs)
    assert vllm_compat.weight_version_spans(engine, "r1", 1) == ["spans"]
    assert vllm_compat.weight_version_spans(engine, "r1", 2) is None
    assert vllm_compat.weight_version_spans(engine, "gone", 0) is None
    assert vllm_compat.request_running(engine, "r1")
    assert not vllm_compat.request_running(engine, "gone")


def test_the_vllm_internals_compat_reads_exist_in_the_installed_vllm():
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.core_client import AsyncMPClient
    from vllm.v1.engine.output_processor import OutputProcessor, RequestState

    outputs = OutputProcessor(None, log_stats=False)
    assert isinstance(outputs.external_req_ids, dict)
    assert isinstance(outputs.request_states, dict)
    assert callable(RequestState._weight_version_spans)
    assert callable(AsyncMPClient.pause_scheduler_async)
    assert callable(AsyncLLM.get_num_unfinished_requests)
