"""The `vllm.general_plugins` hook (see pyproject.toml).

vLLM runs this in every process it starts (engine core, workers, the model
registry's inspection subprocess), which is the only place where code of ours
reaches all of them. Not quite: a process vLLM *forks* inherits the "plugins
loaded" flag from its parent and skips it; what it needs it inherits too
(parent_watch.py explains how its watcher reaches forked processes).
"""

from __future__ import annotations


def register() -> None:
    """Registers the staging-region weight-transfer backend, lets LLaVA
    import without torchvision, and, in an engine process that was spawned,
    ends it when its parent dies and makes it fork its own children
    (worker_fork.py)."""
    from rollout_service.engine import parent_watch, worker_fork
    from rollout_service.engine.tiny_models import install_pixtral_alias
    from rollout_service.worker.weights_backend import register as register_backend

    install_pixtral_alias()
    register_backend()
    worker_fork.in_engine_process()  # first: its at-fork hook binds the CPUs
    parent_watch.start_in_spawned_child()
