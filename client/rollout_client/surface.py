"""What the sync and the asyncio client hold alike (client.py,
async_client.py): the target, the default deadline, the connection options,
one channel and its stubs, and the preparation of an update."""

from __future__ import annotations

import abc
import functools
from typing import Any, Generic, TypeVar

import grpc
from grpc_health.v1 import health_pb2_grpc

from rollout.v1 import rollout_pb2 as pb
from rollout.v1 import rollout_pb2_grpc
from rollout_client.calls.connection import ConnectionOptions
from rollout_client.weights import interrupts, push, updates
from rollout_client.weights.update_options import UpdateOptions

# The channel's type: blocking (RolloutClient) or grpc.aio (AsyncRolloutClient).
_Channel = TypeVar("_Channel", grpc.Channel, grpc.aio.Channel)


class Surface(Generic[_Channel], abc.ABC):
    """What both clients hold: the target, the default deadline, the options,
    one channel (sync or grpc.aio) and its stubs."""

    # The generated stub, typed by its channel: AsyncRolloutClient's is a
    # RolloutServiceAsyncStub (rollout_pb2_grpc.pyi), whose calls are awaited.
    channel: _Channel
    stub: rollout_pb2_grpc.RolloutServiceStub

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        timeout: float | None = 600.0,
        options: ConnectionOptions | None = None,
        **option_fields: Any,
    ) -> None:
        self.timeout = timeout
        self.target = target
        self.options = options or ConnectionOptions(**option_fields)
        self.channel = self._channel()
        self.stub = rollout_pb2_grpc.RolloutServiceStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)

    @abc.abstractmethod
    def _channel(self, own_connection: bool = False) -> _Channel:
        """A channel to the target, the client's kind (ConnectionOptions.channel)."""

    def _call_args(self, timeout: float | None) -> dict[str, Any]:
        """A call's deadline (the client's unless given) and metadata."""
        return {"timeout": timeout or self.timeout, "metadata": self.options.metadata()}

    def _preparing(
        self,
        source: Any,
        version: str,
        info: pb.GetServerInfoResponse | None,
        options: UpdateOptions,
        target: pb.AdapterTarget | None,
        state: interrupts.PushState,
    ) -> functools.partial[push.Update]:
        """updates.prepare_update of an update_weights call, to run (the asyncio
        client runs it in a worker thread)."""
        return functools.partial(
            updates.prepare_update,
            source,
            version,
            info,
            options,
            adapter=target,
            timeout=options.get("timeout") or self.timeout,
            metadata=self.options.metadata(),
            state=state,
        )
