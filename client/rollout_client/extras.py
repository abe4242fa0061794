"""Deprecated alias of rollout_codecs.extras (moved there so that the server
and the client share the codecs without the server importing the client's
internals). Import rollout_codecs.extras instead; this alias goes in 0.3."""

from rollout_client._moved import alias

alias(__name__, "rollout_codecs.extras")
