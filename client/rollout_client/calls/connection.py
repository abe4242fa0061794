"""How a client reaches the server: channels, auth, TLS, size limits and the
retry policy, the same for the sync and the asyncio client; and the error
both raise."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, overload

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2
from grpc_status import rpc_status

# A call's metadata, as ConnectionOptions.metadata() gives it: its headers, or None.
Metadata = tuple[tuple[str, str], ...] | None

# Leaves room for a 1 MiB chunk plus framing; the server's default is larger.
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20

SERVICE = "rollout.v1.RolloutService"

# The calls gRPC sends again after UNAVAILABLE (server starting, restarting or
# shutting down): unary calls that either did not run or change nothing when
# run twice. A method added to the service is retried only once it is listed
# here. Client streams are not (UpdateWeights, UploadChunks: gRPC would have to
# buffer the whole stream), nor the staged-update calls: a whole update is
# retried instead (RolloutClient._push says why that is safe).
RETRIED_METHODS = (
    "Generate",
    "GetServerInfo",
    "ResetCaches",
    "Tokenize",
    "Detokenize",
    "GetSession",
)

# gRPC makes at most 5 attempts, whatever the policy says (gRFC A6).
MAX_RETRIES = 4
# gRPC spreads each retry's delay over +-20% of its nominal value; the policy's
# nominal backoff is set this much higher, so that no wait is shorter than
# `backoff * 2**i` (what ConnectionOptions has always promised).
_JITTER = 0.2

# Keepalive pings during calls. A unary Generate is silent until its rollout
# ends; pings find a server host that vanished (the call fails UNAVAILABLE
# within keepalive + 20 s instead of waiting out its deadline) and keep the
# connection busy under load balancers' idle timeouts (often 60 s).
DEFAULT_KEEPALIVE_SECONDS = 30.0
# The server accepts pings 5 s apart (rollout_service.server.KEEPALIVE_OPTIONS)
# and closes connections pinged faster; 10 s, grpc-go's and grpc-java's floor,
# keeps timer jitter from ever counting against us.
MIN_KEEPALIVE_SECONDS = 10.0
KEEPALIVE_TIMEOUT_MS = 20_000


def error_reason(call: grpc.RpcError) -> str:
    """The google.rpc.ErrorInfo reason of a failed call's status details
    (rollout.v1.ErrorReason's name without its prefix, e.g.
    "VERSION_ALREADY_SERVED"), or "" for statuses gRPC made itself. grpcio-status
    reads the grpc-status-details-bin trailer; a trailer it refuses (unparsable,
    or a code or message that differs from the call's: something between us
    and the server rewrote the status) names no reason either."""
    if not hasattr(call, "trailing_metadata"):  # an RpcError raised outside a call
        return ""
    try:
        # grpc.aio's errors answer code(), details() and trailing_metadata()
        # without awaiting: the blocking reader fits both clients.
        status = rpc_status.from_call(call)
    except (ValueError, DecodeError):
        return ""
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason: str = info.reason
            return reason
    return ""


class RolloutError(Exception):
    """A failed call: `code` is the grpc.StatusCode, `details` the server's
    message, `reason` the documented rollout.v1.ErrorReason name without its
    prefix ("" for gRPC's own statuses), to branch on without parsing messages:

        except RolloutError as e:
            if e.reason == "UPDATE_IN_PROGRESS": ...
    """

    def __init__(self, code: grpc.StatusCode, details: str, reason: str = "") -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.reason = reason

    @classmethod
    def wrap(cls, e: grpc.RpcError) -> RolloutError:
        return cls(e.code(), e.details() or "", error_reason(e))


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

    While a call is open the client pings the server every `keepalive_seconds`
    (at least 10; None: never) and drops a connection that does not answer
    within 20 s. A server with gRPC's default policy (another service, a
    rollout-service older than its keepalive policy) closes a silent call
    pinged like this after a few minutes: pass None there.

    `tenant` names the caller for the server's fair share when auth is off
    (sent as `rollout-tenant` metadata; docs/operations.md).
    """

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    token: str | None = None
    root_certificates: bytes | None = None
    certificate_chain: bytes | None = None
    private_key: bytes | None = None
    retries: int = 3
    backoff: float = 0.5
    keepalive_seconds: float | None = DEFAULT_KEEPALIVE_SECONDS
    # Sent as `rollout-tenant` metadata: who the server's fair share counts
    # the calls against when auth is off (with auth on, the token decides).
    tenant: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.retries <= MAX_RETRIES:
            raise ValueError(
                f"retries: gRPC retries a call at most {MAX_RETRIES} times, got {self.retries}; "
                "to wait for a server that is starting, use wait_until_ready(timeout)"
            )
        if self.backoff < 0:
            raise ValueError(f"backoff: must be >= 0 seconds, got {self.backoff}")
        if self.keepalive_seconds is not None and self.keepalive_seconds < MIN_KEEPALIVE_SECONDS:
            raise ValueError(
                f"keepalive_seconds: at least {MIN_KEEPALIVE_SECONDS:g} (the server closes "
                f"connections pinged too often), got {self.keepalive_seconds}; None: no pings"
            )

    def metadata(self) -> Metadata:
        pairs = []
        if self.token:
            pairs.append(("authorization", f"Bearer {self.token}"))
        if self.tenant:
            pairs.append(("rollout-tenant", self.tenant))
        return tuple(pairs) or None

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
        if self.keepalive_seconds is not None:
            options += [
                ("grpc.keepalive_time_ms", round(self.keepalive_seconds * 1000)),
                ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
                # What grpcio 1.85 closes the connection on (default 60 s).
                ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
                # gRPC Core stops after 2 pings with no data between them: a
                # silent call would go unwatched after its first minute.
                ("grpc.http2.max_pings_without_data", 0),
                # Only while calls are open: idle connections need no pings.
                ("grpc.keepalive_permit_without_calls", 0),
            ]
        if own_connection:
            options.append(("grpc.use_local_subchannel_pool", 1))
        return options

    @overload
    def channel(
        self, target: str, aio: Literal[False], own_connection: bool = False
    ) -> grpc.Channel: ...

    @overload
    def channel(
        self, target: str, aio: Literal[True], own_connection: bool = False
    ) -> grpc.aio.Channel: ...

    def channel(
        self, target: str, aio: bool, own_connection: bool = False
    ) -> grpc.Channel | grpc.aio.Channel:
        """A channel (grpc.aio's with `aio`); with `own_connection`, one that
        shares no connection with the others (parallel uploads need one each)."""
        options = self.channel_options(own_connection)
        creds = self.credentials()
        if aio:
            if creds is None:
                return grpc.aio.insecure_channel(target, options=options)
            return grpc.aio.secure_channel(target, creds, options=options)
        if creds is None:
            return grpc.insecure_channel(target, options=options)
        return grpc.secure_channel(target, creds, options=options)

    def delays(self) -> list[float]:
        """Seconds to wait before each retry of a whole weight update."""
        return [self.backoff * 2**i for i in range(self.retries)]
