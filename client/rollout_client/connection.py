"""How a client reaches the server: channels, auth, TLS, size limits and the
retry policy, the same for the sync and the asyncio client; and the error
both raise."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import grpc

# Leaves room for a 1 MiB chunk plus framing; the server's default is larger.
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20

SERVICE = "rollout.v1.RolloutService"

# The calls gRPC sends again after UNAVAILABLE (server starting, restarting or
# shutting down): unary calls that either did not run or change nothing when
# run twice. A method added to the service is retried only once it is listed
# here. Client streams are not (UpdateWeights, UploadChunks: gRPC would have to
# buffer the whole stream), nor the staged-update calls: a whole update is
# retried instead (RolloutClient._push says why that is safe).
RETRIED_METHODS = ("Generate", "GetServerInfo", "ResetCaches")

# gRPC makes at most 5 attempts, whatever the policy says (gRFC A6).
MAX_RETRIES = 4
# gRPC spreads each retry's delay over +-20% of its nominal value; the policy's
# nominal backoff is set this much higher, so that no wait is shorter than
# `backoff * 2**i` (what ConnectionOptions has always promised).
_JITTER = 0.2


class RolloutError(Exception):
    """A failed call: `code` is the grpc.StatusCode, `details` the server's message."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details

    @classmethod
    def wrap(cls, e: grpc.RpcError) -> RolloutError:
        return cls(e.code(), e.details() or "")


@dataclass(frozen=True)
class ConnectionOptions:
    """How to reach the server: size limits, auth, TLS, retries.

    `token` is sent as `authorization: Bearer <token>` on every call. TLS is on
    when `root_certificates` is given (PEM bytes); add `certificate_chain` and
    `private_key` for mutual TLS. Unary calls that fail with UNAVAILABLE (server
    starting, restarting, shutting down) are retried `retries` times (at most
    4, gRPC's limit) with exponential backoff from `backoff` seconds (each wait
    at least `backoff * 2**i`, at most half as long again); nothing else is
    retried. The call's deadline covers every attempt. For a server that takes
    longer to come up, call `wait_until_ready` first.
    """

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    token: str | None = None
    root_certificates: bytes | None = None
    certificate_chain: bytes | None = None
    private_key: bytes | None = None
    retries: int = 3
    backoff: float = 0.5

    def __post_init__(self) -> None:
        if not 0 <= self.retries <= MAX_RETRIES:
            raise ValueError(
                f"retries: gRPC retries a call at most {MAX_RETRIES} times, got {self.retries}; "
                "to wait for a server that is starting, use wait_until_ready(timeout)"
            )
        if self.backoff < 0:
            raise ValueError(f"backoff: must be >= 0 seconds, got {self.backoff}")

    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        return (("authorization", f"Bearer {self.token}"),) if self.token else None

    def credentials(self) -> grpc.ChannelCredentials | None:
        if self.root_certificates is None:
            return None
        return grpc.ssl_channel_credentials(
            self.root_certificates, self.private_key, self.certificate_chain
        )

    def service_config(self) -> str:
        """The channel's service config: gRPC's retry policy for RETRIED_METHODS."""
        if not self.retries:
            return json.dumps({"methodConfig": []})
        # gRPC refuses a zero backoff: 1 ms is as good as none.
        initial = max(self.backoff, 0.001) / (1 - _JITTER)
        policy = {
            "maxAttempts": self.retries + 1,
            "initialBackoff": f"{initial:.6f}s",
            "maxBackoff": f"{initial * 2 ** (self.retries - 1):.6f}s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"],
        }
        names = [{"service": SERVICE, "method": m} for m in RETRIED_METHODS]
        return json.dumps({"methodConfig": [{"name": names, "retryPolicy": policy}]})

    def channel_options(self, own_connection: bool = False) -> list[tuple[str, Any]]:
        options: list[tuple[str, Any]] = [
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.enable_retries", 1),
            ("grpc.service_config", self.service_config()),
        ]
        if own_connection:
            options.append(("grpc.use_local_subchannel_pool", 1))
        return options

    def channel(self, target: str, aio: bool, own_connection: bool = False):
        """A channel (grpc.aio's with `aio`); with `own_connection`, one that
        shares no connection with the others (parallel uploads need one each)."""
        mod = grpc.aio if aio else grpc
        options = self.channel_options(own_connection)
        creds = self.credentials()
        if creds is None:
            return mod.insecure_channel(target, options=options)
        return mod.secure_channel(target, creds, options=options)

    def delays(self) -> list[float]:
        """Seconds to wait before each retry of a whole weight update."""
        return [self.backoff * 2**i for i in range(self.retries)]
