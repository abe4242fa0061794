"""Runs in the verl venv (tests/verl_env/build.py): drives verl 0.9.1's
fully-async client and its load balancer through the `rollout_service`
plugin against running services and writes what it saw as JSON (to `out`);
tests/engine/trainers/test_verl_async.py checks it.

Input (JSON on stdin): out, target, second (another service on the same
model), model, push (a checkpoint folder), response_length, phase
("sync" or "routing").

- sync: verl's FullyAsyncLLMServerClient runs calls while verl's
  ActorRolloutRefWorker.update_weights pushes (naive backend, the plugin's
  default pause mode) and while new calls keep arriving; then calls that
  wait at the gate while a push (PAUSE_MODE_WAIT) drains, refused on the
  new version and resumed by verl; then a call still on its way to the
  service when the plugin's abort_all_requests runs (_transit_phase).
- routing: with two targets, verl's LLMServerClient runs multi-turn
  trajectories (each turn's prompt extends the last turn's prompt and
  output, as verl's agent loops build them); then each service is asked,
  for each trajectory, how much of its last prompt its prefix cache holds.
"""

from __future__ import annotations

import asyncio
import copy
import random
import time
from typing import Any

from drive import cpu_platform, log, push, ray_session, run, trainer_config, until_all_run


def _out(o: Any, t0: float) -> dict:
    e = o.extra_fields
    return {
        "n": len(o.token_ids),
        "logprobs": len(o.log_probs or []),
        "stop_reason": o.stop_reason,
        "min_global_steps": e.get("min_global_steps"),
        "max_global_steps": e.get("max_global_steps"),
        "done_at": time.monotonic() - t0,
    }


async def _call(client: Any, rid: str, ids: list[int], t0: float) -> dict:
    sampling = dict(temperature=1.0, top_p=1.0, top_k=-1, logprobs=True, ignore_eos=True)
    try:
        o = await client.generate(rid, prompt_ids=ids, sampling_params=sampling)
    except Exception as e:  # what verl's batch would die of
        return {"error": repr(e)}
    return _out(o, t0)


async def sync_phase(config: Any, manager: Any, args: dict) -> dict:
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

    from rollout_client import AsyncRolloutClient

    client = manager.get_client(FullyAsyncLLMServerClient)
    replica = manager.get_replicas()[0]
    server = replica.server_handle
    out: dict[str, Any] = {"first_push": await push(config, args["push"], 1)}
    prompt = args["prompt"]
    t0 = time.monotonic()
    calls = [asyncio.ensure_future(_call(client, f"run{i}", prompt, t0)) for i in range(4)]
    async with AsyncRolloutClient(args["target"], timeout=120) as probe:
        await until_all_run(probe, calls)
    pushing = asyncio.ensure_future(push(config, args["push"], 2))
    late = []
    while not pushing.done():  # calls leaving the plugin while the push runs
        late.append(asyncio.ensure_future(_call(client, f"late{len(late)}", prompt, t0)))
        await asyncio.sleep(0.05)
    out["second_push"] = await pushing
    out["running"] = list(await asyncio.gather(*calls))
    out["late"] = list(await asyncio.gather(*late))
    log(f"sync: {len(calls)} running, {len(late)} late calls")
    out.update(await _refused_phase(config, client, args))
    out["transit"] = await _transit_phase(replica, args)
    out["stats"] = await server.stats.remote()
    return out


async def _refused_phase(config: Any, client: Any, args: dict) -> dict:
    """Calls that leave the plugin pinned to the served version and reach
    the service after a push of ours moved it, every time: the push runs in
    PAUSE_MODE_WAIT, whose drain holds the service's gate closed behind a
    long call, and the calls are sent meanwhile. They wait at the gate,
    the push installs the new version, they are refused on it
    (WRONG_WEIGHT_VERSION), come back aborted, and verl resumes them under
    the new pin."""
    from omegaconf import OmegaConf

    from rollout_client import AsyncRolloutClient

    waiting = copy.deepcopy(config)
    OmegaConf.update(waiting, "actor_rollout_ref.rollout.custom.pause_mode", "wait", force_add=True)
    prompt = args["prompt"]
    async with AsyncRolloutClient(args["target"], timeout=120) as direct:
        long = asyncio.ensure_future(
            direct.generate(
                prompt_token_ids=prompt, request_id="long-wait", max_tokens=2000, ignore_eos=True
            )
        )
        while (await direct.server_info()).engine_requests < 1:  # noqa: ASYNC110
            if long.done():
                long.result()  # refused: say why
            await asyncio.sleep(0.05)
        pushing = asyncio.ensure_future(push(waiting, args["push"], 3))
        await asyncio.sleep(2.0)  # uploaded and committed: the gate is closed for the drain
        t0 = time.monotonic()
        refused = [
            asyncio.ensure_future(_call(client, f"refused{i}", prompt, t0)) for i in range(2)
        ]
        await asyncio.sleep(1.0)
        held_at_gate = (await direct.server_info()).engine_requests == 1  # the long call only
        await direct.abort(["long-wait"])
        await long
        third = await pushing
    return {
        "third_push": third,
        "refused": list(await asyncio.gather(*refused)),
        "refused_held_at_gate": held_at_gate,
    }


async def _transit_phase(replica: Any, args: dict) -> dict:
    """A call still on its way to the service when verl aborts: the
    plugin's server (the class verl's replica runs as a Ray actor, here in
    this process) whose connection delays each Generate by a second before
    the service sees it. One connection delivers in order, so a real
    network cannot make the service's Abort overtake a call; what it
    stands for is a call that left the plugin but is not yet registered at
    the service (on the wire, in the service's prepare step)."""
    from rollout_client import AsyncRolloutClient
    from rollout_client.verl.server import ServiceServer

    class Delayed(AsyncRolloutClient):
        async def generate(self, **kwargs: Any) -> Any:
            await asyncio.sleep(1.0)  # in transit
            return await super().generate(**kwargs)

    server = ServiceServer(config=replica.config, settings=replica.settings, replica_rank=7)
    (target,) = replica.settings.targets
    wire = Delayed(target, timeout=120)
    async with AsyncRolloutClient(target, timeout=120) as probe:
        server._clients = [wire]
        server._max_model_len = int((await probe.server_info()).max_model_len)
        version, step = await replica.server_handle.get_version.remote()
        await server.set_version(version, step)
        sampling = dict(temperature=1.0, top_p=1.0, top_k=-1, logprobs=True, ignore_eos=True)
        held = asyncio.ensure_future(server.generate(args["prompt"], sampling, "transit"))
        await asyncio.sleep(0.3)
        abort = await server.abort_all_requests()
        o = await held
        await asyncio.sleep(1.5)  # past the transit: a call not cancelled would run now
        ran = (await probe.server_info()).engine_requests
        await server.resume_generation()
        after = await server.generate(args["prompt"], sampling, "after")
    await wire.close()
    return {
        "abort": abort,
        "held": {"n": len(o.token_ids), "stop_reason": o.stop_reason},
        "engine_requests_after_transit": ran,
        "after": {"n": len(after.token_ids), "stop_reason": after.stop_reason},
        "stats": await server.stats(),
    }


def _trajectory_prompt(j: int, length: int) -> list[int]:
    rng = random.Random(1000 + j)  # distinct from the first token on
    return [rng.randrange(10, 500) for _ in range(length)]  # 512 ids in all


async def routing_phase(config: Any, manager: Any, args: dict) -> dict:
    from rollout_client import AsyncRolloutClient

    client = manager.get_client()
    sampling = dict(temperature=0.0, top_p=1.0, top_k=-1, logprobs=True, ignore_eos=True)

    async def trajectory(j: int) -> list[int]:
        ids = _trajectory_prompt(j, args["prompt_length"])
        for turn in range(args["turns"]):
            o = await client.generate(f"traj{j}", prompt_ids=ids, sampling_params=sampling)
            ids = ids + list(o.token_ids)
            if turn + 1 < args["turns"]:
                ids = ids + _trajectory_prompt(100 + 10 * j + turn, 8)  # the tool's answer
        return ids

    finals = await asyncio.gather(*(trajectory(j) for j in range(args["trajectories"])))
    server = manager.get_replicas()[0].server_handle
    out: dict[str, Any] = {"stats": await server.stats.remote(), "held": {}}
    for target in (args["target"], args["second"]):  # each service's own cache
        async with AsyncRolloutClient(target, timeout=120) as c:
            held = []
            for ids in finals:
                r = await c.generate(prompt_token_ids=ids, max_tokens=1, temperature=0.0)
                held.append(int(r.usage.cached_prompt_tokens))
            out["held"][target] = held
    out["lengths"] = [len(ids) for ids in finals]
    return out


async def main(args: dict) -> dict:
    from verl.workers.rollout.llm_server import LLMServerManager

    cpu_platform()
    targets = args["target"] if args["phase"] == "sync" else f"{args['target']},{args['second']}"
    config = trainer_config(targets, args["model"], args["response_length"])
    with ray_session(args):
        manager = await LLMServerManager.create(config, worker_group=None)
        log("LLMServerManager up")
        if args["phase"] == "sync":
            return await sync_phase(config, manager, args)
        return await routing_phase(config, manager, args)


if __name__ == "__main__":
    run(main)
