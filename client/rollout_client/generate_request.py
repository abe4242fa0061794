"""Deprecated alias of rollout_client.calls.generate_request (the client's modules are
in packages by concern). Import rollout_client.calls.generate_request instead; this
alias goes in 0.3."""

from rollout_client._moved import alias

alias(__name__, "rollout_client.calls.generate_request")
