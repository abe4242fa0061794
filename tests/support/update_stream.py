"""One update stream through the chain of values, without a server: begin
becomes a plan (plan.py), the plan reserves its region, a Upload takes the
rest of the messages (upload.py) and `finish` returns the ReceivedUpdate."""

from __future__ import annotations

from collections.abc import Callable

from rollout.v1 import rollout_pb2 as pb
from rollout_service.status.errors import InvalidArgument
from rollout_service.update.plan import Placement, Target, UpdatePlan, plan_update
from rollout_service.update.received import ReceivedUpdate
from rollout_service.update.upload import Upload
from tests.support.regions import FakeRegion


class UpdateStream:
    def __init__(
        self,
        target: Target,
        placement: Placement | None = None,
        max_update_bytes: int = 1 << 20,
        writing: Callable[[set[str]], None] | None = None,
    ) -> None:
        self.target = target
        self.writing = writing  # what the transfer gives its Upload (upload.py)
        self.placement = placement or Placement(FakeRegion())
        self.max_update_bytes = max_update_bytes
        self.plan: UpdatePlan | None = None
        self.receiver: Upload | None = None

    def begin(self, begin: pb.UpdateWeightsBegin) -> UpdatePlan:
        self.plan = plan_update(begin, self.target, self.placement, self.max_update_bytes)
        self.receiver = Upload(self.plan, self.plan.reserve(), writing=self.writing)
        return self.plan

    def feed(self, msg: pb.UpdateWeightsRequest) -> None:
        if self.receiver is None:
            kind = msg.WhichOneof("kind")
            if kind != "begin":
                raise InvalidArgument(kind or "kind", "the first message must be begin")
            self.begin(msg.begin)
        else:
            self.receiver.feed(msg)

    def add_chunk(self, tensor_index: int, offset: int, data: bytes) -> None:
        assert self.receiver is not None
        self.receiver.add_chunk(tensor_index, offset, data)

    def finish(self, require_commit: bool = True) -> ReceivedUpdate:
        assert self.receiver is not None
        return self.receiver.finish(require_commit)

    @property
    def staging(self):
        return self.placement.staging
