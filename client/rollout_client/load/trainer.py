"""The trainer user: a full update of the model's size every `--push-every`
seconds, cycling through `--pause-modes`, each under a new version name (the
server refuses a name it served before with other weights). Its entries: the
push as the trainer sees it (`update` / `push KEEP`), and the pause it caused
new calls (`update` / `pause KEEP`: the acknowledgement's
`timings.admission_closed_seconds`, how long the gate was closed).

The weights are random tensors shaped and typed as GetServerInfo's manifest
says, made once (torch: `pip install './client[load]'` brings it) and pushed
again under each new name: what the server does with them does not depend on
their values, and making a large model's tensors anew every push would load
the load machine instead of the server.
"""

from __future__ import annotations

import uuid
from typing import Any

from locust import task

from rollout.v1 import rollout_pb2 as pb
from rollout_client.load.report import CallFailed
from rollout_client.load.users import RolloutUser
from rollout_codecs import dtypes, extras

UPDATE = "update"


def random_weights(parameters: Any, seed: int = 0) -> dict[str, Any]:
    """A tensor for every manifest entry: floats N(0, 0.02) (norms near one,
    so activations stay finite), integers zero."""
    torch = extras.require("torch", "the trainer user's random weights", "load")
    g = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {}
    for p in parameters:
        dtype = getattr(torch, dtypes.torch_name(p.dtype))
        shape = [int(d) for d in p.shape]
        if not dtype.is_floating_point:
            out[p.name] = torch.zeros(shape, dtype=dtype)
            continue
        t = torch.randn(shape, generator=g) * 0.02
        if "norm" in p.name:
            t += 1.0
        out[p.name] = t.to(dtype)
    return out


def preload() -> None:
    """Imports torch now, if it is there: importing it holds the whole process
    (every user of it) for a second or so, which at the trainer's start would
    land in the other users' first calls."""
    try:
        extras.require("torch", "the trainer user's random weights", "load")
    except ImportError:
        pass  # the trainer, if it runs, reports it


class TrainerUser(RolloutUser):
    """Pushes every `--push-every` seconds. One per run (`fixed_count`): two
    trainers would refuse each other's updates (UPDATE_IN_PROGRESS), and the
    watcher orders the pushes of its own process only."""

    fixed_count = 1

    def on_start(self) -> None:
        super().on_start()
        self.run_id = uuid.uuid4().hex[:8]
        self.pushes = 0
        # Made before the first push (importing torch and drawing the tensors
        # holds the whole process, every user of it, for a moment: at the
        # start, not in the middle of the run).
        self.weights = random_weights(self.info.parameters)

    def wait_time(self) -> float:
        return self.workload.push_every

    @task
    def push(self) -> None:
        modes = self.workload.pause_modes
        mode = modes[self.pushes % len(modes)]
        label = pb.PauseMode.Name(mode).removeprefix("PAUSE_MODE_")
        self.pushes += 1
        version = f"load-{self.run_id}-{self.pushes}"
        try:
            with self.report.call(UPDATE, f"push {label}"):
                ack = self.client.update_weights(self.weights, version, pause_mode=mode)
        except CallFailed:
            return
        self.report.watcher.acknowledged(ack.weight_version)
        self.report.fire(UPDATE, f"pause {label}", ack.timings.admission_closed_seconds)
