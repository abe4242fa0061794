"""Python client for rollout.v1.RolloutService.

from rollout_client import RolloutClient
with RolloutClient("127.0.0.1:50051") as client:
    client.wait_until_ready()
    print(client.generate(prompt_text="Hello", max_tokens=8, temperature=0))
"""

from rollout.v1 import rollout_pb2 as pb
from rollout_client.calls.core import ServerNotReady
from rollout_client.client import AsyncRolloutClient, RolloutClient, RolloutError
from rollout_client.weights.interrupts import UpdateInterrupted
from rollout_client.weights.manifest import ManifestMismatch

__all__ = [
    "AsyncRolloutClient",
    "ManifestMismatch",
    "RolloutClient",
    "RolloutError",
    "ServerNotReady",
    "UpdateInterrupted",
    "pb",
]
