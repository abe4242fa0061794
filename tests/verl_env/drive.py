"""Runs in the verl venv (tests/verl_env/build.py), not in the server's:
drives verl 0.9.1's own code against a running service through the
`rollout_service` plugin and writes what it saw as JSON (to `out`). The
checks are tests/engine/trainers/test_verl.py's, in the server's venv.

Input (a JSON object on stdin): out (where the result goes), target, model (the served checkpoint's
folder: the tokenizer), push (a checkpoint folder whose state dict verl
hands over), step, prompts (token ids), response_length, chat (a user
message for the single-turn agent loop).

1. `import verl` alone loads the plugin (the `verl.plugins` entry point);
   verl's lookups resolve its classes.
2. verl's LLMServerManager (standalone mode: no GPU asked for) and its
   LLMServerClient generate each prompt with the agent loop's sampling
   parameters; verl's SingleTurnAgentLoop runs one chat prompt.
3. verl's ActorRolloutRefWorker.update_weights (the "naive" path: every
   rank's rollout.update_weights) hands the `push` state dict to the plugin
   under `step`, called as verl's tests/checkpoint_engine/
   test_global_steps_on_cpu.py calls it (a worker without __init__, its
   engine a stand-in yielding the tensors); then the same prompts again.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[drive {time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


@contextmanager
def ray_session(args: dict, **options: Any) -> Iterator[None]:
    """A local Ray for one drive, its session files in args["ray_files"]
    when given (the test run's folder; Ray's /tmp/ray otherwise).
    `options`: ray.init's."""
    import ray

    if args.get("ray_files"):
        options["_temp_dir"] = args["ray_files"]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True, **options)
    try:
        yield
    finally:
        ray.shutdown()


def cpu_platform() -> None:
    """verl 0.9.1 has no CPU platform: on a machine without GPUs it falls
    back to CUDA's, and the naive update path's memory logging and
    synchronize() then fail. Its platform API (PlatformRegistry /
    set_platform, meant for plugins) takes one; this is it."""
    import torch
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import set_platform

    class CPU(PlatformBase):
        device_name = "cpu"
        vendor_name = "cpu"
        device_module = torch.cpu

        def is_available(self) -> bool:
            return True

        def current_device(self) -> int:
            return 0

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            pass

        def synchronize(self, device_index: int | None = None) -> None:
            pass

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            pass

        def empty_cache(self) -> None:
            pass

        def get_device_capability(self, device_index: int = 0):
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        def nvtx_range(self, msg: str):
            import contextlib

            return contextlib.nullcontext()

        def profiler_start(self) -> None:
            pass

        def profiler_stop(self) -> None:
            pass

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> Any:
            return None

    # torch.cpu has no empty_cache(), which update_weights calls.
    if not hasattr(torch.cpu, "empty_cache"):
        torch.cpu.empty_cache = lambda: None
    set_platform(CPU())


def registrations() -> dict:
    import importlib.metadata

    import verl  # noqa: F401  (loads the verl.plugins entry points)

    loaded_by_import = "rollout_client.verl" in sys.modules
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    eps = [(ep.name, ep.value) for ep in importlib.metadata.entry_points(group="verl.plugins")]
    replica = get_rollout_replica_class("rollout_service")
    rollout = get_rollout_class("rollout_service", "async")
    return {
        "entry_points": eps,
        "loaded_by_import_verl": loaded_by_import,
        "replica_class": f"{replica.__module__}.{replica.__qualname__}",
        "rollout_class": f"{rollout.__module__}.{rollout.__qualname__}",
        "verl_version": verl.__version__,
    }


def trainer_config(
    target: str,
    model: str,
    response_length: int,
    backend: str = "naive",
    custom: str = "",
    extra: tuple[str, ...] = (),
) -> Any:
    """verl's ppo_trainer config with what a user sets for the plugin;
    `custom`: more rollout.custom keys ('delta:true'), `extra`: more
    overrides."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    keys = f'target:"{target}"' + (f",{custom}" if custom else "")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(
            "ppo_trainer",
            overrides=[
                # what a user sets (docs/verl.md) ...
                "actor_rollout_ref.rollout.name=rollout_service",
                f"+actor_rollout_ref.rollout.custom={{{keys}}}",
                "actor_rollout_ref.rollout.calculate_log_probs=True",
                f"actor_rollout_ref.rollout.response_length={response_length}",
                f"actor_rollout_ref.model.path={model}",
                # ... and one replica on one (notional) device
                "actor_rollout_ref.rollout.nnodes=1",
                "actor_rollout_ref.rollout.n_gpus_per_node=1",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                f"actor_rollout_ref.rollout.checkpoint_engine.backend={backend}",
                "actor_rollout_ref.rollout.free_cache_engine=False",
                *extra,
            ],
        )


def load_state(checkpoint: str) -> dict:
    """A checkpoint folder's state dict."""
    from safetensors.torch import load_file

    state = {}
    for name in sorted(os.listdir(checkpoint)):
        if name.endswith(".safetensors"):
            state.update(load_file(os.path.join(checkpoint, name)))
    return state


def agent_sampling(config: Any) -> dict:
    """What verl's AgentLoopWorker.generate_sequences sends (agent_loop.py),
    greedy: the test compares with the service's answer to the same request."""
    return dict(temperature=0.0, top_p=1.0, top_k=-1, repetition_penalty=1.0, logprobs=True)


async def generate_all(client: Any, prompts: list[list[int]], sampling: dict) -> list[dict]:
    async def one(i: int, ids: list[int]) -> dict:
        out = await client.generate(f"p{i}", prompt_ids=ids, sampling_params=dict(sampling))
        return {
            "token_ids": list(out.token_ids),
            "log_probs": out.log_probs,
            "stop_reason": out.stop_reason,
            "extra_fields": {k: v for k, v in out.extra_fields.items() if _plain(v)},
        }

    return [await one(i, ids) for i, ids in enumerate(prompts)]


def _plain(v: Any) -> bool:
    return v is None or isinstance(v, str | int | float | bool)


async def agent_loop(config: Any, client: Any, model: str, chat: str) -> dict:
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
    from verl.utils.dataset.rl_dataset import RLHFDataset

    tokenizer = AutoTokenizer.from_pretrained(model)
    loop = SingleTurnAgentLoop(
        trainer_config=DictConfigWrap(config=config),
        server_manager=client,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
    )
    out = await loop.run(agent_sampling(config), raw_prompt=[{"role": "user", "content": chat}])
    return {
        "prompt_ids": list(out.prompt_ids),
        "response_ids": list(out.response_ids),
        "response_logprobs": out.response_logprobs,
        "global_steps": out.extra_fields.get("global_steps"),
    }


async def until_all_run(probe: Any, calls: list) -> None:
    """Until the service (`probe`: a client of it) runs every one of `calls`
    at once (polling another process: no event to wait on). Fails with what
    the calls returned if they all ended first or 120 s pass: a drive that
    waited forever held its test for its whole timeout and said nothing."""
    deadline = time.monotonic() + 120
    while (await probe.server_info()).engine_requests < len(calls):
        if all(c.done() for c in calls) or time.monotonic() > deadline:
            seen = [c.result() if c.done() else "still waiting" for c in calls]
            raise RuntimeError(f"the service never ran the {len(calls)} calls at once: {seen}")
        await asyncio.sleep(0.05)


async def push(config: Any, checkpoint: str, step: int) -> dict:
    """verl's own hand-off function, the plugin's rollout under it."""
    import torch
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl.workers.rollout.base import get_rollout_class

    state = load_state(checkpoint)
    iterated: list[str] = []

    class Engine:
        """The trainer engine's stand-in: get_per_tensor_param as FSDP's
        engine returns it (a generator of (name, tensor), no PEFT config)."""

        is_param_offload_enabled = False

        def get_per_tensor_param(self, **kwargs: Any):
            def gen():
                for n, t in state.items():
                    iterated.append(n)
                    yield n, t

            return gen(), None

    rollout_config = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    rollout_cls = get_rollout_class(rollout_config.name, rollout_config.mode)
    worker = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)
    worker.config = config.actor_rollout_ref
    worker.actor = SimpleNamespace(engine=Engine())
    worker.rollout = rollout_cls(
        config=rollout_config, model_config=config.actor_rollout_ref.model, device_mesh=None
    )
    worker.layered_summon = False
    worker.peft_merge = False
    worker.base_sync_done = True
    with torch.no_grad():
        await ActorRolloutRefWorker.update_weights.__wrapped__(
            worker, global_steps=step, mode="auto"
        )
    acks = worker.rollout.acks
    return {
        "iterated": len(iterated),
        "tensors": len(state),
        "versions": [a.weight_version for a in acks],
        "caches_reset": [[[int(c.cache), bool(c.reset)] for c in a.caches_reset] for a in acks],
        "pushed_version": worker.rollout.version,
    }


async def behind_its_back(client: Any, args: dict) -> str:
    """Another client changes the served weights after the step's push: the
    next rollout must be refused, not served from weights verl did not push
    (what it was refused with; "" if it was served)."""
    from safetensors.torch import load_file

    from rollout_client import RolloutClient

    head = None
    for name in sorted(os.listdir(args["push"])):
        if name.endswith(".safetensors"):
            head = load_file(os.path.join(args["push"], name)).get("lm_head.weight", head)
    with RolloutClient(args["target"], timeout=120) as other:
        other.update_weights({"lm_head.weight": head * 2}, f"other-{args['step']}")
    try:
        await client.generate(
            "late", prompt_ids=args["prompts"][0], sampling_params={"logprobs": True}
        )
    except Exception as e:
        return repr(e)
    return ""


async def main(args: dict) -> dict:
    out: dict[str, Any] = {"registrations": registrations()}
    log("registrations resolved")
    cpu_platform()
    from verl.workers.rollout.llm_server import LLMServerManager

    config = trainer_config(args["target"], args["model"], args["response_length"])
    with ray_session(args):
        manager = await LLMServerManager.create(config, worker_group=None)
        log("LLMServerManager up")
        client = manager.get_client()
        out["addresses"] = manager.get_addresses()
        sampling = agent_sampling(config)
        out["sampling"] = sampling
        out["before"] = await generate_all(client, args["prompts"], sampling)
        out["agent"] = await agent_loop(config, client, args["model"], args["chat"])
        log("generated")
        out["push"] = await push(config, args["push"], args["step"])
        log("pushed")
        out["after"] = await generate_all(client, args["prompts"], sampling)
        out["agent_after"] = await agent_loop(config, client, args["model"], args["chat"])
        server = manager.get_replicas()[0].server_handle
        out["server_version"] = list(await server.get_version.remote())
        log("generated after the push")
        out["refused"] = await behind_its_back(client, args)
    return out


def run(main: Any) -> None:
    """A drive script's entry: its arguments from stdin, `main`'s answer to
    the file `out` names (stdout carries verl's and Ray's prints)."""
    args = json.load(sys.stdin)
    result = asyncio.run(main(args))
    with open(args["out"], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    run(main)
