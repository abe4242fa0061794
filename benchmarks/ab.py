"""Configurations measured side by side, servers up at once, loads interleaved.

`benchmarks.compare` measures one engine at a time, and the host's speed
moved throughput by half between its rounds (BENCHMARKS.md, stop 21): a
ratio of two configurations measured ten minutes apart carries that swing.
Here every server starts first and stays up; each round drives every side
in turn (in reverse order in every other round, so a drift within a round
favours none), and every ratio is a side over the first side, A, in the same
round, then the median over rounds:

    .venv/bin/python -m benchmarks.ab --sides thin,ours --loads stream --rounds 4
    .venv/bin/python -m benchmarks.ab --sides inprocess,thin,ours --rate 20 --loads stream
    .venv/bin/python -m benchmarks.ab --sides ours,ours --env B:NAME=VALUE ...

A side is `ours` (`rollout-service serve`), `thin` (benchmarks.lib.thin_front),
`inprocess` (benchmarks.inprocess: no server to keep up, so each of its
windows starts its engine anew) or `serve` (`vllm serve`, unary loads only:
POST /v1/completions, placed as compare places it), with the engine arguments, environment and
placement `compare` gives every configuration; `--env LABEL:NAME=VALUE` adds
to one server's environment (to compare a setting against itself). Loads:
`unary`, `stream` (a delta per engine step, with text), `tuned`
(`--tuned-delta-tokens`, omit_text), `many` (GenerateMany: every request of
the load on one stream, the deltas ready at each send in one message;
in-process runs its per-step streams); every load flag of compare applies,
`--rate` included. An idle engine waits on its socket and costs next to
nothing beside the measured one. `--profile` splits each server side's
front-end CPU by component (py-spy; benchmarks.lib.profile_split).
"""

from __future__ import annotations

import argparse
import statistics
import string
import sys

from benchmarks.lib import compare_runs, compare_servers
from benchmarks.lib.compare_report import front_per_engine
from benchmarks.lib.profile_split import format_split

KINDS = ("ours", "thin", "inprocess", "serve")
# load: (drive's driver suffix, tuned StreamOptions, benchmarks.inprocess mode)
LOADS = {
    "unary": ("", False, "unary"),
    "stream": ("-stream", False, "stream"),
    "tuned": ("-stream", True, "stream_tuned"),
    # GenerateMany (the thin front's is its raw-bytes twin): per-step deltas
    # of every request of the load on one stream, batched per send; against
    # in-process per-step streams.
    "many": ("-many", False, "stream"),
}


def _ms(kind: str, percentile: str):
    """A summary's percentile of `kind` (ttft, itl, latency) in ms, or None."""
    return lambda s: (s.get(kind) or {}).get(percentile, 0) * 1000 or None


# (label, summary -> value): what each window prints and each ratio compares
FIGURES = (
    ("tok/s", lambda s: s["output_tokens_per_s"]),
    ("TTFT p50 ms", _ms("ttft", "p50")),
    ("TTFT p90 ms", _ms("ttft", "p90")),
    ("ITL p50 ms", _ms("itl", "p50")),
    ("latency p50 ms", _ms("latency", "p50")),
    ("front CPU/1k", lambda s: s.get("front_cpu_s_per_1k_tokens")),
    ("client CPU/1k", lambda s: s.get("client_cpu_s_per_1k_tokens")),
    ("front/engine", front_per_engine),
)


def side_envs(pairs: list[str], labels: list[str]) -> dict[str, dict[str, str]]:
    """--env LABEL:NAME=VALUE flags, by side label."""
    out: dict[str, dict[str, str]] = {label: {} for label in labels}
    for pair in pairs:
        label, _, assignment = pair.partition(":")
        name, sep, value = assignment.partition("=")
        if label not in out or not sep or not name:
            raise SystemExit(f"--env wants LABEL:NAME=VALUE with LABEL of {labels}, got {pair!r}")
        out[label][name] = value
    return out


class Side:
    """One configuration of the comparison, started and placed as compare does."""

    def __init__(self, label: str, kind: str, env: dict[str, str], args):
        self.label, self.kind, self.server = label, kind, None
        if env and kind != "ours":
            raise SystemExit("--env applies to `ours` sides only")
        if kind == "ours":
            self.server = compare_servers.rollout_server(args, env=env)
        elif kind == "thin":
            self.server = compare_servers.ThinServer(args)
        elif kind == "serve":
            from rollout_service.engine.tiny_models import ensure_model

            self.server = compare_servers.VllmServe(ensure_model(compare_servers.MODEL))

    def describe(self) -> str:
        if self.server is None:
            return f"{self.label}: {self.kind} (an engine per window)"
        where = getattr(self.server, "target", None) or self.server.base  # vllm serve: a URL
        return f"{self.label}: {self.kind} on {where}"

    def wait(self, args) -> None:
        if self.server is not None:
            self.server.wait_ready()
            if self.kind != "serve" or args.pin_serve:  # as compare_runs.run_serve
                compare_servers.place(args, self.server.proc.pid)

    def runs(self, load: str) -> bool:
        """`vllm serve` has no streaming load of this kind (gRPC only)."""
        return self.kind != "serve" or load == "unary"

    def drive(self, args, load: str, vocab: int) -> dict:
        suffix, tuned, mode = LOADS[load]
        if self.server is None:
            return compare_runs.run_inprocess(args, [mode])[f"inprocess_{mode}"]
        s = self.server
        if self.kind == "serve":
            return compare_runs.drive_serve(args, s, vocab)
        driver = ("grpc" if self.kind == "ours" else "thin") + suffix
        flags = compare_runs.stream_flags(args, tuned) if suffix else []
        summary = compare_runs.drive(
            args, driver, s.target, vocab, s.proc.pid, args.profile, flags=flags
        )
        if "front_components" in summary:
            print(
                f"{self.label}={self.kind} {load}: front-end CPU s per 1k output tokens by "
                "component (py-spy):\n"
                + format_split(summary["front_cpu_s_per_1k_tokens"], summary["front_components"]),
                flush=True,
            )
        return summary

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


def round_order(sides: list, n: int) -> list:
    """In order in odd rounds, reversed in even ones: a drift within a round
    (the host's speed moves for minutes at a time) favours no side."""
    return list(sides) if n % 2 else list(sides)[::-1]


def add_ratios(ratios: dict, load: str, got: dict[str, dict]) -> None:
    """Appends X / A of every figure both windows have, for every side X
    after A, to ratios[(load, "X/A", figure)]."""
    base = got.get("A")
    if base is None:  # side A does not run this load
        return
    for label, summary in got.items():
        if label == "A":
            continue
        for figure, get in FIGURES:
            a, x = get(base), get(summary)
            if a and x:
                ratios.setdefault((load, f"{label}/A", figure), []).append(x / a)


def window_line(round_no: int, side: Side, load: str, s: dict) -> str:
    cells = []
    for label, get in FIGURES:
        v = get(s)
        cells.append(f"{label} {'-' if v is None else f'{v:,.3f}' if v < 10 else f'{v:,.0f}'}")
    errors = sum(s["errors"].values())
    return (
        f"round {round_no} {side.label}={side.kind:<9} {load:<6} "
        + "  ".join(cells)
        + f"  steal {s.get('steal_percent', 0):.1f}%  errors {errors}"
    )


def build_parser() -> argparse.ArgumentParser:
    ap = compare_runs.run_parser("python -m benchmarks.ab", __doc__)
    ap.add_argument("--sides", default="thin,ours", help="two or more of " + ",".join(KINDS))
    ap.add_argument("--env", action="append", default=[], metavar="LABEL:NAME=VALUE")
    ap.add_argument("--loads", default="stream", help="of " + ",".join(LOADS))
    ap.set_defaults(rounds=4)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    loads, kinds = args.loads.split(","), args.sides.split(",")
    if unknown := set(loads) - set(LOADS):
        raise SystemExit(f"unknown loads {sorted(unknown)}; of {', '.join(LOADS)}")
    if len(kinds) < 2 or set(kinds) - set(KINDS):
        raise SystemExit(f"--sides wants two or more of {', '.join(KINDS)}")
    labels = list(string.ascii_uppercase[: len(kinds)])
    envs = side_envs(args.env, labels)
    from rollout_service.engine.tiny_models import ensure_model

    vocab = compare_servers.model_vocab(ensure_model(compare_servers.MODEL))
    sides: list[Side] = []
    try:
        # Started one after the other: two engines warming up at once on
        # two cores would only slow both.
        for label, kind in zip(labels, kinds):
            side = Side(label, kind, envs[label], args)
            sides.append(side)
            side.wait(args)
            print(side.describe(), envs[label] or "", flush=True)
        ratios: dict[tuple[str, str, str], list[float]] = {}
        for n in range(1, args.rounds + 1):
            for load in loads:
                got = {}
                for side in round_order(sides, n):
                    if not side.runs(load):
                        continue
                    got[side.label] = side.drive(args, load, vocab)
                    print(window_line(n, side, load, got[side.label]), flush=True)
                add_ratios(ratios, load, got)
        print(f"\nmedians over {args.rounds} rounds (every round's value after)")
        for (load, pair, label), values in ratios.items():
            each = ", ".join(f"{v:.2f}" for v in values)
            print(f"  {load:<6} {pair} {label:<15} {statistics.median(values):7.3f}   {each}")
    finally:
        for side in sides:
            side.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
