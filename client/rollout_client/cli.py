"""`rollout-client`: the service from the shell.

    rollout-client info
    rollout-client generate "Once upon a time" --max-tokens 32 --temperature 0 --stream
    rollout-client push-weights model.safetensors --version step-7
    rollout-client reset-caches

Human-readable output by default; `--json` prints the response messages as
JSON (proto field names) for scripts. Exit status 1 on an RPC error, with the
status code and the server's message on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys

from google.protobuf import json_format

from rollout_client import dtypes
from rollout_client.client import ConnectionOptions, RolloutClient, RolloutError
from rollout_client.push import ManifestMismatch


def _json(msg) -> str:
    return json_format.MessageToJson(msg, preserving_proto_field_name=True, indent=2)


def _info(client: RolloutClient, args) -> None:
    info = client.server_info()
    if args.json:
        print(_json(info))
        return
    total = sum(_nbytes(p) for p in info.parameters)
    print(f"model            {info.model}")
    print(f"weight version   {info.weight_version}{'  (DEGRADED)' if info.degraded else ''}")
    print(f"max_model_len    {info.max_model_len}")
    print(f"vocab size       {info.vocab_size}")
    print(f"images           {'yes' if info.supports_images else 'no'}")
    print(f"parameters       {len(info.parameters)} tensors, {total / 1e6:.1f} MB")
    print(f"max message      {info.max_message_bytes} bytes")
    print(f"server version   {info.server_version}")


def _nbytes(spec) -> int:
    return dtypes.nbytes(spec.dtype, spec.shape) if spec.dtype in dtypes.TABLE else 0


def _generate(client: RolloutClient, args) -> None:
    kw = dict(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        n=args.n,
        logprobs=args.logprobs,
        stop=args.stop or None,
    )
    if args.ids:
        kw["prompt_token_ids"] = [int(t) for t in args.prompt.replace(",", " ").split()]
    else:
        kw["prompt_text"] = args.prompt
    if args.stream:
        for delta in client.generate_stream(**kw):
            if args.json:
                print(json_format.MessageToJson(delta, preserving_proto_field_name=True))
            else:
                sys.stdout.write(delta.text)
                sys.stdout.flush()
        if not args.json:
            print()
        return
    r = client.generate(**kw)
    if args.json:
        print(_json(r))
        return
    for c in r.completions:
        if len(r.completions) > 1:
            print(f"--- completion {c.index}")
        print(c.text)
        print(f"[{len(c.token_ids)} tokens, {_finish(c.finish_reason)}]", file=sys.stderr)
    print(f"[weight version {r.weight_version}]", file=sys.stderr)


def _finish(reason: int) -> str:
    from rollout.v1 import rollout_pb2 as pb

    return pb.FinishReason.Name(reason).removeprefix("FINISH_REASON_").lower()


def _push(client: RolloutClient, args) -> None:
    from rollout.v1 import rollout_pb2 as pb

    mode = pb.PAUSE_MODE_ABORT if args.abort else pb.PAUSE_MODE_WAIT
    ack = client.update_weights(
        args.file,
        args.version,
        pause_mode=mode,
        chunk_bytes=args.chunk_bytes,
        checksum=True,
        progress=not args.json,
    )
    if args.json:
        print(_json(ack))
        return
    t = ack.timings
    print(
        f"now serving {ack.weight_version} (was {ack.previous_weight_version}): "
        f"{ack.tensors_loaded} tensors, {ack.bytes_received / 1e6:.1f} MB; "
        f"receive {t.receive_seconds:.3f}s, apply {t.apply_seconds:.3f}s, "
        f"reset {t.reset_seconds:.3f}s"
    )


def _reset(client: RolloutClient, args) -> None:
    r = client.reset_caches()
    if args.json:
        print(_json(r))
        return
    from rollout.v1 import rollout_pb2 as pb

    for x in r.results:
        name = pb.CacheKind.Name(x.cache).removeprefix("CACHE_KIND_").lower()
        print(f"{name:12} {'reset' if x.reset else 'NOT reset: ' + x.detail}")


def add_connection_args(p: argparse.ArgumentParser) -> None:
    """--token and TLS files, shared by every tool that talks to a server."""
    p.add_argument(
        "--token",
        default=os.environ.get("ROLLOUT_TOKEN"),
        help="bearer token (default: $ROLLOUT_TOKEN, which keeps it out of `ps`)",
    )
    p.add_argument("--tls-ca", help="PEM CA of the server's certificate: connect with TLS")
    p.add_argument("--tls-cert", help="PEM client certificate, for mutual TLS (with --tls-key)")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert")


def connection_options(args) -> ConnectionOptions:
    """ConnectionOptions from add_connection_args' flags."""

    def read(path):
        if path is None:
            return None
        with open(path, "rb") as f:
            return f.read()

    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit("--tls-cert and --tls-key go together")
    if args.tls_cert and not args.tls_ca:
        raise SystemExit("--tls-cert needs --tls-ca")
    return ConnectionOptions(
        token=args.token,
        root_certificates=read(args.tls_ca),
        certificate_chain=read(args.tls_cert),
        private_key=read(args.tls_key),
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rollout-client", description=__doc__.splitlines()[0])
    p.add_argument("--target", default="127.0.0.1:50051", help="server address (host:port)")
    p.add_argument("--timeout", type=float, default=600.0, help="deadline of each call, seconds")
    p.add_argument("--json", action="store_true", help="print responses as JSON")
    add_connection_args(p)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="describe the server and its model").set_defaults(fn=_info)
    g = sub.add_parser("generate", help="generate from a prompt")
    g.add_argument("prompt", help="prompt text, or token ids with --ids")
    g.add_argument("--ids", action="store_true", help="the prompt is token ids")
    g.add_argument("--max-tokens", type=int)
    g.add_argument("--temperature", type=float)
    g.add_argument("--top-p", type=float)
    g.add_argument("--top-k", type=int)
    g.add_argument("--seed", type=int)
    g.add_argument("-n", type=int)
    g.add_argument("--logprobs", type=int, help="top alternatives per token")
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--stream", action="store_true", help="print tokens as they come")
    g.set_defaults(fn=_generate)
    w = sub.add_parser("push-weights", help="push a safetensors file as new weights")
    w.add_argument("file", help="a .safetensors file with checkpoint-format names")
    w.add_argument("--version", required=True, help="the new weight version")
    w.add_argument("--abort", action="store_true", help="abort in-flight requests, not wait")
    w.add_argument("--chunk-bytes", type=int, default=1 << 20)
    w.set_defaults(fn=_push)
    sub.add_parser("reset-caches", help="reset every cache").set_defaults(fn=_reset)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        options = connection_options(args)
        with RolloutClient(args.target, timeout=args.timeout, options=options) as client:
            args.fn(client, args)
    except RolloutError as e:
        print(f"error: {e.code.name}: {e.details}", file=sys.stderr)
        return 1
    except ManifestMismatch as e:
        print(f"error: the server would refuse this file: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
