"""The user classes a load test mixes (by Locust's `weight`, or by naming
them on the command line): generations, an agent's session episodes, and a
trainer's pushes. Each call is a Locust request entry (`Report.call`), and
every response's version spans go through the watcher.

Locust imports this module through `locustfile.py`, after gevent's patching
and gRPC's gevent mode are on: nothing here makes a channel at import.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from typing import Any

from locust import User, task

from rollout.v1 import rollout_pb2 as pb
from rollout_client.client import RolloutClient
from rollout_client.load import options
from rollout_client.load.report import CallFailed, Report
from rollout_client.load.watcher import trajectory_disagreement
from rollout_client.sessions import Session

GRPC = "grpc"
# Deadline of each call: generous, so a loaded server shows as latency in the
# report rather than as DEADLINE_EXCEEDED failures.
CALL_TIMEOUT = 300.0


class RolloutUser(User):
    """What every user holds: its client, the workload, the process's report
    and the server's facts (GetServerInfo, asked once per user)."""

    abstract = True

    def on_start(self) -> None:
        o = self.environment.parsed_options
        target, connection = options.connection(o)
        self.workload = options.Workload.from_options(o)
        self.report = Report.of(self.environment)
        self.client = RolloutClient(target, options=connection, timeout=CALL_TIMEOUT)
        self.rng = random.Random()
        with self.report.call(GRPC, "GetServerInfo"):
            self.info = self.client.server_info()
        # The version served at the start: older than any push seen later.
        self.report.watcher.seen(self.info.weight_version)

    def on_stop(self) -> None:
        self.client.close()

    def prompt(self) -> list[int]:
        return self.workload.ids(self.rng, self.workload.prompt, self.info.vocab_size)

    def session_episode(
        self, turns: Callable[[Session], None], **open_kwargs: Any
    ) -> tuple[Session, pb.GetSessionResponse] | None:
        """OpenSession, the episode's `turns`, GetSession, then CloseSession
        however the turns ended, each a call of the report: the session and
        its trajectory, or None when a call failed (the report has it)."""
        try:
            with self.report.call(GRPC, "OpenSession"):
                session = self.client.open_session(**open_kwargs)
            try:
                turns(session)
                with self.report.call(GRPC, "GetSession"):
                    trajectory = session.trajectory()
            finally:
                with self.report.call(GRPC, "CloseSession"):
                    session.close()
        except CallFailed:
            return None
        return session, trajectory

    def sampling(self) -> dict[str, Any]:
        # ignore_eos: every call makes the output length the flags ask for.
        n = self.workload.output.draw(self.rng)
        return {"max_tokens": n, "temperature": 1.0, "ignore_eos": True}


class GenerateUser(RolloutUser):
    """Unary Generate calls."""

    @task
    def generate(self) -> None:
        mark = self.report.watcher.sent()
        try:
            with self.report.call(GRPC, "Generate") as c:
                r = self.client.generate(prompt_token_ids=self.prompt(), **self.sampling())
                c.tokens = sum(len(x.token_ids) for x in r.completions)
        except CallFailed:
            return
        spans = [s for x in r.completions for s in x.version_spans]
        self.report.verdict("Generate versions", mark, spans)


class StreamUser(RolloutUser):
    """GenerateStream calls: the whole call, the time to its first token and
    each gap between token-bearing messages (inter-token latency) as entries."""

    @task
    def generate_stream(self) -> None:
        mark = self.report.watcher.sent()
        spans: list[pb.VersionSpan] = []
        last: float | None = None
        try:
            with self.report.call(GRPC, "GenerateStream") as c:
                stream = self.client.generate_stream(
                    prompt_token_ids=self.prompt(), **self.sampling()
                )
                for delta in stream:
                    if not delta.token_ids:
                        continue
                    now = time.perf_counter()
                    if last is None:
                        self.report.fire(GRPC, "GenerateStream TTFT", now - c.started)
                    else:
                        self.report.fire(GRPC, "GenerateStream ITL", now - last)
                    last = now
                    c.tokens += len(delta.token_ids)
                    spans.extend(delta.version_spans)
        except CallFailed:
            return
        self.report.verdict("GenerateStream versions", mark, spans)


class ManyUser(RolloutUser):
    """GenerateMany streams of `--many-requests` generations each."""

    @task
    def generate_many(self) -> None:
        requests = [
            pb.GenerateStreamRequest(
                request_id=uuid.uuid4().hex,
                prompt_token_ids=self.prompt(),
                sampling_params=pb.SamplingParams(**self.sampling()),
            )
            for _ in range(self.workload.many)
        ]
        mark = self.report.watcher.sent()
        spans: list[pb.VersionSpan] = []
        try:
            with self.report.call(GRPC, "GenerateMany") as c:
                for response in self.client.generate_many(requests):
                    if response.failures:
                        f = response.failures[0]
                        raise RuntimeError(f"{len(response.failures)} failed: {f.message}")
                    for delta in response.deltas:
                        c.tokens += len(delta.token_ids)
                        spans.extend(delta.version_spans)
        except CallFailed:
            return
        self.report.verdict("GenerateMany versions", mark, spans)


class AgentUser(RolloutUser):
    """A multi-turn session episode: open with a prompt, `--turns` model turns
    each followed by `--append-tokens` of the environment's ids, read the
    trajectory (the watcher compares it with the turns), close."""

    @task
    def episode(self) -> None:
        prompt = self.prompt()
        steps: list[pb.SessionGenerateResponse | list[int]] = []
        done = self.session_episode(lambda s: self._turns(s, steps), prompt_token_ids=prompt)
        if done is not None:
            self.report.trajectory(trajectory_disagreement(done[1], prompt, steps))

    def _turns(self, session: Any, steps: list[pb.SessionGenerateResponse | list[int]]) -> None:
        for turn in range(self.workload.turns):
            mark = self.report.watcher.sent()
            with self.report.call(GRPC, "SessionGenerate") as c:
                r = session.generate(**self.sampling())
                c.tokens = len(r.completion.token_ids)
            steps.append(r)
            self.report.verdict("SessionGenerate versions", mark, r.completion.version_spans)
            ids = self.workload.ids(self.rng, self.workload.append, self.info.vocab_size)
            if turn + 1 < self.workload.turns and ids:
                with self.report.call(GRPC, "AppendToSession"):
                    session.append(token_ids=ids)
                steps.append(ids)
