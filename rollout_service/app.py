"""Wiring: every object that serves one running engine, built in one place.

`server.py` runs the process (port, health, signals, shutdown) and calls
`build_app` once the engine is up, and starts the handlers' `Serving` with
the result (rpc/readiness.py). Nothing
else constructs these objects, so who holds what is read here, top to bottom.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

from rollout_codecs import delta
from rollout_service.config import ServerConfig
from rollout_service.engine.gate import AdmissionGate
from rollout_service.engine.protocol import Engine
from rollout_service.engine.served import Served
from rollout_service.engine.startup import engine_info, warm_up
from rollout_service.fairness.share import FairShare, parse_shares
from rollout_service.generation.tokenizing import Tokenizing, eos_token_ids, image_placeholder
from rollout_service.handoff.region import StagingRegion
from rollout_service.pipeline.serving import App
from rollout_service.sessions.store import SessionLimits, SessionStore
from rollout_service.status import static_rules
from rollout_service.update.delta_base import DeltaBase
from rollout_service.update.reservation import region_bytes
from rollout_service.update.sleep import Sleeper
from rollout_service.update.transfers import WeightTransfers
from rollout_service.update.updates import build_updater

# Why PAUSE_MODE_KEEP is refused on a model that takes images.
KEEP_REFUSAL_MULTIMODAL = (
    "PAUSE_MODE_KEEP is not supported on multimodal models yet: a kept request's "
    "image inputs would be recomputed from the multimodal cache the update resets"
)


async def build_app(
    engine: Engine,
    config: ServerConfig,
    staging: StagingRegion,
    on_degraded: Callable[[bool], Awaitable[object]],
    cpus: set[int] | None = None,
) -> App:
    """Builds the app on a started engine and warms it up. Raises
    staging.StagingSpaceError when /dev/shm cannot hold the staging region."""
    info = await engine_info(engine, config.max_prompt_tokens)
    max_update = config.max_update_bytes or (info.model_bytes + info.model_bytes // 4 + (64 << 20))
    served = Served(config.initial_weight_version, on_degraded)
    gate = AdmissionGate(served, config.max_queued_generate)
    base = DeltaBase(
        info.manifest,
        staging,
        # Deltas, adapters and possible retries arrive here instead, so
        # that they never write the served bytes in the slots.
        StagingRegion(),
        decode_threads=config.delta_decode_threads or min(8, len(cpus or os.sched_getaffinity(0))),
        decode_cpus=cpus,
    )
    updater = build_updater(
        engine,
        gate,
        info.manifest,
        max_update,
        base,
        groups=info.groups,
        kv_connector=info.kv_connector,
        drain_timeout_seconds=config.drain_timeout_seconds,
        broadcast=config.weight_broadcast,
        keep_refusal=KEEP_REFUSAL_MULTIMODAL if info.limits.supports_images else None,
    )
    if nbytes := region_bytes(info.manifest, max_update):
        staging.ensure(nbytes, prefault=config.prefault_staging)
    checkpoint = engine.model_config.model
    if os.path.isdir(checkpoint):  # noqa: ASYNC240 (once, before serving)
        # The delta base: the served bytes, from the checkpoint (delta_base.py).
        await asyncio.to_thread(
            updater.weights.base.load_checkpoint, checkpoint, config.initial_weight_version
        )
    # What the starting version names (version_names.py).
    await asyncio.to_thread(updater.weights.name_start, config.initial_weight_version)
    await asyncio.to_thread(delta.warm_up)
    await asyncio.to_thread(static_rules.warm_up)
    await updater.start()
    # vLLM labels every output with its engine core's weight version
    # (per-token version spans); it starts as "default".
    await engine.update_weight_version(config.initial_weight_version)
    await warm_up(engine)
    tokenizer = engine.get_tokenizer()
    tokenizing = Tokenizing(
        tokenizer,
        eos_token_ids(engine, tokenizer),
        image_placeholder(engine),
        chat_template=_read(config.chat_template) if config.chat_template else None,
    )
    return App(
        engine=engine,
        info=info,
        served=served,
        gate=gate,
        updater=updater,
        transfers=WeightTransfers(updater, config.update_idle_timeout_seconds),
        tokenizing=tokenizing,
        adapters=updater.adapters,
        sleeper=Sleeper(engine, updater.quiescer, served),
        session_store=SessionStore(
            SessionLimits(
                max_sessions=config.max_sessions,
                max_sessions_per_caller=config.max_sessions_per_caller,
                max_session_tokens=config.max_session_tokens,
                idle_timeout_seconds=config.session_idle_timeout_seconds,
                max_model_len=info.limits.max_model_len,
            )
        ),
        fair=FairShare(
            config.fair_share,
            parse_shares(config.caller_shares),
            config.max_requests_per_caller,
            config.engine_seats_per_caller
            or FairShare.default_seats(engine.vllm_config.scheduler_config.max_num_seqs),
        ),
    )


def _read(path: str) -> str:
    with open(path) as f:  # noqa: ASYNC230 (once, before serving)
        return f.read()
