"""The HTTP front's server: uvicorn on the gRPC server's event loop, started
and stopped with it (server.py).

uvicorn's `serve` installs its own SIGINT/SIGTERM handlers for as long as it
runs; the process's handlers (server.py: the first signal stops in order, a
second hurries) must stay, so they are left alone here and the stop is
asked for by `stop`: no new connections, in-flight requests get the grace
period (`timeout_graceful_shutdown`), then the rest are cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl

import uvicorn

from rollout_service.http.front import Front
from rollout_service.http.routes import build_api

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        # The process's signal handlers are server.py's (module docstring).
        yield


class HttpServer:
    """uvicorn serving build_api(front) on host:port."""

    def __init__(self, front: Front, config) -> None:
        """`config`: the ServerConfig (--host, --http-port, --grace-seconds,
        --max-concurrent-rpcs, and the TLS files gRPC serves with)."""
        tls = {}
        if config.tls_cert:
            # The same certificate as gRPC: a bearer token never travels in
            # plaintext on one port and encrypted on the other.
            tls = {"ssl_certfile": config.tls_cert, "ssl_keyfile": config.tls_key}
            if config.tls_client_ca:
                tls |= {"ssl_ca_certs": config.tls_client_ca, "ssl_cert_reqs": ssl.CERT_REQUIRED}
        uv_config = uvicorn.Config(
            build_api(front),
            host=config.host,
            port=config.http_port,
            # Errors and refusals are logged by the error policy already.
            log_level="warning",
            access_log=False,
            lifespan="off",
            # Over it uvicorn answers 503 at once, as gRPC does past
            # --max-concurrent-rpcs with RESOURCE_EXHAUSTED.
            limit_concurrency=config.max_concurrent_rpcs,
            timeout_graceful_shutdown=max(1, round(config.grace_seconds)),
            **tls,
        )
        self._server = _Server(uv_config)
        self._task: asyncio.Task | None = None
        self._scheme = "https" if config.tls_cert else "http"
        self._host = config.host

    def url(self, port: int) -> str:
        """The root URL other machines reach it at (a session's base URL is
        under it): --host, or the machine's host name when --host is a
        wildcard address."""
        host = self._host
        if host in ("", "0.0.0.0", "::", "[::]"):
            host = socket.gethostname()
        elif ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"{self._scheme}://{host}:{port}"

    async def start(self) -> int:
        """Listens; returns the port (a free one for port 0). Raises OSError
        when it cannot bind."""
        self._task = asyncio.ensure_future(self._server.serve())
        while not self._server.started:
            if self._task.done():
                # uvicorn logs why (a port in use) and exits: not the process.
                with contextlib.suppress(SystemExit):
                    self._task.result()
                raise OSError("the HTTP server did not start (uvicorn's error is above)")
            await asyncio.sleep(0.01)
        [server] = self._server.servers
        return server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stops accepting, lets in-flight requests finish within the grace."""
        if self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(Exception):
            await self._task
