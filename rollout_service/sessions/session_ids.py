"""Session ids: which server issued one, on which of its runs, and so what
an id a caller sends means.

An id is `s<server>-<run>-<key>` (8, 8 and 24 hex digits):

- `server` names the server that issued it: a digest of its host name and
  listen address (--host and --port). A restart keeps both: Kubernetes
  restarts a StatefulSet's pod under its name and port
  (deploy/k8s/rollout-service.yaml), a supervisor or the tests restart a
  server at its port. Two servers never share them: on one host they listen
  on different ports (a busy port refuses to start, server.py), on two hosts
  the host names differ. The model is left out on purpose: a restart onto
  another checkpoint is still this server, and the caller's remedy is the
  same (open the session again from its copy). With --port 0 the address
  changes at every start, so the tag is random: every run is another server.
- `run` is random at each start: what a restart changes.
- `key` is random per session (96 bits: not guessable).

The tag is derived rather than configured because a server has no state
directory to keep an identity file in, and a --server-id flag would be one
more thing a deployment can get wrong (two replicas given one name); one
could still be added with this as its default.

`check` gives each id sent to this server one answer (NOT_FOUND every time:
no session of that id is here): not of this shape (SESSION_NOT_FOUND: not
an id this server issues); another server's (SESSION_NOT_FOUND, naming the
tag it carries); an earlier run of this server's (SESSION_LOST: the history
died with that run, open it again from the copy); this run's, which the
store then finds open or says why not (closed, expired: store.py).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import socket
from dataclasses import dataclass
from typing import Protocol

from rollout.v1 import rollout_pb2 as pb
from rollout_service.status.errors import NotFound, short_repr

_ID = re.compile(r"s([0-9a-f]{8})-([0-9a-f]{8})-[0-9a-f]{24}")
SHAPE = "s<8 hex digits>-<8 hex digits>-<24 hex digits>"


class Listening(Protocol):
    """Where a server listens: its ServerConfig (which sessions/ and rpc/,
    layers below it, may not import)."""

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...


@dataclass(frozen=True)
class SessionIds:
    """How one run of a server names its sessions."""

    # 8 hex digits each: the server's tag and this run's.
    server: str
    run: str
    # What the tag stands for ("127.0.0.1:50051 on rollout-0"), for messages.
    name: str

    @classmethod
    def listening(cls, at: Listening, hostname: str | None = None) -> SessionIds:
        """The ids of a new run of the server listening `at` (--host, --port)
        on `hostname` (default: this machine's)."""
        name = f"{at.host}:{at.port} on {hostname or socket.gethostname()}"
        if at.port == 0:
            server = secrets.token_hex(4)
        else:
            server = hashlib.sha256(name.encode()).hexdigest()[:8]
        return cls(server, secrets.token_hex(4), name)

    def issue(self) -> str:
        """A new session's id."""
        return f"s{self.server}-{self.run}-{secrets.token_hex(12)}"

    def check(self, session_id: str, field: str = "session_id") -> None:
        """Returns when `session_id` is one this run issued; raises NOT_FOUND
        saying whose it is otherwise."""
        match = _ID.fullmatch(session_id)
        if match is None:
            raise NotFound(
                f"{field}: {short_repr(session_id)} is not a session id this server issues "
                f"(its ids look like {SHAPE}, as OpenSession returns them)"
            )
        server, run = match.groups()
        if server != self.server:
            raise NotFound(
                f"{field}: session {session_id} was opened on another server (server "
                f"{server}; this is server {self.server}, {self.name}): a session's calls go "
                "to the server that opened it"
            )
        if run != self.run:
            raise NotFound(
                f"{field}: session {session_id} was opened on this server before it restarted "
                "(an earlier run); its history is gone: open it again from your copy",
                reason=pb.ERROR_REASON_SESSION_LOST,
            )
