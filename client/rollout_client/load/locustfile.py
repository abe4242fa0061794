"""The locustfile: `locust -f` points here (`python -m rollout_client.load`
does it for you). Every user class is on offer; name some on the command line
to run only those, and set their weights with Locust's `--config-users`
(docs/load-testing.md).

gRPC's sync calls block in C, out of gevent's reach: without gRPC's gevent
mode one user's call would stop every other user of the process. Locust has
patched the standard library when it imports this file; gRPC's own mode must
follow before any channel is made.
"""

from __future__ import annotations

from typing import Any

import gevent  # type: ignore[import-untyped]  # no stubs; Locust brings it
import grpc.experimental.gevent as grpc_gevent
from locust import events

from rollout_client.load import options
from rollout_client.load.chat_agent import OpenAIAgentUser
from rollout_client.load.report import Report
from rollout_client.load.trainer import TrainerUser, preload
from rollout_client.load.users import AgentUser, GenerateUser, ManyUser, StreamUser

grpc_gevent.init_gevent()

# The default mix (weights; the trainer is one per run whatever they are).
GenerateUser.weight = 2
StreamUser.weight = 2
ManyUser.weight = 1
AgentUser.weight = 2
OpenAIAgentUser.weight = 2  # with --rollout-http-url only (`_init`)

__all__ = ["AgentUser", "GenerateUser", "ManyUser", "OpenAIAgentUser", "StreamUser", "TrainerUser"]


def _flags(parser: Any) -> None:
    options.add_flags(parser)


def _init(environment: Any, **_: Any) -> None:
    # The master needs the report too: it sums its workers' tokens.
    o = environment.parsed_options
    options.Workload.from_options(o)  # bad flags fail here, once
    # The OpenAI agent needs the server's HTTP front: it joins the mix when
    # --rollout-http-url says where that is, or when named on the command line.
    if not o.rollout_http_url and OpenAIAgentUser.__name__ not in (o.user_classes or ()):
        classes = environment.user_classes
        classes[:] = [u for u in classes if u is not OpenAIAgentUser]
    Report.of(environment)
    preload()  # before any user starts
    # Importing torch held gevent's loop without a tick: its cached clock is
    # that much behind, and Locust's --run-time timer, set next from it,
    # would end the run early by as long (seconds on a busy machine).
    gevent.get_hub().loop.update_now()


# Locust's EventHook.add_listener has no annotations: reached through Any.
_events: Any = events
_events.init_command_line_parser.add_listener(_flags)
_events.init.add_listener(_init)
