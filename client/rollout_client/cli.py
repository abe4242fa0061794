"""`rollout-client`: the service from the shell.

    rollout-client info
    rollout-client generate "Once upon a time" --max-tokens 32 --temperature 0 --stream
    rollout-client generate "Name a color." --chat --regex "[a-z]+" --max-tokens 8
    rollout-client push-weights model.safetensors --version step-7 [--keep]
    rollout-client push-weights adapter_dir/ --adapter math --version a-3
    rollout-client remove-adapter math --version a-4
    rollout-client abort REQUEST_ID... | --all
    rollout-client tokenize "Hello" [--chat];  rollout-client detokenize 1 2 3
    rollout-client reset-caches

Human-readable output by default; `--json` prints the response messages as
JSON (proto field names) for scripts. Exit status 1 on an RPC error, with the
status code and the server's message on stderr; 130 on Ctrl-C (a push says
whether its update may have been applied).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from google.protobuf import json_format

from rollout.v1 import rollout_pb2 as pb
from rollout_client.client import ConnectionOptions, RolloutClient, RolloutError
from rollout_client.weights import interrupts
from rollout_client.weights.manifest import ManifestMismatch
from rollout_codecs import dtypes


def _json(msg: Any) -> str:  # any message (protobuf's Message has no stubs here)
    text: str = json_format.MessageToJson(msg, preserving_proto_field_name=True, indent=2)
    return text


def _info(client: RolloutClient, args: argparse.Namespace) -> None:
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
    mode = pb.LogprobsMode.Name(info.logprobs_mode).removeprefix("LOGPROBS_MODE_").lower()
    print(f"logprobs         {mode}")
    print(f"chat template    {'yes' if info.tokenizer.has_chat_template else 'no'}")
    if info.lora_limits.enabled:
        loaded = ", ".join(f"{a.name}@{a.weight_version}" for a in info.lora_adapters) or "none"
        print(f"LoRA adapters    {loaded} (max rank {info.lora_limits.max_rank})")
    print(f"server version   {info.server_version}")


def _nbytes(spec: pb.TensorSpec) -> int:
    return dtypes.nbytes(spec.dtype, spec.shape) if spec.dtype in dtypes.TABLE else 0


def _generate(client: RolloutClient, args: argparse.Namespace) -> None:
    kw = dict(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        n=args.n,
        logprobs=args.logprobs,
        prompt_logprobs=args.prompt_logprobs,
        stop=args.stop or None,
        structured_output=_constraint(args),
        lora_adapter=args.lora or "",
        request_id=args.request_id or "",
    )
    if args.ids:
        kw["prompt_token_ids"] = _ids(args.prompt)
    elif args.chat:
        kw["messages"] = _chat(args.prompt, args.system)
    else:
        kw["prompt_text"] = args.prompt
    if args.stream:
        for delta in client.generate_stream(delta_tokens=args.delta_tokens, **kw):
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


def _ids(text: str) -> list[int]:
    return [int(t) for t in text.replace(",", " ").split()]


def _chat(prompt: str, system: str | None) -> list[dict[str, str]]:
    """The prompt as the user's message, after an optional system message."""
    user = {"role": "user", "content": prompt}
    return [{"role": "system", "content": system}, user] if system else [user]


def _constraint(args: argparse.Namespace) -> pb.StructuredOutput | None:
    given = [x for x in (args.json_schema, args.regex, args.choice) if x]
    if len(given) > 1:
        raise SystemExit("--json-schema, --regex and --choice exclude each other")
    if args.json_schema:
        schema = args.json_schema
        if os.path.isfile(schema):
            with open(schema) as f:
                schema = f.read()
        return pb.StructuredOutput(json_schema=schema)
    if args.regex:
        return pb.StructuredOutput(regex=args.regex)
    if args.choice:
        return pb.StructuredOutput(choice=pb.StructuredOutput.Choices(choices=args.choice))
    return None


def _finish(reason: pb.FinishReason) -> str:
    name: str = pb.FinishReason.Name(reason)
    return name.removeprefix("FINISH_REASON_").lower()


def _adapter_config(args: argparse.Namespace) -> dict[str, Any] | None:
    """PEFT's adapter_config.json: --adapter-config, or the one beside the tensors."""
    if not args.adapter:
        if args.adapter_config:
            raise SystemExit("--adapter-config needs --adapter NAME")
        return None
    path = args.adapter_config or os.path.join(
        args.file if os.path.isdir(args.file) else os.path.dirname(args.file),
        "adapter_config.json",
    )
    if not os.path.isfile(path):
        raise SystemExit(f"--adapter: no PEFT config at {path} (give --adapter-config FILE)")
    with open(path) as f:
        config: dict[str, Any] = json.load(f)
    return config


def _push(client: RolloutClient, args: argparse.Namespace) -> None:
    if args.abort and args.keep:
        raise SystemExit("--abort and --keep exclude each other")
    mode = (
        pb.PAUSE_MODE_ABORT
        if args.abort
        else pb.PAUSE_MODE_KEEP
        if args.keep
        else pb.PAUSE_MODE_WAIT
    )
    ack = client.update_weights(
        args.file,
        args.version,
        pause_mode=mode,
        chunk_bytes=args.chunk_bytes,
        checksum=True,
        progress=not args.json,
        adapter=args.adapter,
        adapter_config=_adapter_config(args),
    )
    _print_ack(ack, args)


def _remove_adapter(client: RolloutClient, args: argparse.Namespace) -> None:
    _print_ack(client.remove_adapter(args.name, args.version), args)


def _print_ack(ack: pb.UpdateWeightsResponse, args: argparse.Namespace) -> None:
    if args.json:
        print(_json(ack))
        return
    t = ack.timings
    if ack.replayed:
        print(f"{ack.weight_version} had been applied already (replayed acknowledgement)")
    print(
        f"now serving {ack.weight_version} (was {ack.previous_weight_version}): "
        f"{ack.tensors_loaded} tensors, {ack.bytes_received / 1e6:.1f} MB; "
        f"receive {t.receive_seconds:.3f}s, apply {t.apply_seconds:.3f}s, "
        f"reset {t.reset_seconds:.3f}s"
    )


def _abort(client: RolloutClient, args: argparse.Namespace) -> None:
    if bool(args.request_ids) == args.all:
        raise SystemExit("abort: name request ids, or --all")
    r = client.abort(args.request_ids, all=args.all)
    if args.json:
        print(_json(r))
        return
    print("aborted: " + (" ".join(r.request_ids) or "nothing was running"))


def _tokenize(client: RolloutClient, args: argparse.Namespace) -> None:
    if args.chat:
        r = client.tokenize(messages=_chat(args.text, args.system))
    else:
        r = client.tokenize(text=args.text)
    print(_json(r) if args.json else " ".join(map(str, r.token_ids)))


def _detokenize(client: RolloutClient, args: argparse.Namespace) -> None:
    r = client.detokenize(_ids(" ".join(args.ids)), skip_special_tokens=args.skip_special)
    print(_json(r) if args.json else r.text)


def _reset(client: RolloutClient, args: argparse.Namespace) -> None:
    r = client.reset_caches()
    if args.json:
        print(_json(r))
        return
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


def connection_options(args: argparse.Namespace) -> ConnectionOptions:
    """ConnectionOptions from add_connection_args' flags."""

    def read(path: str | None) -> bytes | None:
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
    g.add_argument("--delta-tokens", type=int, default=0, help="with --stream: tokens per delta")
    g.add_argument("--chat", action="store_true", help="the prompt is a user chat message")
    g.add_argument("--system", help="with --chat or tokenize --chat: a system message first")
    g.add_argument("--lora", help="generate with this loaded LoRA adapter")
    g.add_argument("--prompt-logprobs", type=int, help="score the prompt (top alternatives)")
    g.add_argument("--request-id", help="the call's id (for abort)")
    g.add_argument("--json-schema", help="constrain to a JSON schema (JSON text or a file)")
    g.add_argument("--regex", help="constrain to a regular expression")
    g.add_argument("--choice", action="append", help="constrain to one of these (repeatable)")
    g.set_defaults(fn=_generate)
    w = sub.add_parser("push-weights", help="push a safetensors file as new weights")
    w.add_argument("file", help="a .safetensors file or folder with checkpoint-format names")
    w.add_argument("--version", required=True, help="the new weight version")
    w.add_argument("--abort", action="store_true", help="abort in-flight requests, not wait")
    w.add_argument(
        "--keep", action="store_true", help="in-flight requests continue on the new weights"
    )
    w.add_argument("--adapter", help="load (or replace) this LoRA adapter instead of the base")
    w.add_argument("--adapter-config", help="its PEFT adapter_config.json (default: beside it)")
    w.add_argument("--chunk-bytes", type=int, default=1 << 20)
    w.set_defaults(fn=_push)
    r = sub.add_parser("remove-adapter", help="unload a LoRA adapter")
    r.add_argument("name")
    r.add_argument("--version", required=True, help="the version the removal is recorded as")
    r.set_defaults(fn=_remove_adapter)
    a = sub.add_parser("abort", help="end running Generate calls (partial tokens returned)")
    a.add_argument("request_ids", nargs="*")
    a.add_argument("--all", action="store_true", help="every running call")
    a.set_defaults(fn=_abort)
    t = sub.add_parser("tokenize", help="text (or a chat message) to token ids")
    t.add_argument("text")
    t.add_argument("--chat", action="store_true", help="render as a user message first")
    t.add_argument("--system", help="with --chat: a system message first")
    t.set_defaults(fn=_tokenize)
    d = sub.add_parser("detokenize", help="token ids to text")
    d.add_argument("ids", nargs="+", help="token ids")
    d.add_argument("--skip-special", action="store_true", help="drop special tokens")
    d.set_defaults(fn=_detokenize)
    sub.add_parser("reset-caches", help="reset every cache").set_defaults(fn=_reset)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        options = connection_options(args)
        with RolloutClient(args.target, timeout=args.timeout, options=options) as client:
            args.fn(client, args)
    except ManifestMismatch as e:  # a RolloutError found before sending: first
        print(f"error: the server would refuse this file: {e.details}", file=sys.stderr)
        return 1
    except RolloutError as e:
        reason = f" [{e.reason}]" if e.reason else ""
        print(f"error: {e.code.name}{reason}: {e.details}", file=sys.stderr)
        return 1
    except interrupts.UpdateInterrupted as e:
        print(interrupts.message(e.version, e.commit_sent, cli=True), file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        return 130  # Ctrl-C: 128 + SIGINT, as a shell reports it
    return 0


if __name__ == "__main__":
    sys.exit(main())
