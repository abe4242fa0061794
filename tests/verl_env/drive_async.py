"""Runs in the verl venv (tests/verl_env/build.py): drives verl 0.9.1's
fully-async client and its load balancer through the `rollout_service`
plugin against running services and writes what it saw as JSON (to `out`);
tests/test_verl_async.py checks it.

Input (JSON on stdin): out, target, second (another service on the same
model), model, push (a checkpoint folder), response_length, phase
("sync" or "routing").

- sync: verl's FullyAsyncLLMServerClient runs calls while verl's
  ActorRolloutRefWorker.update_weights pushes (naive backend, the plugin's
  default pause mode) and while new calls keep arriving; then one call held
  at the service's gate (the service asleep) when verl's abort_all_requests
  runs, resumed by verl's resume_generation.
- routing: with two targets, verl's LLMServerClient runs multi-turn
  trajectories (each turn's prompt extends the last turn's prompt and
  output, as verl's agent loops build them); then each service is asked,
  for each trajectory, how much of its last prompt its prefix cache holds.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any

from drive import cpu_platform, log, push, trainer_config


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
        # running there (polling another process: no event to wait on)
        while (await probe.server_info()).engine_requests < len(calls):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    pushing = asyncio.ensure_future(push(config, args["push"], 2))
    late = []
    while not pushing.done():  # calls leaving the plugin while the push runs
        late.append(asyncio.ensure_future(_call(client, f"late{len(late)}", prompt, t0)))
        await asyncio.sleep(0.05)
    out["second_push"] = await pushing
    out["running"] = list(await asyncio.gather(*calls))
    out["late"] = list(await asyncio.gather(*late))
    log(f"sync: {len(calls)} running, {len(late)} late calls")

    # A call on its way to the service when verl aborts: an update of the
    # served weights again (the same version, as a version's own weights may
    # be) waits in PAUSE_MODE_WAIT for a long call, the service's gate closed
    # meanwhile, so the call waits at it, where Abort does not find it.
    version = out["second_push"]["versions"][0]
    async with AsyncRolloutClient(args["target"], timeout=120) as direct:
        long = asyncio.ensure_future(
            direct.generate(
                prompt_token_ids=prompt, request_id="long", max_tokens=2000, ignore_eos=True
            )
        )
        await asyncio.sleep(0.5)
        again = asyncio.ensure_future(
            direct.update_weights(args["push"], version, drain_timeout_seconds=60)
        )
        await asyncio.sleep(1.5)  # uploaded: the gate closes for the drain
        t0 = time.monotonic()
        held = asyncio.ensure_future(_call(client, "held", prompt, t0))
        await asyncio.sleep(0.5)
        out["abort"] = await server.abort_all_requests.remote()
        out["long_running"] = not long.done()
        await direct.abort(["long"])
        await long
        await again
    await asyncio.sleep(2.0)  # paused: nothing may run until resume_generation
    out["resumed_at"] = time.monotonic() - t0
    await replica.resume_generation()
    out["held"] = await held
    out["stats"] = await server.stats.remote()
    return out


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
    import ray
    from verl.workers.rollout.llm_server import LLMServerManager

    cpu_platform()
    targets = args["target"] if args["phase"] == "sync" else f"{args['target']},{args['second']}"
    config = trainer_config(targets, args["model"], args["response_length"])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True)
    try:
        manager = await LLMServerManager.create(config, worker_group=None)
        log("LLMServerManager up")
        if args["phase"] == "sync":
            return await sync_phase(config, manager, args)
        return await routing_phase(config, manager, args)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    args = json.load(sys.stdin)
    result = asyncio.run(main(args))
    with open(args["out"], "w") as f:  # stdout carries verl's and Ray's prints
        json.dump(result, f)
