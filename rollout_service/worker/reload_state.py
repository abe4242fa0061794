"""Undoing an interrupted vLLM layerwise reload, in the worker process.

vLLM's layerwise reload (`initialize_layerwise_reload`) moves every layer's
parameters to the meta device and buffers the tensors `load_weights` hands
it, processing a layer once all of its elements have arrived. If loading
fails half-way, that bookkeeping stays behind in vLLM's module-level
LAYERWISE_INFO: layers left on the meta device, wrapped weight loaders and
buffered views of the staging segment. The next `initialize_layerwise_reload`
skips such layers ("already initialized") and the next load replays the
stale views, then processes the layer before its new tensors have all
arrived: an acknowledged update over corrupted layers.

`discard()` puts every unfinished layer back on its kernel tensors (the
weights it was serving: a layer is only written when all of its elements
arrived) and clears the bookkeeping, so the next update starts clean.
Layers finished before the failure do hold the new weights: the server
treats the engine as degraded until a full update (see updates.py).
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


def discard(model: torch.nn.Module) -> int:
    """Abandons an unfinished layerwise reload; returns how many layers were
    put back. Safe to call when no reload is in progress."""
    from vllm.model_executor.model_loader.reload import layerwise

    from rollout_service.engine import vllm_compat

    restored = 0
    for layer in model.modules():
        info = layerwise.LAYERWISE_INFO.get(layer)
        if info is None or not info.can_load():
            continue
        vllm_compat.restore_layer(layer, info)
        info.reset()
        restored += 1
    layerwise.LOADING_LAYERS.clear()
    vllm_compat.restore_torchao_reload(model)
    if restored:
        log.warning("discarded an unfinished weight reload: %d layers put back", restored)
    return restored
