"""Deprecated alias of rollout_client.fleet.replicas (the client's modules are
in packages by concern). Import rollout_client.fleet.replicas instead; this
alias goes in 0.3."""

from rollout_client._moved import alias

alias(__name__, "rollout_client.fleet.replicas")
