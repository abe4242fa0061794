"""The load test's own flags (added to Locust's by `events.init_command_line_parser`)
and what they become: the connection to the server and the workload.

Every flag also reads an environment variable (Locust's `env_var`), so a
worker started with only `--worker` gets them from the master's environment or
its own; Locust sends the master's parsed options to its workers too.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_client.calls.connection import ConnectionOptions

# (flag, env var, default, help). Lengths are N or LO-HI (uniform).
FLAGS: tuple[tuple[str, str, str, str], ...] = (
    ("--rollout-target", "ROLLOUT_TARGET", "127.0.0.1:50051", "the server's host:port"),
    ("--rollout-token", "ROLLOUT_TOKEN", "", "bearer token (the trainer needs an admin one)"),
    ("--rollout-tls-ca", "ROLLOUT_TLS_CA", "", "PEM file of root certificates: TLS on"),
    ("--rollout-tls-cert", "ROLLOUT_TLS_CERT", "", "client certificate chain (mutual TLS)"),
    ("--rollout-tls-key", "ROLLOUT_TLS_KEY", "", "client private key (mutual TLS)"),
    (
        "--rollout-http-url",
        "ROLLOUT_HTTP_URL",
        "",
        "the HTTP front's URL (http[s]://host:port) for OpenAIAgentUser's sessions "
        "(default: the base URL OpenSession answers)",
    ),
    ("--prompt-tokens", "ROLLOUT_PROMPT_TOKENS", "32", "prompt length in tokens"),
    ("--output-tokens", "ROLLOUT_OUTPUT_TOKENS", "32", "max_tokens of each generation"),
    ("--many-requests", "ROLLOUT_MANY_REQUESTS", "8", "generations per GenerateMany stream"),
    ("--turns", "ROLLOUT_TURNS", "3", "model turns per agent episode"),
    ("--append-tokens", "ROLLOUT_APPEND_TOKENS", "16", "environment tokens after each turn"),
    ("--push-every", "ROLLOUT_PUSH_EVERY", "5", "seconds between a trainer's pushes"),
    ("--pause-modes", "ROLLOUT_PAUSE_MODES", "keep,wait", "pause modes the trainer cycles"),
)

PAUSE_MODES = {"wait": pb.PAUSE_MODE_WAIT, "abort": pb.PAUSE_MODE_ABORT, "keep": pb.PAUSE_MODE_KEEP}
# Prompt and appended ids are drawn from [10, vocab): low ids are often special.
FIRST_ID = 10


def add_flags(parser: Any) -> None:
    """Our flags on Locust's parser (a configargparse parser)."""
    group = parser.add_argument_group("rollout-service load test (docs/load-testing.md)")
    for flag, env, default, help_text in FLAGS:
        group.add_argument(flag, type=str, env_var=env, default=default, help=help_text)


@dataclass(frozen=True)
class Range:
    """A length: fixed (`16`) or uniform over a closed range (`8-32`)."""

    lo: int
    hi: int

    @classmethod
    def parse(cls, text: str | int, flag: str) -> Range:
        lo, _, hi = str(text).partition("-")
        try:
            r = cls(int(lo), int(hi or lo))
        except ValueError:
            r = cls(0, -1)
        if not 0 <= r.lo <= r.hi:
            raise ValueError(f"{flag}: want N or LO-HI with 0 <= LO <= HI, got {text!r}")
        return r

    def draw(self, rng: random.Random) -> int:
        return rng.randint(self.lo, self.hi)


@dataclass(frozen=True)
class Workload:
    """The workload the flags ask for."""

    prompt: Range
    output: Range
    many: int
    turns: int
    append: Range
    push_every: float
    pause_modes: tuple[pb.PauseMode, ...]

    @classmethod
    def from_options(cls, o: Any) -> Workload:
        modes = [m.strip().lower() for m in str(o.pause_modes).split(",") if m.strip()]
        if not modes or any(m not in PAUSE_MODES for m in modes):
            raise ValueError(
                f"--pause-modes: a list of {sorted(PAUSE_MODES)}, got {o.pause_modes!r}"
            )
        w = cls(
            prompt=Range.parse(o.prompt_tokens, "--prompt-tokens"),
            output=Range.parse(o.output_tokens, "--output-tokens"),
            many=int(o.many_requests),
            turns=int(o.turns),
            append=Range.parse(o.append_tokens, "--append-tokens"),
            push_every=float(o.push_every),
            pause_modes=tuple(PAUSE_MODES[m] for m in modes),
        )
        if w.prompt.lo < 1 or w.output.lo < 1 or w.many < 1 or w.turns < 1:
            raise ValueError("--prompt-tokens, --output-tokens, --many-requests, --turns: >= 1")
        return w

    def ids(self, rng: random.Random, length: Range, vocab_size: int) -> list[int]:
        return rng.choices(range(FIRST_ID, vocab_size), k=length.draw(rng))


def _read(path: str) -> bytes | None:
    return Path(path).read_bytes() if path else None


def connection(o: Any) -> tuple[str, ConnectionOptions]:
    """The target and RolloutClient's ConnectionOptions from the flags."""
    options = ConnectionOptions(
        token=o.rollout_token or None,
        root_certificates=_read(o.rollout_tls_ca),
        certificate_chain=_read(o.rollout_tls_cert),
        private_key=_read(o.rollout_tls_key),
    )
    return str(o.rollout_target or os.environ.get("ROLLOUT_TARGET", "")), options


def session_url(http_url: str, opened: pb.OpenSessionResponse) -> str:
    """A session's OpenAI base URL: on `--rollout-http-url` when given (the
    load machine reaches the HTTP front under another name), else as
    OpenSession answered it (empty when the server runs no HTTP front)."""
    if http_url:
        return f"{http_url.rstrip('/')}/sessions/{opened.session_id}/v1"
    if not opened.base_url:
        raise RuntimeError(
            "the session has no base URL: serve with --http-port, or give --rollout-http-url"
        )
    return opened.base_url
