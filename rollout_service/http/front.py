"""What the HTTP routes serve with: the server's readiness (the App and the
pipeline over it, or UNAVAILABLE while the engine starts and once it died,
exactly as gRPC's handlers get them), the tokens file, and the tool and
reasoning parsers the command line named (--tool-call-parser, and vLLM's own
--reasoning-parser, which the engine reads too)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rollout_service.ops.auth import Tokens


@dataclass
class Front:
    """The HTTP front's state; `ready()` is rpc/readiness.py's
    `Serving.ready` (an object with `.app` and `.generations`), handed over
    by server.py so that this package imports nothing of the gRPC front."""

    ready: Callable[[], Any]
    tokens: Tokens | None
    tool_parser: str | None = None
    reasoning_parser: str | None = None
    _parser: Any = field(default=None, init=False)
    _reasoning: Any = field(default=None, init=False)

    def model_names(self, app) -> set[str]:
        """The names a request's `model` may give for the base model: the
        one GetServerInfo and /v1/models say, or the checkpoint's path."""
        mc = app.engine.model_config
        return {app.info.model, str(mc.served_model_name), mc.model}

    def parser_class(self, app):
        """vLLM's Parser class for --tool-call-parser, composed with the
        reasoning parser when there is one (None without a tool parser): a
        tool_choice "auto" request's. Made once, on the tokenizing thread
        (it imports and checks the parsers against the tokenizer)."""
        if self.tool_parser is None:
            return None
        if self._parser is None:
            self._parser = self._compose(app, self.tool_parser)
        return self._parser

    def reasoning_class(self, app):
        """vLLM's Parser class for --reasoning-parser alone (None without
        one): every other chat request's, forced tool calls included (their
        call is read from the content after the reasoning)."""
        if self.reasoning_parser is None:
            return None
        if self._reasoning is None:
            self._reasoning = self._compose(app, None)
        return self._reasoning

    def _compose(self, app, tool_parser: str | None):
        from vllm.parser import ParserManager

        return ParserManager.get_parser(
            tool_parser_name=tool_parser,
            reasoning_parser_name=self.reasoning_parser,
            enable_auto_tools=True,
            model_name=app.engine.model_config.model,
            tokenizer=app.tokenizing.tokenizer,
        )
