"""The plugin's settings, read from verl's `actor_rollout_ref.rollout.custom`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_TARGET = "127.0.0.1:50051"
NAME = "rollout_service"  # actor_rollout_ref.rollout.name
# The Ray actor name of replica r's server: f"{SERVER_PREFIX}{r}{suffix}".
SERVER_PREFIX = f"{NAME}_server_"
ADAPTER = "rollout_client.verl.adapter.ServiceRollout"
PAUSE_MODES = {"wait", "abort", "keep"}


@dataclass(frozen=True)
class Settings:
    """`targets`: one service, or several serving the same model (weights go
    to all of them as one Fleet update; generations are spread over them).
    `token`: a bearer token (admin: it pushes weights). `timeout`: each
    call's deadline, seconds. `version_prefix`: the pushed version is
    f"{version_prefix}{global_steps}" (default: "verl-" and a run id made by
    the leader rank, then "-step-": a version must be unique for the
    server's lifetime). `delta`: push every step after the first as a delta
    against the one before. `streams`: connections one push uploads over.
    `pause_mode`: what a push does to calls running at the service (the
    service's pause modes): "abort" ends them with their tokens and verl's
    fully-async client resumes them on the new weights; "keep" carries them
    over to the new weights (refused by a server on a model that takes
    images); "wait" lets them finish first (a push then waits for the
    longest call, up to the server's drain timeout)."""

    targets: tuple[str, ...] = (DEFAULT_TARGET,)
    token: str | None = None
    timeout: float = 600.0
    version_prefix: str | None = None
    delta: bool = False
    streams: int = 1
    pause_mode: str = "abort"

    @classmethod
    def from_custom(cls, custom: Mapping[str, Any] | None) -> Settings:
        c = dict(custom or {})
        target = c.pop("target", c.pop("targets", DEFAULT_TARGET))
        if isinstance(target, str):
            targets = tuple(t.strip() for t in target.split(",") if t.strip())
        else:
            targets = tuple(str(t) for t in target)
        if not targets:
            raise ValueError("rollout.custom.target names no service")
        s = cls(
            targets=targets,
            token=c.pop("token", None),
            timeout=float(c.pop("timeout", 600.0)),
            version_prefix=c.pop("version_prefix", None),
            delta=bool(c.pop("delta", False)),
            streams=int(c.pop("streams", 1)),
            pause_mode=str(c.pop("pause_mode", "abort")),
        )
        if s.pause_mode not in PAUSE_MODES:
            raise ValueError(
                f"rollout.custom.pause_mode must be one of {sorted(PAUSE_MODES)}, "
                f"not {s.pause_mode!r}"
            )
        if c:
            raise ValueError(f"unknown rollout.custom key(s) for rollout_service: {sorted(c)}")
        return s

    @classmethod
    def from_rollout_config(cls, config: Any) -> Settings:
        """From verl's RolloutConfig (dataclass or DictConfig)."""
        custom = getattr(config, "custom", None)
        if custom is not None and not isinstance(custom, Mapping):
            raise TypeError(f"rollout.custom must be a mapping, not {type(custom).__name__}")
        if custom is not None and hasattr(custom, "items"):
            custom = {str(k): _plain(v) for k, v in custom.items()}
        return cls.from_custom(custom)

    def client_options(self) -> dict[str, Any]:
        return {} if self.token is None else {"token": self.token}


def _plain(value: Any) -> Any:
    """An OmegaConf list as a Python list (the rest as is)."""
    if (
        not isinstance(value, str | bytes)
        and hasattr(value, "__iter__")
        and not hasattr(value, "items")
    ):
        return list(value)
    return value
