"""LoRA adapters: served by name, loaded, replaced or removed through the
update path (UpdateWeightsBegin.adapter).

An adapter update is validated like a base update, before the engine is
touched: the adapter's name and PEFT config (lora_config.py), and every
tensor's name, dtype and shape against the base module it adapts (lora_A
[r, in], lora_B [out, r], both or neither). The bytes are assembled in the
staging region as usual; values that are not finite are refused (vLLM loads
them as they are, and every logprob on the adapter is then NaN); then they
are written as a PEFT folder (adapter_config.json +
adapter_model.safetensors) under the server's adapter folder, and loaded
into the engine under a new LoRA id, while the old one keeps serving. If
vLLM refuses the adapter, nothing changed. Then, as one step inside the
quiesce (quiesce.py: gate closed, drained, engine paused): switch the name
to the new id, unload the old one, reset every cache, reopen. A call that
waited at the gate runs on the new adapter; one that names a removed adapter
is refused.

The base weights and their version are never touched by an adapter update.
The adapter folder is the server's own (rollout-lora-<pid>-*, in the
temporary directory) and is removed at shutdown (`close`).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass

from rollout.v1 import rollout_pb2 as pb
from rollout_codecs import dtypes
from rollout_service.handoff.region import StagingRegion
from rollout_service.status.errors import FailedPrecondition, InvalidArgument, short_repr
from rollout_service.update.lora_config import check_name, peft_config
from rollout_service.update.plan import AdapterConfig, Placement, Target, UpdatePlan, plan_update
from rollout_service.update.quiesce import Quiescer
from rollout_service.update.received import ReceivedUpdate
from rollout_service.update.timings import Arrival, ack_timings

log = logging.getLogger(__name__)

PEFT_PREFIX = "base_model.model."
_PARTS = (".lora_A.weight", ".lora_B.weight")
_FLOATS = (pb.D_TYPE_BFLOAT16, pb.D_TYPE_FLOAT16, pb.D_TYPE_FLOAT32)


@dataclass(frozen=True)
class Adapter:
    name: str
    int_id: int
    path: str
    version: str
    rank: int


class Adapters:
    """The adapters the engine serves, by name; the applier of adapter
    updates (the other applier is base_weights.BaseWeights)."""

    def __init__(
        self,
        engine,
        base_manifest: dict[str, pb.TensorSpec],
        quiescer: Quiescer,
        incoming: StagingRegion,
        max_update_bytes: int,
    ) -> None:
        self.engine = engine
        self.quiescer = quiescer
        # Adapter updates are packed in the incoming region, never in the
        # slots of the base weights.
        self.incoming = incoming
        self.max_update_bytes = max_update_bytes
        lc = engine.vllm_config.lora_config
        self.enabled = lc is not None
        self.limits = pb.LoraLimits(enabled=self.enabled)
        if lc is not None:
            self.limits.max_rank = lc.max_lora_rank
            self.limits.max_loras = lc.max_loras
            self.limits.max_loaded = lc.max_cpu_loras or lc.max_loras
        self._base = base_manifest
        self._loaded: dict[str, Adapter] = {}
        self._ids = itertools.count(1)
        self._root: str | None = None

    # -- serving ------------------------------------------------------------

    def _require_enabled(self, field: str) -> None:
        if not self.enabled:
            raise InvalidArgument(field, "LoRA is off on this server; start it with --enable-lora")

    def check_known(self, name: str) -> None:
        """Refuses a Generate naming no loaded adapter."""
        self._require_enabled("lora_adapter")
        check_name(name, "lora_adapter")
        if name not in self._loaded:
            loaded = ", ".join(sorted(self._loaded)) or "none"
            raise InvalidArgument(
                "lora_adapter", f"no adapter {short_repr(name)} is loaded (loaded: {loaded})"
            )

    def request_for(self, name: str):
        """The engine's LoRARequest for a call admitted just now."""
        from vllm.lora.request import LoRARequest

        a = self._loaded.get(name)
        if a is None:
            raise FailedPrecondition(
                f"lora_adapter: {short_repr(name)} was removed while the call waited",
                reason=pb.ERROR_REASON_ADAPTER_REMOVED,
            )
        return LoRARequest(lora_name=a.name, lora_int_id=a.int_id, lora_path=a.path)

    def close(self) -> None:
        """Removes the adapter folder (at shutdown, after the engine)."""
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def version_of(self, name: str) -> str:
        a = self._loaded.get(name)
        return a.version if a is not None else ""

    def listing(self) -> list[pb.LoraAdapter]:
        return [
            pb.LoraAdapter(name=a.name, weight_version=a.version, rank=a.rank)
            for a in sorted(self._loaded.values(), key=lambda a: a.name)
        ]

    # -- validating an update -----------------------------------------------

    async def region_free(self) -> None:
        """The incoming region is free once the update before has ended
        (one update at a time, update/transfers.py)."""

    def plan(self, begin: pb.UpdateWeightsBegin) -> UpdatePlan:
        """Validates begin.adapter, then the update against the adapter's
        tensors (plan.py)."""
        return plan_update(
            begin,
            self._target(begin),
            Placement(self.incoming),
            self.max_update_bytes,
        )

    def _target(self, begin: pb.UpdateWeightsBegin) -> Target:
        """What begin.adapter may write: its tensors, shaped by the base modules."""
        t = begin.adapter
        self._require_enabled("begin.adapter")
        check_name(t.name, "begin.adapter.name")
        if begin.pause_mode == pb.PAUSE_MODE_KEEP:
            raise InvalidArgument(
                "begin.pause_mode", "PAUSE_MODE_KEEP applies to base updates only"
            )
        current = self._loaded.get(t.name)
        version = current.version if current is not None else ""
        if t.action == pb.ADAPTER_ACTION_REMOVE:
            if current is None:
                raise InvalidArgument(
                    "begin.adapter.name", f"no adapter {short_repr(t.name)} is loaded"
                )
            if begin.tensors or t.config_json:
                raise InvalidArgument("begin.tensors", "a removal carries no tensors and no config")
            return Target({}, version, allow_empty=True, adapter=AdapterConfig({}, 0))
        config, rank = peft_config(t.config_json, self.limits.max_rank)
        manifest: dict[str, pb.TensorSpec] = {}
        modules: dict[str, list[str]] = {}
        for i, spec in enumerate(begin.tensors):
            where = f"begin.tensors[{i}]"
            part = next((p for p in _PARTS if spec.name.endswith(p)), None)
            if not spec.name.startswith(PEFT_PREFIX) or part is None:
                raise InvalidArgument(
                    f"{where}.name",
                    f"{short_repr(spec.name)} is not a PEFT LoRA tensor name "
                    f"({PEFT_PREFIX}<module>.lora_A.weight or .lora_B.weight)",
                )
            module = spec.name[len(PEFT_PREFIX) : -len(part)]
            base = self._base.get(module + ".weight")
            if base is None or len(base.shape) != 2:
                raise InvalidArgument(
                    f"{where}.name",
                    f"{short_repr(module)} is not a linear module of the served model",
                )
            if spec.dtype not in _FLOATS:
                raise InvalidArgument(
                    f"{where}.dtype",
                    f"{short_repr(spec.name)}: got {dtypes.name(spec.dtype)}; adapters take "
                    "bfloat16, float16 or float32",
                )
            out_f, in_f = base.shape
            shape = [rank, in_f] if part == _PARTS[0] else [out_f, rank]
            manifest[spec.name] = pb.TensorSpec(name=spec.name, dtype=spec.dtype, shape=shape)
            modules.setdefault(module, []).append(spec.name)
        # Both parts of a module or neither: each name maps to its module's pair.
        pairs = [[PEFT_PREFIX + m + p for p in _PARTS] for m in modules]
        groups = {n: pair for pair in pairs for n in pair}
        return Target(manifest, version, groups=groups, adapter=AdapterConfig(config, rank))

    # -- applying -----------------------------------------------------------

    @staticmethod
    def _tensors(staged, buf) -> dict:
        """The adapter's tensors, copied out of the staging region; refused
        if any value is NaN or infinite."""
        import torch

        tensors = {}
        for i, t in enumerate(staged.tensors):
            view = buf[t.offset : t.offset + t.nbytes]
            x = torch.frombuffer(view, dtype=getattr(torch, t.dtype)).reshape(t.shape).clone()
            if not bool(torch.isfinite(x).all()):
                raise InvalidArgument(
                    f"begin.tensors[{i}]",
                    f"{short_repr(t.name)} holds NaN or infinite values; an adapter's "
                    "values must be finite",
                )
            tensors[t.name] = x
        return tensors

    def _write(self, name: str, tensors: dict, config: dict) -> str:
        """The adapter as a PEFT folder under the server's adapter folder
        (`name` passed check_name: it cannot lead out of it)."""
        from safetensors.torch import save_file

        if self._root is None:
            self._root = tempfile.mkdtemp(prefix=f"rollout-lora-{os.getpid()}-")
        path = tempfile.mkdtemp(prefix=f"{name}-", dir=self._root)
        save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
        with open(os.path.join(path, "adapter_config.json"), "w") as f:
            json.dump(config, f)
        return path

    async def apply(self, staged: ReceivedUpdate, arrival: Arrival) -> pb.UpdateWeightsResponse:
        """Loads (beside the old one), then switches inside the quiesce
        (quiesce.py): drained, the engine paused, every cache reset after.
        A cancelled call does not cut the switch in half: the commit shields
        it (transfers.py)."""
        return await self._load_and_switch(staged, arrival)

    async def _load_and_switch(
        self, staged: ReceivedUpdate, arrival: Arrival
    ) -> pb.UpdateWeightsResponse:
        from vllm.lora.request import LoRARequest

        t = staged.begin.adapter
        plan = staged.plan.target.adapter
        assert plan is not None  # _target gives every adapter update its config
        t0 = time.perf_counter()
        new = None
        if t.action != pb.ADAPTER_ACTION_REMOVE:
            tensors = self._tensors(staged, staged.region.ensure(0))
            path = self._write(t.name, tensors, plan.peft)
            new = Adapter(t.name, next(self._ids), path, staged.weight_version, plan.rank)
            try:
                await self.engine.add_lora(LoRARequest(new.name, new.int_id, new.path))
            except Exception as e:
                shutil.rmtree(path, ignore_errors=True)
                raise InvalidArgument(
                    "begin.adapter", f"the engine refused the adapter ({type(e).__name__}: {e})"
                ) from e
        t_switch = time.perf_counter()
        async with self.quiescer.quiesced(staged.pause_mode, staged.drain_timeout_seconds) as q:
            old = self._loaded.pop(t.name, None)
            if new is not None:
                self._loaded[t.name] = new
            if old is not None:
                await self.engine.remove_lora(old.int_id)
                shutil.rmtree(old.path, ignore_errors=True)
            await self.quiescer.reset(q)
        t_end = time.perf_counter()
        log.info(
            "adapter %r: %r -> %r (%d tensors)",
            t.name,
            old.version if old else "",
            new.version if new else "(removed)",
            len(staged.tensors),
        )
        return pb.UpdateWeightsResponse(
            weight_version=staged.weight_version,
            previous_weight_version=old.version if old else "",
            bytes_received=staged.bytes_received,
            tensors_loaded=len(staged.tensors),
            caches_reset=q.results,
            # The adapter loads beside the served one, before the quiesce:
            # load_seconds is outside apply_seconds here.
            timings=ack_timings(arrival, q, t_end, load_s=t_switch - t0),
            requests_aborted=q.aborted,
        )
