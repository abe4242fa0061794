"""A server with the OpenAI-compatible HTTP front on (--http-port), bearer
tokens (tests/support/tokens.py) and metrics, for the modules that drive the
HTTP API: its addresses and the clients that reach it."""

from __future__ import annotations

from pathlib import Path

import openai

from harness.serverproc import ServerProcess
from rollout_client import RolloutClient
from tests.support.tokens import ADMIN, GENERATE, GENERATE_B

# JSON without free whitespace: a random model would otherwise pad the JSON
# of a forced tool call or a response_format with whitespace to max_tokens.
TIGHT_JSON = (
    "--structured-outputs-config",
    '{"backend": "xgrammar", "disable_any_whitespace": true}',
)


class HttpServed:
    """The server, its HTTP front's base URL and its /metrics URL."""

    def __init__(self, proc: ServerProcess) -> None:
        self.proc = proc
        self.url = f"http://{proc.http_target}"
        self.metrics = f"http://127.0.0.1:{proc.metrics_port}/metrics"

    def sdk(self, token: str = GENERATE, base_url: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=base_url or self.url + "/v1", api_key=token, max_retries=0, timeout=120
        )

    def async_sdk(self, token: str = GENERATE) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.url + "/v1", api_key=token, max_retries=0, timeout=120
        )

    def grpc(self, token: str = GENERATE) -> RolloutClient:
        return RolloutClient(self.proc.target, token=token, timeout=120)


def http_flags(folder: Path, *flags: str) -> list[str]:
    """`rollout-service serve` flags for the HTTP front with tokens (ADMIN,
    GENERATE, GENERATE_B, written in `folder`), metrics, tight JSON and
    `flags`; the ports are the kernel's choice (the server's `http_port` and
    `metrics_port` name them)."""
    tokens = folder / "tokens"
    tokens.write_text(f"admin:{ADMIN}\ngenerate:{GENERATE}\ngenerate:{GENERATE_B}\n")
    return [
        "--tokens-file", str(tokens),
        "--http-port", "0",
        "--metrics-port", "0",
        *TIGHT_JSON,
        *flags,
    ]  # fmt: skip
