"""Which caches an update resets, with a KV connector configured. No KV
connector runs on vLLM's CPU backend (OffloadingConnector: "only supported on
CUDA-alike and XPU GPUs"), so this one case uses a stand-in engine; the
refusal of connectors that cannot reset is tested end to end in
test_engine_config.py."""

from __future__ import annotations

import asyncio

from rollout_client import pb
from rollout_service.engine.gate import AdmissionGate
from rollout_service.engine.served import Served
from rollout_service.update.quiesce import Quiescer


class _Engine:
    def __init__(self):
        self.calls = []

    async def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        self.calls.append(("prefix", reset_connector))
        return True

    async def reset_mm_cache(self):
        self.calls.append(("mm",))

    async def reset_encoder_cache(self):
        self.calls.append(("encoder",))


def _reset(kv_connector: bool):
    engine = _Engine()
    quiescer = Quiescer(engine, AdmissionGate(Served("v0")), kv_connector=kv_connector)
    results = asyncio.run(quiescer.reset_all())
    return engine.calls, [(r.cache, r.reset) for r in results]


def test_a_configured_kv_connector_is_reset_and_reported():
    calls, results = _reset(kv_connector=True)
    assert ("prefix", True) in calls
    assert (pb.CACHE_KIND_KV_CONNECTOR, True) in results


def test_without_a_connector_three_caches_are_reset():
    calls, results = _reset(kv_connector=False)
    assert ("prefix", False) in calls and ("mm",) in calls and ("encoder",) in calls
    assert [c for c, _ in results] == [
        pb.CACHE_KIND_PREFIX,
        pb.CACHE_KIND_MULTIMODAL,
        pb.CACHE_KIND_ENCODER,
    ]
