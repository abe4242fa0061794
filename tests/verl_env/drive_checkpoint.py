"""Runs in the verl venv (tests/verl_env/build.py): drives verl 0.9.1's
separate-async trainer's weight sync through the plugin's checkpoint-engine
backend (`checkpoint_engine.backend=rollout_service`) against a running
service and writes what it saw as JSON (to `out`);
tests/engine/trainers/test_verl_checkpoint.py checks it.

Input (JSON on stdin): out, target, model (the served checkpoint: step 1's
weights), push (a checkpoint folder: step 2's), prompt, response_length.

What is verl's own code here: PPOTrainerSeparateAsync.__init__ (its
assertions, the backend's among them), its LLMServerManager and
CheckpointEngineManager built as its _setup builds them, its on_init_end
and on_step_end (the syncs), its get_llm_client (FullyAsyncLLMServerClient),
and the trainer ranks' ActorRolloutRefWorker.update_weights and
execute_checkpoint_engine dispatched through verl's RayWorkerGroup to two
Ray actors of the trainer's worker class (DetachActorWorker). What stands in:
those actors skip the worker's __init__ (its process group and FSDP engine
need GPUs) and build only what init_model builds for the sync, the
checkpoint engine; their training engine is a stand-in whose
get_per_tensor_param yields a checkpoint's tensors.
"""

from __future__ import annotations

import asyncio
import os
import time
from types import SimpleNamespace
from typing import Any

from drive import (
    cpu_platform,
    load_state,
    log,
    ray_session,
    run,
    trainer_config,
    until_all_run,
)
from drive_async import _call

RANKS = 2
HERE = os.path.dirname(os.path.abspath(__file__))


def separate_async_config(args: dict) -> Any:
    return trainer_config(
        args["target"],
        args["model"],
        args["response_length"],
        backend="rollout_service",
        custom="delta:true",
        extra=(
            "trainer.v1.trainer_mode=separate_async",
            "actor_rollout_ref.hybrid_engine=False",  # no trainer GPUs lent to rollout
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "trainer.v1.separate_async.parameter_sync_step=1",
        ),
    )


def trainer_ranks(config: Any, checkpoint: str) -> Any:
    """verl's RayWorkerGroup over RANKS actors of the separate-async
    trainer's worker class, each with the checkpoint engine init_model
    builds (verl's registry, is_master on rank 0)."""
    import ray
    from verl.experimental.separation.engine_workers import DetachActorWorker
    from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup

    class Rank(DetachActorWorker):
        def __init__(self, config: Any, rank: int, checkpoint: str) -> None:
            from verl.checkpoint_engine import CheckpointEngineRegistry
            from verl.utils.config import omega_conf_to_dataclass

            self.config = config.actor_rollout_ref
            self.load(checkpoint)
            ce = omega_conf_to_dataclass(self.config.rollout.checkpoint_engine)
            self.checkpoint_engine = CheckpointEngineRegistry.new(
                ce.backend,
                is_master=rank == 0,
                bucket_size=ce.update_weights_bucket_megabytes << 20,
                **ce.engine_kwargs.get(ce.backend, {}),
            )

        def load(self, checkpoint: str) -> int:
            state = load_state(checkpoint)
            self.iterated = 0

            def per_tensor_param(**kwargs: Any) -> Any:
                def gen() -> Any:
                    for item in state.items():
                        self.iterated += 1
                        yield item

                return gen(), None

            self.actor = SimpleNamespace(
                engine=SimpleNamespace(get_per_tensor_param=per_tensor_param)
            )
            return len(state)

        def seen(self) -> dict:
            p = getattr(self.checkpoint_engine, "pusher", None)
            return {
                "iterated": self.iterated,
                "acks": [] if p is None else [a.weight_version for a in p.acks],
                "bytes": [] if p is None else [a.bytes_received for a in p.acks],
            }

    actors = [
        ray.remote(Rank).options(num_cpus=0).remote(config, r, checkpoint) for r in range(RANKS)
    ]
    return RayWorkerGroup(
        worker_handles=actors,
        ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(DetachActorWorker)),
    )


async def _greedy(c: Any, prompt: list[int]) -> list[float]:
    r = await c.generate(prompt_token_ids=prompt, max_tokens=8, temperature=0.0, logprobs=0)
    return list(r.completions[0].logprobs)


async def main(args: dict) -> dict:
    from verl.checkpoint_engine import CheckpointEngineManager
    from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.rollout.llm_server import LLMServerManager

    from rollout_client import AsyncRolloutClient

    cpu_platform()
    config = separate_async_config(args)
    out: dict[str, Any] = {}
    trainer = PPOTrainerSeparateAsync.__new__(PPOTrainerSeparateAsync)
    try:
        PPOTrainerSeparateAsync.__init__(trainer, config)  # asserts the backend is not naive
        out["init"] = "ok"
    except AssertionError as e:
        out["init"] = f"AssertionError: {e}"
        return out
    # the ranks import drive.py
    with ray_session(args, runtime_env={"env_vars": {"PYTHONPATH": HERE}}):
        # _setup's standalone part, as it is written there (its first half,
        # super()._setup(), builds the training worker groups: GPUs)
        manager = await LLMServerManager.create(config=config, start_rank=0)
        trainer.standalone_server_manager = manager
        trainer.standalone_checkpoint_manager = CheckpointEngineManager(
            config=omega_conf_to_dataclass(config.actor_rollout_ref.rollout.checkpoint_engine),
            actor_wg=trainer_ranks(config, args["model"]),
            replicas=manager.get_replicas(),
        )
        ranks = trainer.standalone_checkpoint_manager.actor_wg.workers
        server = manager.get_replicas()[0].server_handle
        log("manager and ranks up")
        trainer.global_steps = 1
        await asyncio.to_thread(trainer.on_init_end)  # step 1: the served checkpoint
        out["first"] = await server.get_version.remote()
        log("first sync")

        client = trainer.get_llm_client()
        prompt = args["prompt"]
        await asyncio.gather(*(r.load.remote(args["push"]) for r in ranks))
        t0 = time.monotonic()
        calls = [asyncio.ensure_future(_call(client, f"run{i}", prompt, t0)) for i in range(4)]
        async with AsyncRolloutClient(args["target"], timeout=120) as probe:
            await until_all_run(probe, calls)
            trainer.prev_step_profile = False
            trainer.timing_raw = {}
            trainer.global_steps = 2
            syncing = asyncio.ensure_future(asyncio.to_thread(trainer.on_step_end))
            late = []
            while not syncing.done():  # calls leaving verl while the sync runs
                late.append(asyncio.ensure_future(_call(client, f"late{len(late)}", prompt, t0)))
                await asyncio.sleep(0.05)
            await syncing
            out["sync_metrics"] = trainer._pending_sync_metrics
            out["running"] = list(await asyncio.gather(*calls))
            out["late"] = list(await asyncio.gather(*late))
            out["after"] = await _call(client, "after", prompt, time.monotonic())
            out["pin"] = await server.get_version.remote()
            out["served_version"] = (await probe.server_info()).weight_version
            out["stats"] = await server.stats.remote()
            out["ranks"] = [await r.seen.remote() for r in ranks]
            # what the service serves is step 2's checkpoint: pushing it again
            # directly changes no logprob
            synced = await _greedy(probe, prompt)
            await probe.update_weights(load_state(args["push"]), "step-2-again")
            out["greedy_delta"] = max(
                abs(a - b) for a, b in zip(synced, await _greedy(probe, prompt), strict=True)
            )
        log(f"second sync: {len(calls)} running, {len(late)} late calls")
    return out


if __name__ == "__main__":
    run(main)
