"""Weight updates pushed while generation load runs (`load.py --update-every`).

An RL trainer pushes new weights into a server that is busy generating; what
matters is how long each update takes, how long admission of new Generate
calls stays closed, and what the update does to generation latency around
it. The pusher uses its own channel with a local subchannel pool, so its bytes
travel on a separate connection from the generation traffic.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import asdict, dataclass

import grpc
import numpy as np

from benchmarks.lib.loadgen import RunResult
from rollout.v1 import rollout_pb2 as pb
from rollout.v1 import rollout_pb2_grpc
from rollout_client.client import ConnectionOptions
from rollout_client.weights import push

PAUSE_MODES = {"wait": pb.PAUSE_MODE_WAIT, "abort": pb.PAUSE_MODE_ABORT}


def random_bf16_weights(parameters, seed: int = 0, std: float = 0.02) -> dict:
    """A full set of random bf16 tensors for the manifest (norms near one so
    the model stays numerically sane)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = {}
    for p in parameters:
        t = torch.randn([int(d) for d in p.shape], generator=g) * std
        if "norm" in p.name:
            t += 1.0
        out[p.name] = t.to(torch.bfloat16)
    return out


@dataclass
class UpdateRecord:
    """One UpdateWeights as the pusher saw it (perf_counter seconds)."""

    version: str
    start: float
    end: float
    error: str | None = None
    bytes: int = 0
    receive_seconds: float = 0.0
    apply_seconds: float = 0.0
    admission_closed_seconds: float = 0.0


class UpdatePusher:
    """Pushes the same full set of tensors, under a new version, every
    `every` seconds from `first_at` until stopped (an update in progress then
    completes, so no update is ever cut off by the end of the run)."""

    def __init__(
        self,
        target: str,
        every: float,
        pause_mode: str = "wait",
        seed: int = 0,
        connection: ConnectionOptions | None = None,
    ):
        self.target, self.every, self.seed = target, every, seed
        self.pause_mode = PAUSE_MODES[pause_mode]
        connection = connection or ConnectionOptions()
        self.metadata = connection.metadata()
        self.channel = connection.channel(target, aio=True, own_connection=True)
        self.stub = rollout_pb2_grpc.RolloutServiceStub(self.channel)
        self.weights: dict = {}
        # Serialized requests (see push.py): no protobuf serializer.
        self._update_weights = self.channel.stream_unary(
            push.UPDATE_WEIGHTS,
            request_serializer=None,
            response_deserializer=pb.UpdateWeightsResponse.FromString,
        )
        self.updates: list[UpdateRecord] = []
        self._stop = asyncio.Event()

    async def prepare(self) -> int:
        """Builds the tensors from the server's manifest; returns their bytes."""
        info = await self.stub.GetServerInfo(
            pb.GetServerInfoRequest(), timeout=30, metadata=self.metadata
        )
        if not info.parameters:
            raise SystemExit("the server's manifest is empty: it accepts no weight updates")
        self.manifest = info.parameters
        self.weights = random_bf16_weights(info.parameters, self.seed)
        return sum(t.numel() * t.element_size() for t in self.weights.values())

    async def _requests(self, version: str):
        """The update stream, yielding to the event loop between chunks so
        that the generation load keeps being served by this process."""
        u = push.prepare(self.weights, version, self.manifest, pause_mode=self.pause_mode)
        for msg in push.update_weights_requests(u):
            yield msg
            await asyncio.sleep(0)

    async def push_one(self) -> UpdateRecord:
        version = f"bench-{uuid.uuid4().hex[:8]}"
        start = time.perf_counter()
        try:
            ack = await self._update_weights(
                self._requests(version), timeout=600, metadata=self.metadata
            )
        except grpc.aio.AioRpcError as e:
            return UpdateRecord(version, start, time.perf_counter(), error=e.code().name)
        t = ack.timings
        return UpdateRecord(
            version,
            start,
            time.perf_counter(),
            bytes=ack.bytes_received,
            receive_seconds=t.receive_seconds,
            apply_seconds=t.apply_seconds,
            admission_closed_seconds=t.admission_closed_seconds,
        )

    async def run(self, first_at: float) -> None:
        """Pushes on schedule; an update in progress when stopped completes."""
        due = first_at
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), max(due - time.perf_counter(), 0))
                break
            except TimeoutError:
                pass
            self.updates.append(await self.push_one())
            due = max(due + self.every, time.perf_counter())

    def stop(self) -> None:
        self._stop.set()

    async def close(self) -> None:
        await self.channel.close()


def _p50(values: list[float]) -> float | None:
    return float(np.percentile(values, 50)) if values else None


def analyse(updates: list[UpdateRecord], result: RunResult, window: float = 2.0) -> list[dict]:
    """Per update: its timings, and the p50 latency of generation requests
    that ended in the `window` seconds before it started vs. those that
    ended in the `window` seconds after it was acknowledged."""
    ok = [r for r in result.records if r.error is None]
    rows = []
    for u in updates:
        before = [r.end - r.start for r in ok if u.start - window <= r.end < u.start]
        after = [r.end - r.start for r in ok if u.end < r.end <= u.end + window]
        overlapping = [r for r in result.records if r.start < u.end and r.end > u.start]
        fields = asdict(u)
        del fields["start"], fields["end"]  # perf_counter values mean nothing outside
        rows.append(
            {
                **fields,
                "at_seconds": u.start - result.t0,
                "duration_seconds": u.end - u.start,
                "latency_p50_before": _p50(before),
                "latency_p50_after": _p50(after),
                "requests_before": len(before),
                "requests_after": len(after),
                "overlapping_errors": sum(r.error is not None for r in overlapping),
            }
        )
    return rows


def _fmt_ms(seconds: float | None) -> str:
    return "   n/a" if seconds is None else f"{seconds * 1000:6.1f}"


def format_updates(rows: list[dict], window: float = 2.0) -> str:
    """A table, one line per update, and the error count (expected zero)."""
    head = (
        f"  {'#':>3} {'version':<14} {'total ms':>9} {'admission ms':>12} "
        f"{'p50 before':>10} {'p50 after':>10}  (generation latency, {window:g} s windows)"
    )
    lines = ["weight updates under load", head]
    for i, r in enumerate(rows):
        status = f"  ERROR {r['error']}" if r["error"] else ""
        lines.append(
            f"  {i:>3} {r['version']:<14} {r['duration_seconds'] * 1000:9.1f} "
            f"{r['admission_closed_seconds'] * 1000:12.1f} "
            f"{_fmt_ms(r['latency_p50_before']):>10} {_fmt_ms(r['latency_p50_after']):>10}{status}"
        )
    failed = sum(r["error"] is not None for r in rows)
    lines.append(f"  {len(rows)} updates, {failed} failed (expected 0)")
    return "\n".join(lines)
