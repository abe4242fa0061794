"""A stream's messages from the engine's outputs (generation/deltas.py), alone.

The outputs are built by hand, shaped like vLLM's RequestOutput and
CompletionOutput as deltas.py reads them, of RequestOutputKind.DELTA (each
carries only what is new): no engine, no server. What is asserted is what a
client of GenerateStream reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from rollout.v1 import rollout_pb2 as pb
from rollout_service.engine.gate import Ticket
from rollout_service.generation.deltas import StreamDeltas, delta_spans


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass
class Span:  # vLLM's WeightVersionSpan: tokens [start, end) by `version`
    version: str
    start: int
    end: int


@dataclass
class Completion:  # vLLM's CompletionOutput, one delta of it
    index: int
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    text: str = ""
    weight_versions: list[Span] | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class Output:  # vLLM's RequestOutput
    outputs: list[Completion]
    prompt_token_ids: list[int] | None = field(default_factory=lambda: [1, 2, 3])
    finished: bool = False
    num_cached_tokens: int | None = None
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None


class Live:
    """A running completion's spans as the engine would report them, and
    every index it was asked for."""

    def __init__(self, spans: list[Span] | None = None) -> None:
        self.spans = spans
        self.asked: list[int] = []

    def __call__(self, index: int) -> list[Span] | None:
        self.asked.append(index)
        return self.spans


def stream(live: Live | None = None, version: str = "v1", **kw) -> StreamDeltas:
    return StreamDeltas("r1", Ticket(version), live or Live(), **kw)


def spans(message: pb.GenerateStreamResponse) -> list[tuple[str, int, int]]:
    return [(s.weight_version, s.start, s.count) for s in message.version_spans]


def test_tokens_arrive_in_order_labelled_with_the_admission_version():
    s = stream()
    first = s.step(Output([Completion(0, [10])]), keep_epoch=0)
    middle = s.step(Output([Completion(0, [11, 12])]), keep_epoch=0)
    last = s.step(
        Output([Completion(0, [13], "length")], finished=True, num_cached_tokens=2), keep_epoch=0
    )
    messages = first + middle + last
    assert [list(m.token_ids) for m in messages] == [[10], [11, 12], [13]]
    assert [spans(m) for m in messages] == [[("v1", 0, 1)], [("v1", 0, 2)], [("v1", 0, 1)]]
    assert {(m.request_id, m.weight_version) for m in messages} == {("r1", "v1")}
    assert [m.finish_reason for m in messages] == [
        pb.FINISH_REASON_UNSPECIFIED,
        pb.FINISH_REASON_UNSPECIFIED,
        pb.FINISH_REASON_LENGTH,
    ]
    # The usage comes once, on the last message, complete.
    assert [m.HasField("usage") for m in messages] == [False, False, True]
    assert messages[-1].usage == pb.Usage(
        prompt_tokens=3, completion_tokens=4, cached_prompt_tokens=2
    )


def test_a_keep_update_mid_stream_labels_each_token_by_the_weights_that_made_it():
    # Admitted on v1 in keep epoch 0; a PAUSE_MODE_KEEP update to v2 applies
    # after the completion's 4th token (the gate's epoch becomes 1).
    live = Live()
    s = stream(live)
    before = s.step(Output([Completion(0, [1, 2, 3])]), keep_epoch=0)
    assert spans(before[0]) == [("v1", 0, 3)]
    assert live.asked == []  # no update since admission: nothing to read

    live.spans = [Span("v1", 0, 4), Span("v2", 4, 6)]
    across = s.step(Output([Completion(0, [4, 5, 6])]), keep_epoch=1)
    # Tokens 3..5 of the completion: one computed before the switch, two after.
    assert spans(across[0]) == [("v1", 0, 1), ("v2", 1, 2)]
    assert across[0].weight_version == "v1"  # the delta's first token's

    live.spans = [Span("v1", 0, 4), Span("v2", 4, 8)]
    after = s.step(Output([Completion(0, [7, 8])]), keep_epoch=1)
    assert spans(after[0]) == [("v2", 0, 2)] and after[0].weight_version == "v2"
    assert live.asked == [0, 0]

    # Finished: vLLM's own spans come with the output; nothing is read live.
    own = [Span("v1", 0, 4), Span("v2", 4, 10)]
    last = s.step(
        Output([Completion(0, [9, 10], "length", weight_versions=own)], finished=True),
        keep_epoch=1,
    )
    assert spans(last[0]) == [("v2", 0, 2)] and live.asked == [0, 0]
    assert last[0].usage.completion_tokens == 10


def test_a_request_the_engine_no_longer_holds_keeps_the_admission_version():
    s = stream(Live(None))
    s.step(Output([Completion(0, [1, 2])]), keep_epoch=0)
    (message,) = s.step(Output([Completion(0, [3, 4])]), keep_epoch=1)
    assert spans(message) == [("v1", 0, 2)]


def test_the_first_message_carries_the_prompt_and_its_logprobs():
    s = stream(echo_prompt=True, prompt_top_k=1)
    prompt_logprobs = [
        None,  # the first position has none
        {2: Logprob(-0.5, 1), 7: Logprob(-1.0, 2)},
        {3: Logprob(-0.25, 1)},
    ]
    (first,) = s.step(Output([Completion(0, [10])], prompt_logprobs=prompt_logprobs), 0)
    assert list(first.prompt_token_ids) == [1, 2, 3]
    assert list(first.prompt_logprobs) == [-0.5, -0.25]
    assert [list(t.token_ids) for t in first.prompt_top_logprobs] == [[2], [3]]
    (second,) = s.step(Output([Completion(0, [11])], prompt_logprobs=prompt_logprobs), 0)
    assert not second.prompt_token_ids and not second.prompt_logprobs


def test_ids_the_caller_sent_are_not_echoed():
    (first,) = stream().step(Output([Completion(0, [10])]), keep_epoch=0)
    assert not first.prompt_token_ids


def test_outputs_with_nothing_new_send_nothing_until_the_end():
    s = stream(echo_prompt=True)
    assert s.step(Output([]), keep_epoch=0) == []
    assert s.step(Output([Completion(0, [])]), keep_epoch=0) == []
    # Finished with no completion to carry them: a message of its own, no
    # tokens, with the first message's prompt and the last one's usage.
    s.ticket.adapter_version = "a1"
    (only,) = s.step(Output([], finished=True, num_cached_tokens=3), keep_epoch=0)
    assert not only.token_ids and list(only.prompt_token_ids) == [1, 2, 3]
    assert only.weight_version == "v1" and only.lora_adapter_version == "a1"
    assert only.usage == pb.Usage(prompt_tokens=3, cached_prompt_tokens=3)


def test_a_last_output_without_tokens_still_brings_the_usage():
    s = stream()
    s.step(Output([Completion(0, [5]), Completion(1, [6])]), keep_epoch=0)
    s.step(Output([Completion(0, [7], "stop"), Completion(1, [8], "stop")]), keep_epoch=0)
    (last,) = s.step(Output([], finished=True), keep_epoch=0)
    assert not last.token_ids and last.usage.completion_tokens == 4
    assert not last.prompt_token_ids  # the prompt went with the first message


def test_completions_are_counted_apart():
    live = Live([Span("v1", 0, 1), Span("v2", 1, 9)])
    s = stream(live)
    a = s.step(Output([Completion(0, [1, 2]), Completion(1, [3])]), keep_epoch=0)
    b = s.step(Output([Completion(1, [4, 5])]), keep_epoch=1)
    c = s.step(Output([Completion(0, [6], "stop"), Completion(1, [7], "length")], finished=True), 1)
    assert [(m.index, list(m.token_ids)) for m in a + b + c] == [
        (0, [1, 2]),
        (1, [3]),
        (1, [4, 5]),
        (0, [6]),
        (1, [7]),
    ]
    # Completion 1's second delta starts at its own token 1, not at 3.
    assert spans(b[0]) == [("v2", 0, 2)] and live.asked == [1]
    assert [m.finish_reason for m in c] == [pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH]
    assert not c[0].HasField("usage") and c[1].usage.completion_tokens == 7


def test_logprobs_stay_with_their_tokens():
    logprobs = [
        {5: Logprob(-0.1, 1), 9: Logprob(-2.0, 2)},
        # The sampled token need not be the likeliest.
        {4: Logprob(-0.2, 1), 6: Logprob(-0.3, 2)},
    ]
    (top,) = stream(top_k=2).step(Output([Completion(0, [5, 6], logprobs=logprobs)]), 0)
    assert list(top.logprobs) == pytest.approx([-0.1, -0.3])
    assert [list(t.token_ids) for t in top.top_logprobs] == [[5, 9], [4, 6]]
    assert [list(t.logprobs) for t in top.top_logprobs] == [
        pytest.approx([-0.1, -2.0]),
        pytest.approx([-0.2, -0.3]),
    ]
    (sampled,) = stream().step(Output([Completion(0, [5, 6], logprobs=logprobs)]), 0)
    assert list(sampled.logprobs) == pytest.approx([-0.1, -0.3]) and not sampled.top_logprobs


@pytest.mark.parametrize(
    ("reason", "stop", "expected"),
    [
        ("stop", None, pb.FINISH_REASON_STOP),
        ("stop", 42, pb.FINISH_REASON_STOP),
        ("stop", "END", pb.FINISH_REASON_STOP),
        ("length", None, pb.FINISH_REASON_LENGTH),
        ("abort", None, pb.FINISH_REASON_ABORT),
    ],
)
def test_finish_and_stop_reasons(reason, stop, expected):
    (m,) = stream().step(Output([Completion(0, [1], reason, stop)], finished=True), 0)
    assert m.finish_reason == expected
    assert m.stop_reason == ("" if stop is None else str(stop))


def test_a_finish_without_new_tokens_is_sent():
    s = stream()
    s.step(Output([Completion(0, [1])]), keep_epoch=0)
    (m,) = s.step(Output([Completion(0, [], "abort")], finished=True), keep_epoch=0)
    assert not m.token_ids and not m.version_spans and m.finish_reason == pb.FINISH_REASON_ABORT


def test_text_is_sent_unless_omitted():
    out = Output([Completion(0, [1, 2], text="hi")])
    assert stream().step(out, 0)[0].text == "hi"
    assert stream(omit_text=True).step(out, 0)[0].text == ""


def test_the_adapter_version_is_read_once_the_request_runs():
    s = stream()
    # _run sets it after admission, before the engine's first output.
    s.ticket.adapter_version = "adapter-7"
    (m,) = s.step(Output([Completion(0, [1])]), keep_epoch=0)
    assert m.lora_adapter_version == "adapter-7"


def test_a_call_aborted_before_the_engine_ends_every_completion():
    messages = stream(version="v3").aborted(3)
    assert [(m.index, m.finish_reason, m.weight_version) for m in messages] == [
        (i, pb.FINISH_REASON_ABORT, "v3") for i in range(3)
    ]
    assert [m.HasField("usage") for m in messages] == [False, False, True]


def test_a_session_turns_spans_take_the_same_routes():
    live = Live([Span("v1", 0, 2), Span("v2", 2, 5)])
    running = Completion(0, [3, 4])
    assert delta_spans(running, 2, 2, "v1", kept=False, live=live) == [("v1", 0, 2)]
    assert delta_spans(running, 2, 2, "v1", kept=True, live=live) == [("v2", 0, 2)]
    done = Completion(0, [3, 4], "stop", weight_versions=[Span("v1", 0, 3), Span("v2", 3, 4)])
    assert delta_spans(done, 2, 2, "v1", kept=True, live=live) == [("v1", 0, 1), ("v2", 1, 1)]
    assert live.asked == [0]
    assert delta_spans(done, 2, 0, "v1", kept=True, live=live) == []
