"""Work that grows with the input never freezes the server: while a huge text
or chat is sent, health checks keep answering, and the text is refused (a
text too long to be a prompt is refused before it is tokenized)."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rollout.v1 import rollout_pb2 as pb
from rollout.v1 import rollout_pb2_grpc

HUGE_TEXT = "hello world " * 3_000_000  # 36 MB, about 6M tokens


class HealthProbe:
    """Health checks every 50 ms on a channel of their own; the slowest answer."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target)
        self.stub = health_pb2_grpc.HealthStub(self.channel)
        self.slowest = 0.0
        self.answered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            self.stub.Check(health_pb2.HealthCheckRequest(), timeout=60)
            self.slowest = max(self.slowest, time.monotonic() - t0)
            self.answered += 1
            self._stop.wait(0.05)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.channel.close()


@pytest.fixture(scope="module")
def stub(server):
    options = [("grpc.max_send_message_length", 64 << 20)]
    with grpc.insecure_channel(server.target, options=options) as channel:
        yield rollout_pb2_grpc.RolloutServiceStub(channel)


def _refusal(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call(request, timeout=120)
    return e.value


CASES = {
    "Tokenize text": ("Tokenize", pb.TokenizeRequest(text=HUGE_TEXT), "text"),
    "Generate prompt_text": (
        "Generate",
        pb.GenerateRequest(prompt_text=HUGE_TEXT, sampling_params=pb.SamplingParams(max_tokens=1)),
        "prompt_text",
    ),
    "Generate 100,000 chat messages": (
        "Generate",
        pb.GenerateRequest(
            messages=[
                pb.ChatMessage(role="user", content=[pb.ContentPart(text="hi")])
                for _ in range(100_000)
            ],
            sampling_params=pb.SamplingParams(max_tokens=1),
        ),
        "messages",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_huge_prompt_is_refused_while_health_answers(server, stub, case):
    method, request, field = CASES[case]
    with HealthProbe(server.target) as probe:
        time.sleep(0.2)
        err = _refusal(getattr(stub, method), request)
        time.sleep(0.2)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith(f"{field}: prompt is at least ")
    assert "max_model_len" in err.details()
    assert probe.answered >= 4 and probe.slowest < 1.0, probe.slowest


def test_the_bound_refuses_only_what_cannot_fit(client, info):
    """A text right under the bound is tokenized, not refused: the bound is a
    lower bound on its tokens, never an estimate."""
    ids = client.tokenize(text="hello world " * 100).token_ids
    per_repeat = len(ids) / 100
    fits = int((info.max_model_len - 8) / per_repeat)
    text = "hello world " * fits
    assert len(client.tokenize(text=text).token_ids) < info.max_model_len
    r = client.generate(prompt_text=text, max_tokens=1)
    assert r.usage.prompt_tokens < info.max_model_len
