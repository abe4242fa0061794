"""Methods this service adds to vLLM's workers (vLLM's `worker_extension_cls`),
called through `AsyncLLM.collective_rpc` by name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from torch import nn
    from vllm.distributed.weight_transfer.base import WeightTransferEngine


class _Worker(Protocol):
    """What the methods below use of the worker they are mixed into (vLLM
    0.32.0's `Worker`, vllm/v1/worker/gpu_worker.py; the CPU worker inherits it)."""

    weight_transfer_engine: WeightTransferEngine | None

    def get_model(self) -> nn.Module: ...


class RolloutWorkerExtension:
    """Mixed into vLLM's Worker class; `self` is the worker."""

    def rollout_parameter_groups(self: _Worker, names: list[str]) -> dict[str, list[str]]:
        """Checkpoint tensors that load into one module (param_groups.py)."""
        from rollout_service.worker.param_groups import model_groups

        return model_groups(self.get_model(), names)

    def rollout_abandon_weight_update(self: _Worker) -> int:
        """Ends a weight update that failed half-way, leaving no reload state
        behind (reload_state.py), so the next update starts clean. vLLM's
        worker clears its own "update active" flag when loading raises, but
        not when finishing raises; both are cleared here."""
        from rollout_service.engine import vllm_compat
        from rollout_service.worker.reload_state import discard

        restored = discard(self.get_model())
        vllm_compat.clear_weight_update_flag(self)
        if self.weight_transfer_engine is not None:
            self.weight_transfer_engine.reset_weight_update_target()
        return restored
