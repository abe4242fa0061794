"""A against B, both servers up at once, their loads interleaved.

`benchmarks.compare` measures one engine at a time, and the host's speed
moved throughput by half between its rounds (BENCHMARKS.md, stop 21): a
ratio of two configurations measured ten minutes apart carries that swing.
Here both servers start first and stay up; each round drives A then B (B
then A in every other round, so a drift within a round favours neither),
and every ratio is B over A in the same round, then the median:

    .venv/bin/python -m benchmarks.ab --a thin --b ours --loads stream --rounds 4
    .venv/bin/python -m benchmarks.ab --a ours --b ours --b-env NAME=VALUE ...

A side is `ours` (`rollout-service serve`) or `thin` (benchmarks.thin_front),
with the engine arguments, environment and placement `compare` gives every
configuration; `--a-env/--b-env NAME=VALUE` adds to one side's environment
(to compare a setting against itself). Loads: `unary`, `stream` (a delta per
engine step, with text), `tuned` (`--tuned-delta-tokens`, omit_text). An idle
engine waits on its socket and costs next to nothing beside the measured one.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from benchmarks import compare

LOADS = {"unary": ("", False), "stream": ("-stream", False), "tuned": ("-stream", True)}
# (label, summary -> value): what each window prints and each ratio compares
FIGURES = (
    ("tok/s", lambda s: s["output_tokens_per_s"]),
    ("TTFT p50 ms", lambda s: (s.get("ttft") or {}).get("p50", 0) * 1000 or None),
    ("TTFT p90 ms", lambda s: (s.get("ttft") or {}).get("p90", 0) * 1000 or None),
    ("front CPU/1k", lambda s: s["front_cpu_s_per_1k_tokens"]),
    ("client CPU/1k", lambda s: s["client_cpu_s_per_1k_tokens"]),
    ("front/engine", compare.front_per_engine),
)


def env_pairs(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"--a-env/--b-env want NAME=VALUE, got {pair!r}")
        out[name] = value
    return out


class Side:
    """One server of the comparison, started and placed as compare does."""

    def __init__(self, label: str, kind: str, env: dict[str, str], args):
        self.label, self.kind = label, kind
        if kind == "ours":
            self.server = compare.ServerProcess(
                "--model",
                compare.MODEL,
                *compare.ENGINE_ARGS,
                *compare.placement_args(args),
                env={**compare.ENGINE_ENV, **env},
            )
        else:
            if env:
                raise SystemExit("--a-env/--b-env apply to `ours` only")
            self.server = compare.ThinServer(args)
        self.pid, self.target = self.server.proc.pid, self.server.target

    def wait(self, args) -> None:
        self.server.wait_ready()
        compare.place(args, self.pid)

    def drive(self, args, load: str, vocab: int) -> dict:
        suffix, tuned = LOADS[load]
        driver = ("grpc" if self.kind == "ours" else "thin") + suffix
        flags = compare.stream_flags(args, tuned) if suffix else []
        return compare.drive(args, driver, self.target, vocab, self.pid, flags=flags)


def window_line(round_no: int, side: Side, load: str, s: dict) -> str:
    cells = []
    for label, get in FIGURES:
        v = get(s)
        cells.append(f"{label} {'-' if v is None else f'{v:,.3f}' if v < 10 else f'{v:,.0f}'}")
    errors = sum(s["errors"].values())
    return (
        f"round {round_no} {side.label}={side.kind:<4} {load:<6} "
        + "  ".join(cells)
        + f"  steal {s['steal_percent']:.1f}%  errors {errors}"
    )


def round_order(sides: list, n: int) -> list:
    """A then B in odd rounds, B then A in even ones: a drift within a round
    (the host's speed moves for minutes at a time) favours neither side."""
    return list(sides) if n % 2 else list(sides)[::-1]


def add_ratios(ratios: dict, load: str, a: dict, b: dict) -> None:
    """Appends B / A of every figure both windows have to ratios[(load, figure)]."""
    for label, get in FIGURES:
        va, vb = get(a), get(b)
        if va and vb:
            ratios.setdefault((load, label), []).append(vb / va)


def build_parser() -> argparse.ArgumentParser:
    ap = compare.build_parser()
    ap.prog, ap.description = "python -m benchmarks.ab", __doc__.split("\n\n")[0]
    ap.add_argument("--a", choices=("ours", "thin"), default="thin")
    ap.add_argument("--b", choices=("ours", "thin"), default="ours")
    ap.add_argument("--a-env", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--b-env", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--loads", default="stream", help="of " + ",".join(LOADS))
    ap.set_defaults(rounds=4)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    loads = args.loads.split(",")
    if unknown := set(loads) - set(LOADS):
        raise SystemExit(f"unknown loads {sorted(unknown)}; of {', '.join(LOADS)}")
    from rollout_service.tiny_models import ensure_model

    vocab = compare.model_vocab(ensure_model(compare.MODEL))
    sides = []
    try:
        # Started one after the other: two engines warming up at once on
        # two cores would only slow both.
        for label, kind, env in (("A", args.a, args.a_env), ("B", args.b, args.b_env)):
            side = Side(label, kind, env_pairs(env), args)
            sides.append(side)
            side.wait(args)
            print(f"{label}: {kind} on {side.target} env {env_pairs(env)}", flush=True)
        ratios: dict[tuple[str, str], list[float]] = {}
        for n in range(1, args.rounds + 1):
            for load in loads:
                got = {}
                for side in round_order(sides, n):
                    got[side.label] = side.drive(args, load, vocab)
                    print(window_line(n, side, load, got[side.label]), flush=True)
                add_ratios(ratios, load, got["A"], got["B"])
        print(f"\nB / A, medians over {args.rounds} rounds (every round's value after)")
        for (load, label), values in ratios.items():
            each = ", ".join(f"{v:.2f}" for v in values)
            print(f"  {load:<6} {label:<14} {statistics.median(values):7.3f}   {each}")
    finally:
        for side in sides:
            side.server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
