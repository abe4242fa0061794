"""The `vllm.general_plugins` hook (see pyproject.toml).

vLLM runs this in every process it starts (engine core, workers, the model
registry's inspection subprocess), which is the only place where code of ours
reaches all of them. Not quite: a process vLLM *forks* inherits the "plugins
loaded" flag from its parent and skips it; what it needs it inherits too
(parent_watch.py explains how its watcher reaches forked processes).
"""

from __future__ import annotations

import logging
import re

# vLLM lines that are noise for this service, by the logger that emits them
# and a pattern their whole message must match (read from vLLM 0.32). The
# logger's other lines pass, so a real warning of the same logger still shows.
NOISE = {
    # After every weight update, layerwise reload warns for each module that
    # has loadable tensors none of which came in the update. A rotary
    # embedding's only one is its cos/sin cache, computed from the config and
    # in no checkpoint: it warned on every update, a full one included. The
    # same warning for any other module stays (after a partial update, the
    # modules it left out; after a full one, a tensor sent but not loaded).
    "vllm.model_executor.model_loader.reload.layerwise": re.compile(
        r"\w*RotaryEmbedding: Failed to load weights"
    ),
}


class _DropNoise(logging.Filter):
    def __init__(self, pattern: re.Pattern[str]) -> None:
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return self.pattern.fullmatch(record.getMessage()) is None


def quiet_noise() -> None:
    """Drops the NOISE lines in this process, once (a forked child inherits
    the filters). On the loggers themselves, not on handlers: vLLM sets up
    its own handlers, in each of its processes."""
    for name, pattern in NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNoise) for f in logger.filters):
            logger.addFilter(_DropNoise(pattern))


def register() -> None:
    """Registers the staging-region weight-transfer backend, lets LLaVA
    import without torchvision, drops vLLM's log lines that are noise for
    this service (NOISE), and, in an engine process that was spawned, ends it
    when its parent dies, makes it fork its own children (worker_fork.py)
    and makes its exit skip the final collection (quick_exit.py)."""
    from rollout_service.engine import parent_watch, quick_exit, vllm_compat, worker_fork
    from rollout_service.engine.tiny_models import install_pixtral_alias
    from rollout_service.worker.weights_backend import register as register_backend

    install_pixtral_alias()
    quiet_noise()
    register_backend()
    vllm_compat.unlink_cpu_shm_once_joined()  # before the workers fork: they inherit it
    worker_fork.in_engine_process()  # first: its at-fork hook binds the CPUs
    parent_watch.start_in_spawned_child()
    quick_exit.in_spawned_child()
