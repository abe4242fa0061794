"""A vLLM weight-transfer backend that loads tensors from our staging region.

The server process stages an update's bytes in a POSIX shared-memory segment
(see `staging.py`); each vLLM worker maps the same segment and hands zero-copy
tensor views of it to `model.load_weights`, inside vLLM's layerwise reload
(start_weight_update / finish_weight_update), which is the only way to load
checkpoint-format weights into a running engine on every platform.

vLLM runs the `vllm.general_plugins` entry point group (see pyproject.toml)
in every process it starts, so `register()` makes the backend known to the
worker processes with no other wiring.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

BACKEND_NAME = "rollout_shm"

_TORCH_DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}


@dataclass
class ShmInitInfo(WeightTransferInitInfo):
    """Nothing to set up: the segment is named in each update."""


@dataclass
class ShmUpdateInfo(WeightTransferUpdateInfo):
    """Where each tensor of one update lies in the staging segment."""

    shm_name: str
    # One dict per tensor: name, dtype (a key of _TORCH_DTYPES), shape,
    # offset and nbytes inside the segment.
    tensors: list[dict[str, Any]] = field(default_factory=list)


class _Mapping:
    """A mapping of a named shared-memory segment (read, never written).

    Opened through /dev/shm directly rather than
    multiprocessing.shared_memory: on Python < 3.13 attaching through the
    latter registers the segment with this process's resource tracker, which
    would unlink the server's segment when the worker exits.
    """

    def __init__(self, name: str) -> None:
        # Mapped writable only because torch.frombuffer warns on read-only
        # buffers; the worker never writes to it.
        fd = os.open(f"/dev/shm/{name.lstrip('/')}", os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.name = name
        self.size = size


class ShmWeightTransferEngine(WeightTransferEngine[ShmInitInfo, ShmUpdateInfo]):
    """Loads checkpoint-format tensors from the server's staging segment."""

    init_info_cls = ShmInitInfo
    update_info_cls = ShmUpdateInfo

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._mapping: _Mapping | None = None

    def init_transfer_engine(self, init_info: ShmInitInfo) -> None:
        pass

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def _segment(self, name: str, needed: int) -> mmap.mmap:
        # The server reuses one segment between updates; remap only when it
        # was replaced (a new name) or grown.
        m = self._mapping
        if m is None or m.name != name or m.size < needed:
            self._mapping = m = _Mapping(name)
        return m.mm

    def receive_weights(self, update_info: ShmUpdateInfo) -> None:
        _maybe_inject_fault()
        specs = update_info.tensors
        needed = max((t["offset"] + t["nbytes"] for t in specs), default=0)
        mm = self._segment(update_info.shm_name, needed)
        named = []
        for t in specs:
            dtype = _TORCH_DTYPES[t["dtype"]]
            flat = torch.frombuffer(mm, dtype=torch.uint8, count=t["nbytes"], offset=t["offset"])
            named.append((t["name"], flat.view(dtype).view(*t["shape"])))
        self.model.load_weights(named)

    def shutdown(self) -> None:
        self._mapping = None


# Tests set this to a path; while a file exists there, loading fails, which
# is the only way to exercise the degraded state against a real engine.
FAULT_FILE_ENV = "ROLLOUT_SERVICE_FAULT_FILE"


def _maybe_inject_fault() -> None:
    path = os.environ.get(FAULT_FILE_ENV)
    if path and os.path.exists(path):
        raise RuntimeError(f"fault injected for tests ({FAULT_FILE_ENV}={path})")


def register() -> None:
    """Registers the backend with vLLM (the `vllm.general_plugins` hook)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(
            BACKEND_NAME, __name__, ShmWeightTransferEngine.__name__
        )
    except ValueError:
        pass  # already registered in this process
