"""The command line is made from ServerConfig: every field has a flag with
its docstring as help, and the flags parse back into the config; flags that
cannot work together are refused at start, before any engine."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from rollout_service import cli
from rollout_service.cli import build_serve_parser
from rollout_service.config import ServerConfig, field_docs, from_args
from rollout_service.ops import logs


def test_every_field_has_a_documented_flag():
    docs = field_docs(ServerConfig)
    assert set(docs) == {f.name for f in fields(ServerConfig)}
    assert all(len(d) > 10 for d in docs.values())
    text = build_serve_parser().format_help()
    for f in fields(ServerConfig):
        flag = f.name.replace("_", "-")
        on = f"--no-{flag}" if f.default is True else f"--{flag}"
        assert on in text, on


def test_no_flags_give_the_defaults():
    assert from_args(build_serve_parser().parse_args([])) == ServerConfig()


def test_flags_reach_their_fields():
    args = build_serve_parser().parse_args(
        ["--no-cpu-placement", "--protect-health", "--max-stream-tokens", "5",
         "--max-update-bytes", "7", "--grace-seconds", "2.5", "--tokens-file", "t"]
    )  # fmt: skip
    config = from_args(args)
    assert (config.cpu_placement, config.protect_health) == (False, True)
    assert (config.max_stream_tokens, config.max_update_bytes) == (5, 7)
    assert (config.grace_seconds, config.tokens_file) == (2.5, "t")


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--caller-shares", "root=2"], "--caller-shares: 'root=2': expected KEY=N"),
        (["--scheduling-policy", "fcfs"], "pass --no-fair-share to use another policy"),
    ],
)
def test_fair_share_flags_that_cannot_work_are_refused_at_start(flags, says):
    # Refused before any engine starts (rollout_service/start_checks.py), with
    # what to do, and before vLLM is imported: at once, none of its log lines.
    p = subprocess.run(
        [str(Path(sys.executable).with_name("rollout-service")), "serve", *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode != 0 and says in p.stderr, p.stderr[-2000:]
    assert "vllm" not in p.stderr, p.stderr[-2000:]


def test_a_spelling_only_vllms_parser_reads_is_refused_after_it(monkeypatch, capsys):
    """vLLM's parser takes --caller_shares for --caller-shares; the early check
    does not know that spelling, so the whole command line is checked again."""
    monkeypatch.setattr(logs, "configure", lambda json_lines: None)  # pytest's handlers stay
    with pytest.raises(SystemExit) as refused:
        cli._serve(["serve", "--caller_shares", "root=2"])
    assert refused.value.code == 1
    assert "--caller-shares: 'root=2': expected KEY=N" in capsys.readouterr().err
