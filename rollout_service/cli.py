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
from dataclasses import fields

from rollout_service import logs

EMBEDDED_MODELS = ("tiny-qwen2", "tiny-llava")


def _add_server_args(parser) -> None:
    from rollout_service.server import ServerConfig

    d = ServerConfig()
    g = parser.add_argument_group("rollout-service")
    g.add_argument("--host", default=d.host, help="address to listen on (default: %(default)s)")
    g.add_argument("--port", type=int, default=d.port, help="port to listen on; 0 picks one")
    g.add_argument(
        "--grace-seconds",
        type=float,
        default=d.grace_seconds,
        help="time in-flight calls get to finish on SIGTERM/SIGINT (default: %(default)s)",
    )
    g.add_argument(
        "--max-message-bytes",
        type=int,
        default=d.max_message_bytes,
        help="largest gRPC message, both directions (default: %(default)s)",
    )
    g.add_argument(
        "--max-update-bytes",
        type=int,
        default=None,
        help="largest UpdateWeights payload (default: the model's size plus 25%% and 64 MiB)",
    )
    g.add_argument(
        "--initial-weight-version",
        default=d.initial_weight_version,
        help="version reported for the weights loaded at start (default: %(default)s)",
    )
    g.add_argument(
        "--tokens-file",
        help="enable bearer-token auth: a file of 'role:token' lines, roles generate and "
        "admin (or set $ROLLOUT_SERVICE_TOKENS='role:token,...'; never on the command line)",
    )
    g.add_argument(
        "--protect-health",
        action="store_true",
        help="require a token for health checking and reflection too",
    )
    g.add_argument("--tls-cert", help="PEM server certificate: serve TLS")
    g.add_argument("--tls-key", help="PEM private key of --tls-cert")
    g.add_argument("--tls-client-ca", help="PEM CA: require client certificates (mutual TLS)")
    g.add_argument(
        "--max-concurrent-rpcs",
        type=int,
        default=d.max_concurrent_rpcs,
        help="RPCs of any kind at once (default: %(default)s)",
    )
    g.add_argument(
        "--max-queued-generate",
        type=int,
        default=d.max_queued_generate,
        help="Generate calls running or waiting (default: %(default)s)",
    )
    g.add_argument(
        "--max-generations-per-stream",
        type=int,
        default=d.max_generations_per_stream,
        help="GenerateMany: generations of one stream running at once; later ones wait and "
        "the stream is not read meanwhile (default: %(default)s)",
    )
    g.add_argument(
        "--max-stream-tokens",
        type=int,
        default=d.max_stream_tokens,
        help="GenerateMany: a stream's running generations may hold at most this many tokens, "
        "each counted as max_tokens x n x (1 + logprobs) (default: %(default)s)",
    )
    g.add_argument("--max-prompt-tokens", type=int, help="longest prompt (default: the context)")
    g.add_argument(
        "--drain-timeout-seconds",
        type=float,
        default=d.drain_timeout_seconds,
        help="longest wait for in-flight Generate calls before an update or cache reset; "
        "those still running then are aborted (default: %(default)s)",
    )
    g.add_argument(
        "--update-idle-timeout-seconds",
        type=float,
        default=d.update_idle_timeout_seconds,
        help="an open update (staged, or an UpdateWeights stream between two messages) idle "
        "for longer is discarded (default: %(default)s)",
    )
    g.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port")
    g.add_argument(
        "--log-json", action="store_true", help="log JSON lines (with request ids) to stderr"
    )
    g.add_argument(
        "--no-prefault-staging",
        dest="prefault_staging",
        action="store_false",
        help="do not touch the staging memory's pages at start (it is reserved either way; "
        "the first update then pays the page faults)",
    )
    g.add_argument(
        "--weight-broadcast",
        action="store_true",
        help="with several workers: only the first reads each update from the staging region "
        "and broadcasts it to the others over vLLM's process group (as workers on other hosts "
        "would need)",
    )
    g.add_argument(
        "--no-cpu-placement",
        dest="cpu_placement",
        action="store_false",
        help="on a CPU host, leave this server and vLLM's engine core free to run on the cores "
        "vLLM binds its worker to (by default they are moved off them)",
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

    from rollout_service.tiny_models import ensure_model

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
    from rollout_service.server import ServerConfig, serve

    # Every server flag's dest is the ServerConfig field of the same name
    # (argparse would refuse an engine flag with the same option string).
    config = ServerConfig(
        **{f.name: getattr(args, f.name) for f in fields(ServerConfig) if hasattr(args, f.name)}
    )
    if bool(config.tls_cert) != bool(config.tls_key):
        sys.exit("rollout-service: --tls-cert and --tls-key go together")
    if config.tls_client_ca and not config.tls_cert:
        sys.exit("rollout-service: --tls-client-ca needs --tls-cert and --tls-key")
    from rollout_service.engine import UnsupportedConfig, check_supported

    engine_args = _engine_args(args)
    try:
        check_supported(engine_args)
    except UnsupportedConfig as e:
        sys.exit(f"rollout-service: {e}")
    return asyncio.run(serve(config, engine_args))


if __name__ == "__main__":
    sys.exit(main())
