"""The correctness watcher: the service's promise, checked on every response.

The promise (README): no token generated after an update's acknowledgement
comes from older weights. So a call sent after this process saw the
acknowledgement of push k may carry push k's version or a later one, never an
earlier one. The watcher knows the order of the pushes its process
acknowledged; a version it did not push (the server's starting version, a push
of another process) is older than push k when it was seen in a response before
push k's acknowledgement arrived. A version no one here pushed and first seen
after it counts as new: with one trainer per run (the trainer user's
`fixed_count`) only the starting version is in that case, and it is seen first.

Pure: no Locust, no gRPC; `report.py` turns what it finds into Locust events.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rollout.v1 import rollout_pb2 as pb


@dataclass(frozen=True)
class Sent:
    """What the watcher knew when a call was sent: how many pushes it had
    seen acknowledged (a mark to check the response against)."""

    acks: int


@dataclass(frozen=True)
class Verdict:
    """One response checked: its tokens, and those of a stale version."""

    tokens: int
    stale_tokens: int
    stale_versions: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.stale_tokens


class Watcher:
    """Acknowledged pushes in order, and every version seen and when. Locust's
    users are greenlets of one process; the lock keeps it right under threads
    too."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._acked: list[str] = []  # this process's pushes, in acknowledgement order
        self._ack_index: dict[str, int] = {}
        self._first_seen: dict[str, int] = {}  # other versions: acks seen when first met

    def sent(self) -> Sent:
        """Call before sending: the mark its response is checked against."""
        with self._lock:
            return Sent(len(self._acked))

    def acknowledged(self, version: str) -> None:
        """A push of this process was acknowledged as `version`."""
        with self._lock:
            if version not in self._ack_index:
                self._ack_index[version] = len(self._acked)
                self._acked.append(version)

    def seen(self, version: str) -> None:
        """A version met outside a response (GetServerInfo at the start)."""
        with self._lock:
            self._note(version)

    def _note(self, version: str) -> None:
        if version not in self._ack_index:
            self._first_seen.setdefault(version, len(self._acked))

    def _stale(self, version: str, mark: Sent) -> bool:
        if mark.acks == 0 or version == self._acked[mark.acks - 1]:
            return False
        if version in self._ack_index:
            return self._ack_index[version] < mark.acks - 1
        return self._first_seen[version] < mark.acks

    def check(self, mark: Sent, spans: Iterable[pb.VersionSpan]) -> Verdict:
        """The version spans of one response (every completion's, or every
        delta's) against what the watcher knew when the call was sent."""
        tokens = stale = 0
        versions: list[str] = []
        with self._lock:
            for span in spans:
                self._note(span.weight_version)
                tokens += span.count
                if self._stale(span.weight_version, mark):
                    stale += span.count
                    versions.append(span.weight_version)
        return Verdict(tokens, stale, tuple(dict.fromkeys(versions)))


def span_versions(spans: Iterable[pb.VersionSpan]) -> list[str]:
    """One weight version per token, from spans that cover them in order."""
    out: list[str] = []
    for span in sorted(spans, key=lambda s: s.start):
        out.extend([span.weight_version] * span.count)
    return out


def trajectory_disagreement(
    trajectory: pb.GetSessionResponse,
    prompt: Sequence[int],
    steps: Sequence[pb.SessionGenerateResponse | Sequence[int]],
    compare_versions: bool = True,
) -> str:
    """Where a session's trajectory differs from what its calls returned ("":
    nowhere). `steps` are, in order, each turn's response and each append's
    token ids, for a session opened with `prompt` ids (no template: a session
    opened from ids holds exactly its prompt, turns and appends). Without
    `compare_versions` the turns' versions are not compared (responses that carry
    none per token: `chat_disagreement`)."""
    ids, sources, versions = list(prompt), [pb.TOKEN_SOURCE_PROMPT] * len(prompt), []
    for step in steps:
        if isinstance(step, pb.SessionGenerateResponse):
            bridge = list(step.state.generation_prompt_token_ids)  # empty for id sessions
            ids += bridge
            sources += [pb.TOKEN_SOURCE_APPENDED] * len(bridge)
            turn = list(step.completion.token_ids)
            ids += turn
            sources += [pb.TOKEN_SOURCE_SAMPLED] * len(turn)
            versions += span_versions(step.completion.version_spans)
        else:
            ids += list(step)
            sources += [pb.TOKEN_SOURCE_APPENDED] * len(step)
    if list(trajectory.token_ids) != ids:
        first = next(
            (i for i, (a, b) in enumerate(zip(trajectory.token_ids, ids)) if a != b),
            min(len(ids), len(trajectory.token_ids)),
        )
        return (
            f"token ids differ from index {first} "
            f"(trajectory holds {len(trajectory.token_ids)}, the calls returned {len(ids)})"
        )
    if list(trajectory.sources) != sources:
        return "token sources differ from what the calls returned"
    held = span_versions(trajectory.version_spans)
    if compare_versions and held != versions:
        return f"sampled tokens' versions differ: trajectory {held}, responses {versions}"
    return ""


@dataclass(frozen=True)
class ChatTurn:
    """One turn over a session's base URL as its answer reported it
    (`return_token_ids`): the ids it followed from the context's start and
    the ids it sampled."""

    prompt_token_ids: Sequence[int]
    token_ids: Sequence[int]


def chat_disagreement(
    trajectory: pb.GetSessionResponse, prompt: Sequence[int], turns: Sequence[ChatTurn]
) -> str:
    """Where the trajectory of a session driven over its base URL differs
    from the turns' answers ("": nowhere): each turn's prompt extends what
    the one before followed and sampled (what lies between was appended: the
    environment's message, the generation prompt), and the trajectory holds
    exactly that, each turn's ids sampled. An answer carries one version (its
    admission's), not one per token: the versions are not compared here (the
    watcher judges the trajectory's own, `spans_within`)."""
    steps: list[pb.SessionGenerateResponse | Sequence[int]] = []
    before = list(prompt)
    for k, turn in enumerate(turns):
        context = list(turn.prompt_token_ids)
        if context[: len(before)] != before:
            return f"turn {k}'s prompt ids do not extend the ids before it"
        steps.append(context[len(before) :])
        steps.append(pb.SessionGenerateResponse(completion=pb.Completion(token_ids=turn.token_ids)))
        before = context + list(turn.token_ids)
    return trajectory_disagreement(trajectory, prompt, steps, compare_versions=False)


def spans_within(spans: Iterable[pb.VersionSpan], start: int, count: int) -> list[pb.VersionSpan]:
    """The spans over tokens [start, start + count) of a trajectory, counted
    from `start`: one turn's versions as GetSession holds them."""
    end = start + count
    out = []
    for s in spans:
        lo, hi = max(s.start, start), min(s.start + s.count, end)
        if lo < hi:
            out.append(
                pb.VersionSpan(weight_version=s.weight_version, start=lo - start, count=hi - lo)
            )
    return out
