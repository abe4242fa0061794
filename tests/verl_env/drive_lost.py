"""Runs in the verl venv (tests/verl_env/build.py): a trajectory through
verl's LLMServerClient over two services (rollout.custom.target lists
both) whose first service is lost between two turns; writes what it saw as
JSON (to `out`); tests/engine/trainers/test_verl_routing.py checks it.

Input (JSON on stdin): out, first (the service that is lost: the first
turn goes there), second, model, response_length, prompt_length, ready (a
file this writes after the first turn), go (a file it then waits for: the
test has stopped `first`).
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

from drive import cpu_platform, log, ray_session, run, trainer_config


def _turn(o: Any) -> dict:
    return {
        "n": len(o.token_ids),
        "stop_reason": o.stop_reason,
        "num_cached_tokens": o.extra_fields.get("num_cached_tokens"),
    }


def _lose_first(args: dict) -> None:
    """Tells the test to stop the first service; waits until it has."""
    Path(args["ready"]).write_text("")
    deadline = time.monotonic() + 180
    while not Path(args["go"]).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    log("first service stopped")


async def main(args: dict) -> dict:
    from verl.workers.rollout.llm_server import LLMServerManager

    cpu_platform()
    targets = f"{args['first']},{args['second']}"
    config = trainer_config(targets, args["model"], args["response_length"])
    with ray_session(args):
        manager = await LLMServerManager.create(config, worker_group=None)
        server = manager.get_replicas()[0].server_handle
        client = manager.get_client()
        sampling = dict(temperature=0.0, top_p=1.0, top_k=-1, logprobs=True, ignore_eos=True)
        rng = random.Random(51)
        ids = [rng.randrange(10, 500) for _ in range(args["prompt_length"])]
        turns, stats = [], []
        for turn in range(3):
            if turn == 1:  # the first service is lost mid-trajectory
                await asyncio.to_thread(_lose_first, args)
            started = time.monotonic()
            o = await client.generate("traj", prompt_ids=ids, sampling_params=dict(sampling))
            turns.append({**_turn(o), "seconds": time.monotonic() - started})
            stats.append(await server.stats.remote())
            ids = ids + list(o.token_ids) + [rng.randrange(10, 500) for _ in range(8)]  # a tool
        return {"turns": turns, "stats": stats}


if __name__ == "__main__":
    run(main)
