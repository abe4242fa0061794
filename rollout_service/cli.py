"""`rollout-service serve`: the command line.

Server options are declared here; engine options are vLLM's own
(`AsyncEngineArgs.add_cli_args`), so every vLLM flag (--dtype,
--max-model-len, --tensor-parallel-size, ...) passes through unchanged.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from rollout_service.ops import logs

EMBEDDED_MODELS = ("tiny-qwen2", "tiny-llava")


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
        description="Serve rollout.v1.RolloutService. --model takes a local HF checkpoint "
        f"or an embedded model name: {', '.join(EMBEDDED_MODELS)} (the default).",
    )
    _add_server_args(parser)
    AsyncEngineArgs.add_cli_args(parser)
    # No --model means the embedded default, not vLLM's hub default.
    parser.set_defaults(model=None)
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

    if args.model is None:
        args.model = "tiny-qwen2"
    if args.model in EMBEDDED_MODELS:
        name = args.model
        args.model = str(ensure_model(name))
        if args.served_model_name is None:
            args.served_model_name = [name]
        if args.tokenizer is None:
            args.tokenizer = args.model
    return AsyncEngineArgs.from_cli_args(args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logs.configure(json_lines="--log-json" in argv)
    # On CPU vLLM sizes its KV cache from this (GiB); its default fraction of
    # host memory fails on small machines. GPU builds ignore it.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    top, rest = _top_parser().parse_known_args(argv[:1])
    args = build_serve_parser().parse_args(argv[1:] + rest)
    from rollout_service.config import from_args
    from rollout_service.server import serve

    config = from_args(args)
    if bool(config.tls_cert) != bool(config.tls_key):
        sys.exit("rollout-service: --tls-cert and --tls-key go together")
    if config.tls_client_ca and not config.tls_cert:
        sys.exit("rollout-service: --tls-client-ca needs --tls-cert and --tls-key")
    if config.chat_template and not os.access(config.chat_template, os.R_OK):
        sys.exit(f"rollout-service: --chat-template {config.chat_template}: no readable file")
    from rollout_service.engine.startup import UnsupportedConfig, check_supported
    from rollout_service.fairness.share import parse_shares

    try:
        parse_shares(config.caller_shares)
    except ValueError as e:
        sys.exit(f"rollout-service: {e}")
    engine_args = _engine_args(args)
    if config.fair_share:
        # Fair share is vLLM's priority scheduling with our priorities.
        if any(a.startswith("--scheduling-policy") for a in argv) and (
            engine_args.scheduling_policy != "priority"
        ):
            sys.exit(
                "rollout-service: --fair-share needs vLLM's --scheduling-policy priority "
                "(set by default); pass --no-fair-share to use another policy"
            )
        engine_args.scheduling_policy = "priority"
    try:
        check_supported(engine_args)
    except UnsupportedConfig as e:
        sys.exit(f"rollout-service: {e}")
    return asyncio.run(serve(config, engine_args))


if __name__ == "__main__":
    sys.exit(main())
