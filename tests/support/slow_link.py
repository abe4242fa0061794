"""A slower link than loopback, for tests where what a transport costs
decides (delta or full push): a TCP proxy on 127.0.0.1 that forwards to a
server, the client-to-server direction at most `rate` bytes per second (the
way back as fast as it comes). gRPC's HTTP/2 passes through it untouched."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

CHUNK = 16 * 1024


def _pump(src: socket.socket, dst: socket.socket, rate: float | None) -> None:
    start, sent = time.monotonic(), 0
    try:
        while data := src.recv(CHUNK):
            dst.sendall(data)
            if rate is not None:
                sent += len(data)
                ahead = sent / rate - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)
                elif ahead < -0.05:  # idle for a while: no burst allowance
                    start, sent = time.monotonic(), 0
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def slow_link(target: str, rate: float) -> Iterator[str]:
    """A proxy to `target` ("host:port"); yields its own "host:port"."""
    host, port = target.rsplit(":", 1)
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection((host, int(port)))
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=_pump, args=(client, upstream, rate), daemon=True).start()
            threading.Thread(target=_pump, args=(upstream, client, None), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()
