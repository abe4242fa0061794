"""Drives rollout_service.engine.core_fork without vLLM, as a program of its
own (the fork needs a process with one thread): `python -m
tests.support.fork_ahead MODE OUT` forks ahead, changes what MODE says, starts
`report` through the context vLLM's engine core would get, and prints what
happened as JSON. Used by tests/unit/server/test_core_fork.py."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import sys
import time

from rollout_service.engine import core_fork

# True in this process and in a copy of it; False in a fresh interpreter.
STATE = {"copied": False}


def report(out: str, conn=None) -> None:
    with open(out, "w") as f:
        json.dump(
            {
                "pid": os.getpid(),
                "copied": STATE["copied"],
                "late": os.environ.get("VLLM_USE_AOT_COMPILE"),
                "parent": multiprocessing.parent_process().pid,
                "conn": conn is not None and conn.recv(),
            },
            f,
        )
    sys.exit(5)


def main() -> None:
    mode, out = sys.argv[1], sys.argv[2]
    logging.basicConfig(level=logging.INFO)
    # As in a terminal (a background job starts with Ctrl-C ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # vLLM's door (vllm_compat) is not what this drives.
    core_fork.vllm_compat.choose_engine_core_context = lambda choose: True
    STATE["copied"] = True
    assert core_fork.fork_ahead(cpu_host=True)
    child = core_fork._ahead.pid
    if mode == "away":  # the server ends before its engine starts
        print(json.dumps({"child": child}), flush=True)
        return
    os.environ["VLLM_USE_AOT_COMPILE"] = "0"  # read on use: taken as it is
    if mode == "other":
        os.environ["SOME_SETTING"] = "1"  # nothing says when it is read
    if mode == "ctrl-c":  # the terminal's Ctrl-C reaches the whole group
        time.sleep(0.5)
        os.kill(child, signal.SIGINT)
        time.sleep(0.5)
    context = core_fork._context(multiprocessing.get_context("spawn"))
    args: tuple = (out,)
    if mode == "descriptors":
        ours, theirs = context.Pipe()
        ours.send("through the pipe")
        args = (out, theirs)
    p = context.Process(target=report, args=args)
    p.start()
    p.join(120)
    print(json.dumps({"child": child, "exitcode": p.exitcode, "pid": p.pid}), flush=True)


if __name__ == "__main__":
    main()
