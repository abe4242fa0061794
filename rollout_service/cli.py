"""`rollout-service serve`: the command line.

Server options are declared here; engine options are vLLM's own
(`AsyncEngineArgs.add_cli_args`), so every vLLM flag (--dtype,
--max-model-len, --tensor-parallel-size, ...) passes through unchanged.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from rollout_service import start_checks
from rollout_service.engine.tiny_models import DEFAULT_MODEL, EMBEDDED_MODELS
from rollout_service.ops import logs
from rollout_service.start_checks import MODEL_HELP


def _add_server_args(parser) -> None:
    from rollout_service.config import add_server_args

    add_server_args(parser)
    # Read before parsing (logging is set up first), but listed in --help.
    parser.add_argument(
        "--log-json", action="store_true", help="log JSON lines (with request ids) to stderr"
    )


def build_serve_parser():
    """The `serve` command's parser: server options plus vLLM's engine options."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(
        prog="rollout-service serve",
        description=f"Serve rollout.v1.RolloutService. --model takes {MODEL_HELP}. "
        "--help=rollout-service lists this server's options, --help=WORD the options "
        "whose name contains WORD, --help=all every option.",
    )
    _add_server_args(parser)
    AsyncEngineArgs.add_cli_args(parser)
    # No --model means the embedded default, not vLLM's hub default.
    parser.set_defaults(model=DEFAULT_MODEL)
    for action in parser._actions:
        if action.dest == "model":
            action.help = MODEL_HELP + " (default: %(default)s)"
    return parser


def _top_parser():
    # Plain argparse on top: vLLM's FlexibleArgumentParser rewrites a leading
    # "serve --model X" into its own positional form.
    parser = argparse.ArgumentParser(
        prog="rollout-service",
        description="LLM rollouts for RL trainers over gRPC, on vLLM.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "serve", help="serve a model (see `rollout-service serve --help`)", add_help=False
    )
    return parser


def _engine_args(args):
    from vllm.engine.arg_utils import AsyncEngineArgs

    from rollout_service.engine.tiny_models import ensure_model

    if args.model in EMBEDDED_MODELS:
        name = args.model
        args.model = str(ensure_model(name))
        if args.served_model_name is None:
            args.served_model_name = [name]
        if args.tokenizer is None:
            args.tokenizer = args.model
    return AsyncEngineArgs.from_cli_args(args)


def main(argv: list[str] | None = None) -> int:
    try:
        code = _serve(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        # Ctrl-C before the server's own handlers (serve() installs them
        # first thing): nothing runs yet that needs shutting down.
        print("rollout-service: interrupted", file=sys.stderr)
        return 130
    _exit(code)


def _exit(code: int) -> NoReturn:
    """Ends the process once the server has shut down: the exit functions
    run (log handlers flush, OpenTelemetry exports its last spans), the
    interpreter's finalization does not. It would collect the whole heap
    that settle() froze, for the OS to free anyway (1.4 to 1.6 s measured),
    and, the heap left frozen, triton's nanobind extension (imported through
    vLLM) would print 28 lines about its objects "leaked" at exit."""
    # Not at the top: it imports parent_watch, whose importer's pid is the
    # server's (a test runner forks servers from a process that imported cli).
    from rollout_service.engine import quick_exit

    quick_exit.end(code)


def _check_reasoning_parser(engine_args) -> None:
    """vLLM's --reasoning-parser (an engine flag: the engine's structured
    outputs start after the reasoning; the HTTP front splits it off), refused
    at start unless vLLM registered it, as `vllm serve` refuses it."""
    from vllm.reasoning import ReasoningParserManager

    if engine_args.reasoning_parser_plugin:
        ReasoningParserManager.import_reasoning_parser(engine_args.reasoning_parser_plugin)
    known = ReasoningParserManager.list_registered()
    if engine_args.reasoning_parser not in known:
        sys.exit(
            f"rollout-service: --reasoning-parser {engine_args.reasoning_parser}: not one of "
            f"vLLM's reasoning parsers ({', '.join(sorted(known))})"
        )


def _check_parsers_fit(engine_args, tool_call_parser: str | None) -> None:
    """The parsers against the model's tokenizer, before the engine starts:
    one whose tokens the tokenizer lacks (a reasoning parser's think tokens,
    a tool parser's call markers) is refused now, as `vllm serve` refuses it,
    instead of failing every chat request later."""
    from vllm.parser import ParserManager
    from vllm.tokenizers import get_tokenizer

    tokenizer = get_tokenizer(
        engine_args.tokenizer or engine_args.model,
        tokenizer_mode=engine_args.tokenizer_mode,
        trust_remote_code=engine_args.trust_remote_code,
        revision=engine_args.tokenizer_revision,
    )
    try:
        ParserManager.get_parser(
            tool_parser_name=tool_call_parser,
            reasoning_parser_name=engine_args.reasoning_parser or None,
            enable_auto_tools=True,
            model_name=engine_args.model,
            tokenizer=tokenizer,
        )
    except Exception as e:  # vLLM's words name the flags and the missing tokens
        sys.exit(f"rollout-service: {e}")


def _refuse(refusal: start_checks.Refusal) -> NoReturn:
    print(f"rollout-service: {refusal.text}", file=sys.stderr)
    sys.exit(refusal.status)


def _serve(argv: list[str]) -> int:
    logs.configure(json_lines="--log-json" in argv)
    # On CPU vLLM sizes its KV cache from this (GiB); its default fraction of
    # host memory fails on small machines. GPU builds ignore it. Not when the
    # size is given in bytes: vLLM's CPU platform would put this over it.
    if not any(a.startswith("--kv-cache-memory-bytes") for a in argv):
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    top, rest = _top_parser().parse_known_args(argv[:1])
    argv = argv[1:] + rest
    # Before vLLM's import (10 to 15 s): refused at once, nothing imported.
    if refusal := start_checks.early(argv):
        _refuse(refusal)
    parser = build_serve_parser()
    args = parser.parse_args(argv)
    from rollout_service.config import from_args
    from rollout_service.server import serve

    config = from_args(args)
    given = any(a.startswith("--scheduling-policy") for a in argv)
    if refusal := start_checks.problem(
        config, args.model, args.scheduling_policy if given else None
    ):
        _refuse(refusal)
    engine_args = _engine_args(args)
    if config.tool_call_parser:
        from vllm.tool_parsers import ToolParserManager

        known = ToolParserManager.list_registered()
        if config.tool_call_parser not in known:
            sys.exit(
                f"rollout-service: --tool-call-parser {config.tool_call_parser}: not one of "
                f"vLLM's tool parsers ({', '.join(sorted(known))})"
            )
    if engine_args.reasoning_parser:
        _check_reasoning_parser(engine_args)
    if config.tool_call_parser or engine_args.reasoning_parser:
        _check_parsers_fit(engine_args, config.tool_call_parser)
    from rollout_service.engine.startup import UnsupportedConfig, check_supported

    if config.fair_share:
        engine_args.scheduling_policy = "priority"
    try:
        check_supported(engine_args)
    except UnsupportedConfig as e:
        sys.exit(f"rollout-service: {e}")
    # uvloop, as vLLM's own servers run (`vllm serve`, `vllm serve --grpc`):
    # against asyncio's loop it cut the front end's CPU per streamed token by
    # about an eighth (BENCHMARKS.md, against `vllm serve --grpc`).
    import uvloop

    return uvloop.run(serve(config, engine_args))


if __name__ == "__main__":
    sys.exit(main())
