"""The agent of a harness written against the OpenAI API: a session episode
driven with the `openai` SDK on the session's base URL (docs/openai.md,
"Sessions as base URLs"), as `AgentUser` drives one over gRPC. It needs the
server's HTTP front (`serve --http-port`).

The session is opened and read back over gRPC, as a trainer does; its turns
are chat completions on the base URL, each asking for `return_token_ids`, so
the watcher compares the trajectory with the ids the answers reported. The
environment's appends are user messages of `--append-tokens` random ids as
text (Detokenize: the text of ids, as an environment's observation would be).
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import openai
from locust import task

from rollout.v1 import rollout_pb2 as pb
from rollout_client.load import options
from rollout_client.load.report import CallFailed
from rollout_client.load.users import CALL_TIMEOUT, GRPC, RolloutUser
from rollout_client.load.watcher import ChatTurn, Sent, chat_disagreement, spans_within
from rollout_client.sessions import Session

HTTP = "http"
# httpx logs every request at INFO: thousands of lines a run.
logging.getLogger("httpx").setLevel(logging.WARNING)


class OpenAIAgentUser(RolloutUser):
    """A session episode over its base URL: OpenSession with a user message of
    `--prompt-tokens`, `--turns` chat completions with a user message of
    `--append-tokens` after each but the last, GetSession (the watcher
    compares it with the answers), CloseSession."""

    def on_start(self) -> None:
        o = self.environment.parsed_options
        cert = (o.rollout_tls_cert, o.rollout_tls_key) if o.rollout_tls_cert else None
        http = httpx.Client(verify=o.rollout_tls_ca or True, cert=cert, timeout=CALL_TIMEOUT)
        self.http_url = str(o.rollout_http_url)
        # One SDK client (one connection pool); each session gets a copy on its URL.
        # Made first: on_stop closes it even when the rest of on_start failed.
        self.sdk = openai.OpenAI(
            base_url="http://unused/v1",
            api_key=o.rollout_token or "unused-without-auth",
            http_client=http,
            max_retries=0,
        )
        super().on_start()

    def on_stop(self) -> None:
        self.sdk.close()
        super().on_stop()

    def text(self, length: Any) -> str:
        ids = self.workload.ids(self.rng, length, self.info.vocab_size)
        with self.report.call(GRPC, "Detokenize"):
            return self.client.detokenize(ids, skip_special_tokens=True).text

    @task
    def episode(self) -> None:
        try:
            messages: list[Any] = [{"role": "user", "content": self.text(self.workload.prompt)}]
        except CallFailed:
            return
        turns: list[tuple[ChatTurn, Sent]] = []

        def drive(session: Session) -> None:
            url = options.session_url(self.http_url, session.opened)
            self._turns(self.sdk.with_options(base_url=url), messages, turns)

        done = self.session_episode(drive, messages=messages)
        if done is None:
            return
        session, trajectory = done
        prompt = session.opened.prompt_token_ids
        disagreement = chat_disagreement(trajectory, prompt, [t for t, _ in turns])
        self.report.trajectory(disagreement, "chat trajectory")
        if disagreement:
            return
        # The versions the trainer trains on, token by token, judged as the answers were.
        for turn, mark in turns:
            start, count = len(turn.prompt_token_ids), len(turn.token_ids)
            spans = spans_within(trajectory.version_spans, start, count)
            self.report.verdict("chat trajectory versions", mark, spans)

    def _turns(
        self, sdk: openai.OpenAI, messages: list[Any], turns: list[tuple[ChatTurn, Sent]]
    ) -> None:
        for turn in range(self.workload.turns):
            mark = self.report.watcher.sent()
            sampling = self.sampling()
            with self.report.call(HTTP, "chat turn") as c:
                r = sdk.chat.completions.create(
                    model=self.info.model,
                    messages=messages,
                    max_tokens=sampling["max_tokens"],
                    temperature=sampling["temperature"],
                    extra_body={"return_token_ids": True, "ignore_eos": sampling["ignore_eos"]},
                )
                choice = r.choices[0]
                answered = ChatTurn(
                    r.model_extra["prompt_token_ids"], choice.model_extra["token_ids"]
                )
                c.tokens = len(answered.token_ids)
            turns.append((answered, mark))
            # One version per answer: its admission's, which no token may be older than.
            span = pb.VersionSpan(weight_version=r.model_extra["weight_version"], count=c.tokens)
            self.report.verdict("chat turn versions", mark, [span])
            messages.append(choice.message)
            if turn + 1 < self.workload.turns:
                messages.append({"role": "user", "content": self.text(self.workload.append)})
