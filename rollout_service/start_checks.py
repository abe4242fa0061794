"""What refuses a start, said before vLLM is imported.

vLLM's import alone takes 10 to 15 s on a small CPU machine: a mistyped flag,
a missing model folder or a busy port is answered at once instead, in one
paragraph that says what to do. `cli.py` asks twice: on the server's own
flags before the import (`early`), and on the whole parsed command line
after it (`problem`), for the spellings only vLLM's parser reads
(`--caller_shares`, abbreviations).
"""

from __future__ import annotations

import argparse
import difflib
import errno
import os
import socket
from pathlib import Path
from typing import NamedTuple

from rollout_service.config import ServerConfig, add_server_args, from_args
from rollout_service.engine.tiny_models import DEFAULT_MODEL, EMBEDDED_MODELS
from rollout_service.fairness.share import parse_shares

_EMBEDDED = f"{DEFAULT_MODEL} (served when --model is not given) or " + ", ".join(
    m for m in EMBEDDED_MODELS if m != DEFAULT_MODEL
)
MODEL_HELP = (
    f"the folder of a local Hugging Face checkpoint, or an embedded model: {_EMBEDDED}. "
    "Nothing is downloaded from a model hub"
)
USAGE = 2  # argparse's exit status for a usage error


class Refusal(NamedTuple):
    status: int
    text: str


def early(argv: list[str]) -> Refusal | None:
    """The refusal the server's own flags, `--model` and
    `--scheduling-policy` call for, read without vLLM; None if none does or
    the line does not parse without vLLM's options (its parser then says)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    add_server_args(parser)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--scheduling-policy")
    try:
        args, _ = parser.parse_known_args(argv)
    except argparse.ArgumentError:
        return None
    config = from_args(args)
    if refusal := problem(config, args.model, args.scheduling_policy):
        return refusal
    # A busy port too: server.serve asks again just before it binds.
    if text := in_use_problem(config.host, config.port):
        return Refusal(1, f"cannot start: {text}")
    return None


def problem(config: ServerConfig, model: str, scheduling_policy: str | None) -> Refusal | None:
    """What refuses this start's flags; `scheduling_policy` as given (None:
    not given)."""
    if text := model_problem(model):
        return Refusal(USAGE, text)
    if text := _config_problem(config, scheduling_policy):
        return Refusal(1, text)
    return None


def _config_problem(config: ServerConfig, scheduling_policy: str | None) -> str | None:
    if bool(config.tls_cert) != bool(config.tls_key):
        return "--tls-cert and --tls-key go together"
    if config.tls_client_ca and not config.tls_cert:
        return "--tls-client-ca needs --tls-cert and --tls-key"
    if config.chat_template and not os.access(config.chat_template, os.R_OK):
        return f"--chat-template {config.chat_template}: no readable file"
    try:
        parse_shares(config.caller_shares)
    except ValueError as e:
        return str(e)
    # Fair share is vLLM's priority scheduling with our priorities.
    if config.fair_share and scheduling_policy not in (None, "priority"):
        return (
            "--fair-share needs vLLM's --scheduling-policy priority "
            "(set by default); pass --no-fair-share to use another policy"
        )
    return None


def model_problem(model: str) -> str | None:
    """What is wrong with `--model`, in one paragraph that says what to do;
    None if it names an embedded model or something vLLM can read. Asked
    before anything starts: vLLM takes any other name for a model-hub id and
    fails only once its engine starts, with a traceback about repo ids."""
    if model in EMBEDDED_MODELS:
        return None
    path = Path(model).expanduser()
    if path.is_file() or (path / "config.json").is_file() or (path / "params.json").is_file():
        return None  # a checkpoint folder (HF or Mistral format), or a GGUF file
    if path.is_dir():
        found = f"{path.absolute()} is a folder without a config.json"
    else:
        found = f"there is no file or folder at {path.absolute()}"
    close = difflib.get_close_matches(model, EMBEDDED_MODELS, n=1)
    guess = f" (did you mean {close[0]}?)" if close else ""
    return (
        f"--model {model}: {found}{guess}. --model takes {MODEL_HELP}: to serve a model from "
        "the Hugging Face Hub, download it first (hf download ORG/NAME --local-dir DIR) "
        "and pass --model DIR."
    )


def in_use_problem(host: str, port: int) -> str | None:
    """What to do when something already listens on HOST:PORT; None if
    nothing does. Asked before gRPC binds, which would print its own error and
    an internal one, neither naming --port."""
    if port == 0:
        return None
    try:
        addresses = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError:
        return None  # gRPC says what is wrong with the host
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            # As gRPC binds: a port left in TIME_WAIT by a stopped server is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    return in_use(host, port)
    return None


def in_use(host: str, port: int) -> str:
    return (
        f"{host}:{port} is in use: another server listens there (a rollout-service "
        "started earlier?). Stop it, or start this one on another port: --port "
        f"{port + 1}, say, or --port 0 for any free one (the log names it)"
    )
