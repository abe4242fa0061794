"""PAUSE_MODE_KEEP, switched many times: every update lands mid-flight.

A KEEP update that waits for the running generation to end is a WAIT in
disguise: the trainer's push then takes as long as its longest rollout, and
every token of that rollout comes from the old weights. One KEEP that keeps
says little (it was seen keeping about half the time), so this module
repeats the switch round after round on a fresh server (its very first
update is a round), after aborts, for each kind of generation: a unary
Generate, a GenerateStream, a generation on a GenerateMany stream and a
session turn. In every round:

- the ack says the update kept (`keep_held` unset: the engine paused within
  KEEP_HOLD_SECONDS of the commit) and kept the generation (requests_kept);
- the completion splits between the old and the new version, every token
  tagged, the split before its end;
- what it generated after the split is exactly what a fresh request on the
  new weights generates from its prompt and its tokens before the split.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections.abc import Callable

import pytest

from harness.weights_util import random_weights, version
from rollout_client import RolloutClient, pb
from rollout_client.calls import core
from tests.support.keep_mode import PROMPT, merged_spans

# Long enough that the push lands well inside it (on a machine without
# AVX-512 too), short enough for many rounds.
TOKENS = 256
# Tokens seen before the push (unary calls: the wait below instead).
BEFORE = 24
ROUNDS = 3


@pytest.fixture(scope="module")
def kc(keep_server):
    with RolloutClient(keep_server.target, timeout=120) as c:
        yield c


def _greedy(**kw):
    return {"max_tokens": TOKENS, "temperature": 0, "ignore_eos": True, **kw}


class Run:
    """One generation in a thread: its tokens and per-version runs, and how
    many tokens it has produced so far (for the push to wait on)."""

    def __init__(self, body: Callable[[Run], None]) -> None:
        self.seen = 0
        self.tokens: list[int] = []
        self.runs: list[list] = []
        self.prompt: list[int] = PROMPT
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(body,))
        self._thread.start()

    def _run(self, body: Callable[[Run], None]) -> None:
        try:
            body(self)
        except BaseException as e:  # reported by join
            self.error = e

    def wait_started(self, kind: str, c: RolloutClient) -> None:
        deadline = time.monotonic() + 60
        if kind == "unary":
            # A unary call shows nothing before its end: until the engine
            # holds it, then a few tokens' time.
            while c.server_info().engine_requests < 1:
                assert time.monotonic() < deadline and self._thread.is_alive(), "not started"
                time.sleep(0.005)
            time.sleep(0.03)
            return
        while self.seen < BEFORE and self._thread.is_alive():
            assert time.monotonic() < deadline, "the generation did not start"
            time.sleep(0.002)

    def join(self) -> None:
        self._thread.join(120)
        if self.error is not None:
            raise self.error


def _unary(c: RolloutClient) -> Callable[[Run], None]:
    def body(run: Run) -> None:
        r = c.generate(prompt_token_ids=PROMPT, **_greedy())
        comp = r.completions[0]
        run.tokens = list(comp.token_ids)
        run.runs = [[s.weight_version, s.start, s.count] for s in comp.version_spans]

    return body


def _stream(c: RolloutClient) -> Callable[[Run], None]:
    return _stream_of(c, TOKENS)


def _stream_of(c: RolloutClient, tokens: int) -> Callable[[Run], None]:
    def body(run: Run) -> None:
        pieces = []
        for m in c.generate_stream(prompt_token_ids=PROMPT, **_greedy(max_tokens=tokens)):
            run.tokens.extend(m.token_ids)
            run.seen = len(run.tokens)
            pieces.append((m.version_spans, len(m.token_ids)))
        run.runs = merged_spans(pieces)

    return body


def _many(c: RolloutClient) -> Callable[[Run], None]:
    def body(run: Run) -> None:
        req = core.build_generate_stream_request(
            request_id="kept", prompt_token_ids=PROMPT, **_greedy()
        )
        pieces = []
        for m in c.generate_many([req]):
            assert not m.failures, m.failures
            for d in m.deltas:
                run.tokens.extend(d.token_ids)
                pieces.append((d.version_spans, len(d.token_ids)))
            run.seen = len(run.tokens)
        run.runs = merged_spans(pieces)

    return body


def _session(c: RolloutClient) -> Callable[[Run], None]:
    def body(run: Run) -> None:
        with c.open_session(prompt_token_ids=PROMPT) as s:
            for m in s.generate_stream(**_greedy()):
                run.tokens.extend(m.delta.token_ids)
                run.seen = len(run.tokens)
            t = s.trajectory()
            # The session holds the whole trajectory: its version spans are
            # over it, prompt included.
            run.runs = [[v.weight_version, v.start - len(PROMPT), v.count] for v in t.version_spans]
            assert list(t.token_ids) == PROMPT + run.tokens, "the session holds what it streamed"

    return body


KINDS = {"unary": _unary, "stream": _stream, "many": _many, "session": _session}


def _abort_a_running_stream(c: RolloutClient) -> None:
    rid = f"to-abort-{version()}"
    got, aborted = 0, False
    last = None
    for m in c.generate_stream(request_id=rid, prompt_token_ids=PROMPT, **_greedy()):
        got += len(m.token_ids)
        if got >= BEFORE and not aborted:
            c.abort([rid])
            aborted = True
        last = m
    assert last is not None and last.finish_reason == pb.FINISH_REASON_ABORT


def _switch(c: RolloutClient, parameters, kind: str, seed: int) -> str:
    """One round: a generation of `kind`, a KEEP push while it runs, and the
    checks of the module's docstring. Returns the new version."""
    old = c.server_info().weight_version
    weights = random_weights(parameters, seed=seed)
    run = Run(KINDS[kind](c))
    run.wait_started(kind, c)
    new = version()
    ack = c.update_weights(weights, new, pause_mode=pb.PAUSE_MODE_KEEP)
    run.join()
    where = f"{kind} round (seed {seed})"
    assert not ack.HasField("keep_held"), f"{where}: {ack.keep_held.reason}"
    assert ack.requests_kept >= 1 and ack.requests_aborted == 0, (where, ack)
    assert len(run.tokens) == TOKENS, where
    assert [r[0] for r in run.runs] == [old, new], (where, run.runs)
    boundary = run.runs[1][1]
    assert 0 < boundary < TOKENS and run.runs[0][2] + run.runs[1][2] == TOKENS, (where, run.runs)
    fresh = c.generate(
        prompt_token_ids=PROMPT + run.tokens[:boundary], **_greedy(max_tokens=TOKENS - boundary)
    )
    assert list(fresh.completions[0].token_ids) == run.tokens[boundary:], (
        f"{where}: the continuation differs from a fresh request on the new weights"
    )
    return new


def test_every_keep_lands_mid_flight_on_every_kind_of_generation(kc):
    """From the fresh server's first update on: ROUNDS rounds of each kind,
    each kind also right after an aborted stream."""
    parameters = kc.server_info().parameters
    seed = 700
    for _ in range(ROUNDS):
        for kind in KINDS:
            seed += 1
            _switch(kc, parameters, kind, seed)
    for kind in KINDS:
        _abort_a_running_stream(kc)
        seed += 1
        _switch(kc, parameters, kind, seed)


def _held_count(server, phase: str) -> float:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read()
    m = re.search(rf'^rollout_keep_held_total{{phase="{phase}"}} (\S+)$', text.decode(), re.M)
    return float(m.group(1)) if m else 0.0


def test_a_keep_that_cannot_keep_says_so(kc, keep_server):
    """A KEEP held behind another holder of the engine's lock (here a
    ResetCaches, which drains the running generation as WAIT does) cannot
    keep: its ack says how long it was held and by what, the metric counts
    it and the log warns. Nothing waits silently."""
    parameters = kc.server_info().parameters
    before = _held_count(keep_server, "wait")
    run = Run(_stream_of(kc, 1500))
    run.wait_started("stream", kc)
    resetting = threading.Thread(target=kc.reset_caches)
    resetting.start()
    time.sleep(0.2)  # the reset holds the lock, draining the generation
    new = version()
    ack = kc.update_weights(
        random_weights(parameters, seed=901), new, pause_mode=pb.PAUSE_MODE_KEEP
    )
    resetting.join(60)
    run.join()
    held = ack.keep_held
    assert ack.HasField("keep_held") and held.phase == "wait", ack
    assert held.seconds > 0.5 and held.requests_finished == 1, held
    assert "ran to their end on the old weights" in held.reason
    assert _held_count(keep_server, "wait") == before + 1
    assert f"PAUSE_MODE_KEEP update {new!r} was held" in keep_server.log.read_text()
