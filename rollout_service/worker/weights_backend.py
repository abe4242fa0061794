"""A vLLM weight-transfer backend that loads tensors from our staging region.

The server process stages an update's bytes in a POSIX shared-memory segment
(see `handoff/region.py`); each vLLM worker maps the same segment and hands zero-copy
tensor views of it to `model.load_weights`, inside vLLM's layerwise reload
(start_weight_update / finish_weight_update), which is the only way to load
checkpoint-format weights into a running engine on every platform.

vLLM runs the `vllm.general_plugins` entry point group (see pyproject.toml)
in every process it starts, so `register()` makes the backend known to the
worker processes with no other wiring.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from rollout_service.handoff import faults
from rollout_service.handoff.faults import FAULT_FILE_ENV
from rollout_service.handoff.region import SegmentReader
from rollout_service.handoff.staged_tensor import BACKEND_NAME, StagedTensor
from rollout_service.worker import reload_state


@dataclass
class ShmInitInfo(WeightTransferInitInfo):
    """Nothing to set up: the segment is named in each update."""


@dataclass
class ShmUpdateInfo(WeightTransferUpdateInfo):
    """Where each tensor of one update lies in the staging segment."""

    shm_name: str
    # StagedTensor.as_wire() of each tensor (see handoff/staged_tensor.py).
    tensors: list[dict[str, Any]] = field(default_factory=list)
    # Only the first rank reads the segment and broadcasts each tensor to
    # the others over the engine's own process group: what workers on other
    # hosts, which cannot open this host's /dev/shm, would need.
    broadcast: bool = False


class _WeightLoader(Protocol):
    """Every vLLM model has `load_weights` (vLLM's own loaders call it,
    model_loader/default_loader.py, 0.32.0); torch's Module does not declare it."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> object: ...


class ShmWeightTransferEngine(WeightTransferEngine[ShmInitInfo, ShmUpdateInfo]):
    """Loads checkpoint-format tensors from the server's staging segment."""

    init_info_cls = ShmInitInfo
    update_info_cls = ShmUpdateInfo

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reader = SegmentReader()

    def init_transfer_engine(self, init_info: ShmInitInfo) -> None:
        pass

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        # A reload that failed half-way must not be resumed: its layers would
        # replay stale views of the staging segment (see reload_state.py).
        reload_state.discard(self.model)
        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        try:
            finalize_layerwise_reload(self.model, self.model_config)
        except BaseException:
            reload_state.discard(self.model)
            raise

    def receive_weights(self, update_info: ShmUpdateInfo) -> None:
        specs = [StagedTensor.from_wire(t) for t in update_info.tensors]
        needed = max((t.offset + t.nbytes for t in specs), default=0)
        if update_info.broadcast:
            tensors = self._broadcast(update_info.shm_name, needed, specs)
        else:
            mm = self._reader.view(update_info.shm_name, needed)
            tensors = (tensor_view(mm, t) for t in specs)
        try:
            loading = tensors if _FAULT_FILE is None else _with_fault(tensors, _FAULT_FILE)
            cast(_WeightLoader, self.model).load_weights(loading)
        except BaseException:
            # Put unfinished layers back on the weights they were serving and
            # drop the buffered views; the server reports the engine degraded.
            reload_state.discard(self.model)
            raise

    def _broadcast(self, shm_name: str, needed: int, specs: list[StagedTensor]):
        """Rank 0 reads each tensor from the segment and sends it to every
        other rank over the engine's CPU process group, one tensor at a time,
        as `load_weights` asks for it (every rank asks in the same order)."""
        import torch.distributed as dist
        from vllm.distributed import get_world_group

        group = get_world_group()
        source = group.rank_in_group == 0
        mm = self._reader.view(shm_name, needed) if source else None
        for t in specs:
            if source:
                as_bytes = StagedTensor(t.name, "uint8", (t.nbytes,), t.offset, t.nbytes)
                _, flat = tensor_view(mm, as_bytes)
            else:
                flat = torch.empty(t.nbytes, dtype=torch.uint8)
            if t.nbytes:
                dist.broadcast(flat, src=group.ranks[0], group=group.cpu_group)
            yield t.name, flat.view(getattr(torch, t.dtype)).reshape(t.shape)

    def shutdown(self) -> None:
        self._reader.close()


def tensor_view(buf, t: StagedTensor) -> tuple[str, torch.Tensor]:
    """A zero-copy tensor over the staged bytes of `t` (any dtype torch
    knows, 0-d and empty tensors included)."""
    dtype = getattr(torch, t.dtype)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{t.name}: unknown dtype {t.dtype!r}")
    if t.nbytes == 0:  # frombuffer refuses a count of 0
        return t.name, torch.empty(t.shape, dtype=dtype)
    flat = torch.frombuffer(buf, dtype=torch.uint8, count=t.nbytes, offset=t.offset)
    return t.name, flat.view(dtype).reshape(t.shape)


# Fault testing only (handoff/faults.py): the workers read the variable once, at
# import; unset, a load never looks at a file. The gate's fault is not theirs.
_FAULT_FILE = faults.fault_file()


def _with_fault(named: Iterator[tuple[str, torch.Tensor]], path: str) -> Iterator:
    text = _stall(path)
    if text is None or text == faults.STALE_GATE:
        yield from named
        return
    after = int(text or 0)
    for i, item in enumerate(named):
        if i == after:
            break
        yield item
    raise RuntimeError(f"fault injected for tests after {after} tensors ({FAULT_FILE_ENV}={path})")


def _stall(path: str) -> str | None:
    """The fault file's content once it no longer says "stall" (None: absent)."""
    text = faults.read(path)
    if text == faults.STALL:
        with open(path, "w") as f:
            f.write(faults.STALLED)
    while text in (faults.STALL, faults.STALLED):
        time.sleep(0.02)
        text = faults.read(path)
    return text


def register() -> None:
    """Registers the backend with vLLM (the `vllm.general_plugins` hook)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(
            BACKEND_NAME, __name__, ShmWeightTransferEngine.__name__
        )
    except ValueError:
        pass  # already registered in this process
