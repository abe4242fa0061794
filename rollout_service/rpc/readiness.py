"""What the gRPC handlers serve with, and the one place readiness is
enforced.

The handlers are registered before the server starts (gRPC takes no
handlers later) and the port answers health while the engine starts, so
the App does not exist yet when they are made. `Serving` holds it: empty
until `start`, then the App and the pipeline over it. Every RPC reaches
them only through `Serving.ready`, which answers STARTING before the engine
is up, SHUTTING_DOWN once a signal stops the server and ENGINE_DEAD once the
engine has died: no RPC can forget the check, and none runs on half of the
App.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.pipeline.calls import RunningCalls
from rollout_service.pipeline.generations import Generations
from rollout_service.pipeline.many import StreamLimits
from rollout_service.pipeline.serving import App
from rollout_service.pipeline.session_turns import SessionTurns
from rollout_service.rpc.handlers import Ending
from rollout_service.sessions.session_ids import SessionIds
from rollout_service.status.errors import Unavailable, engine_dead


@dataclass(frozen=True)
class Ready:
    """A running engine's App and the pipeline over it."""

    app: App
    generations: Generations
    turns: SessionTurns


class Serving:
    """The handlers' one way to the App (module docstring)."""

    def __init__(self, config: Any) -> None:
        # The ServerConfig (config.py is a layer above rpc/).
        self.config = config
        # Abort finds every front's calls here, from their first line.
        self.calls = RunningCalls()
        # Every running call (handlers.py), for ending them when the server stops.
        self.ending = Ending()
        # The HTTP front's root URL once it listens (server.py; "" without
        # --http-port): OpenSession answers each session's base URL under it.
        self.http_url = ""
        self._ready: Ready | None = None

    def start(self, app: App) -> None:
        """Serves on a running engine (app.py built what it holds)."""
        config = self.config
        limits = StreamLimits.for_server(
            config.max_generations_per_stream,
            config.max_stream_tokens,
            config.max_message_bytes,
            app.info.limits.max_model_len,
        )
        generations = Generations(app, self.calls, limits)
        # This run's session ids, named for the address it listens on
        # (session_ids.py says why that, and not a random name).
        ids = SessionIds.listening(config)
        self._ready = Ready(app, generations, SessionTurns(generations, ids))

    @property
    def ready(self) -> Ready:
        """The App and pipeline, once started and alive; UNAVAILABLE before
        (STARTING) and after (SHUTTING_DOWN, ENGINE_DEAD)."""
        ready = self._ready
        if ready is None:
            raise Unavailable(
                "the engine is starting; wait for health SERVING", reason=pb.ERROR_REASON_STARTING
            )
        # The server is stopping (a signal, or it saw the engine die): a call
        # arriving now is refused UNAVAILABLE (SHUTTING_DOWN, ENGINE_DEAD), not
        # left to run into the end of the process.
        if self.ending.refusal is not None:
            raise self.ending.refusal()
        if ready.app.engine.errored:
            raise engine_dead()
        return ready
