"""The `vllm.general_plugins` hook (see pyproject.toml).

vLLM runs this in every process it starts (engine core, workers, the model
registry's inspection subprocess), which is the only place where code of ours
reaches all of them.
"""

from __future__ import annotations


def register() -> None:
    """Registers the staging-region weight-transfer backend, and lets LLaVA
    import without torchvision."""
    from rollout_service.tiny_models import install_pixtral_alias
    from rollout_service.weights_backend import register as register_backend

    install_pixtral_alias()
    register_backend()
