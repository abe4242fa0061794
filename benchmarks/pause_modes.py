"""The three pause modes side by side, in one run: what an update costs the
trainer that pushes it and the rollouts it lands on.

One server on the embedded model. Each round starts `--rollouts` greedy
streams of the lengths given (`--lengths`, printed), waits until each has
produced `--before` tokens, then pushes a full update in one mode; the modes
take turns round after round (KEEP, WAIT, ABORT, KEEP, ...), so drift hits
all three alike. Per mode, medians over the rounds:

- ack: seconds from the push's first byte to its acknowledgement (what the
  trainer waits for);
- closed: admission_closed_seconds from the ack (new calls wait that long);
- stall: the longest gap between two deltas of a rollout across the update
  (a kept rollout freezes, a drained one does not, an aborted one ends);
- old/new: tokens of the in-flight rollouts generated on the old and the new
  weights; aborted: rollouts the update ended;
- the server-side phases (check, wait, drain, pause, load, reset, resume);
- held: KEEP acks that came with keep_held (update/timings.py).

And the ratios KEEP/WAIT and KEEP/ABORT of the ack. Run it with nothing else
running:

    .venv/bin/python -m benchmarks.pause_modes
    .venv/bin/python -m benchmarks.pause_modes --rounds 10 --lengths 500,1000,2000
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from dataclasses import dataclass, field

from harness.serverproc import ServerProcess
from harness.weights_util import random_weights
from rollout_client import RolloutClient, pb

MODES = {"keep": pb.PAUSE_MODE_KEEP, "wait": pb.PAUSE_MODE_WAIT, "abort": pb.PAUSE_MODE_ABORT}
PHASES = ("check", "wait", "drain", "pause", "load", "reset", "resume")


@dataclass
class Mode:
    ack: list[float] = field(default_factory=list)
    closed: list[float] = field(default_factory=list)
    stall: list[float] = field(default_factory=list)
    old: list[int] = field(default_factory=list)
    new: list[int] = field(default_factory=list)
    aborted: list[int] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    held: int = 0


class Rollout(threading.Thread):
    """One greedy stream: its delta arrival times and per-version counts."""

    def __init__(self, client: RolloutClient, length: int, seed: int) -> None:
        super().__init__()
        self.client, self.length, self.seed = client, length, seed
        self.times: list[float] = []
        self.counts: dict[str, int] = {}
        self.finish = pb.FINISH_REASON_UNSPECIFIED

    def run(self) -> None:
        prompt = [1 + (self.seed * 7 + i) % 400 for i in range(40)]
        for m in self.client.generate_stream(
            request_id=uuid.uuid4().hex,
            prompt_token_ids=prompt,
            max_tokens=self.length,
            temperature=0,
            ignore_eos=True,
        ):
            self.times.append(time.monotonic())
            for s in m.version_spans:
                self.counts[s.weight_version] = self.counts.get(s.weight_version, 0) + s.count
            if m.finish_reason:
                self.finish = m.finish_reason

    @property
    def produced(self) -> int:
        return sum(self.counts.values())


def _round(
    client: RolloutClient, params, mode: str, lengths: list[int], before: int, seed: int
) -> dict:
    old = client.server_info().weight_version
    weights = random_weights(params, seed=seed)
    rollouts = [Rollout(client, n, seed * 10 + i) for i, n in enumerate(lengths)]
    for r in rollouts:
        r.start()
    deadline = time.monotonic() + 120
    while any(r.produced < before for r in rollouts):
        assert time.monotonic() < deadline, "the rollouts did not start"
        time.sleep(0.002)
    t_push = time.monotonic()
    ack = client.update_weights(weights, f"{mode}-{seed}", pause_mode=MODES[mode])
    t_ack = time.monotonic()
    for r in rollouts:
        r.join()
    stalls = []
    for r in rollouts:
        gaps = [b - a for a, b in zip(r.times, r.times[1:]) if b > t_push - 0.5]
        stalls.append(max(gaps, default=0.0))
    return {
        "ack": t_ack - t_push,
        "closed": ack.timings.admission_closed_seconds,
        "stall": max(stalls),
        "old": sum(r.counts.get(old, 0) for r in rollouts),
        "new": sum(r.counts.get(ack.weight_version, 0) for r in rollouts),
        "aborted": sum(r.finish == pb.FINISH_REASON_ABORT for r in rollouts),
        "phases": {p: getattr(ack.timings, f"{p}_seconds") for p in PHASES},
        "held": ack.HasField("keep_held"),
    }


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6, help="rounds per mode")
    ap.add_argument("--lengths", default="250,500,1000,2000", help="in-flight rollouts' tokens")
    ap.add_argument("--before", type=int, default=16, help="tokens each has before the push")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    proc = ServerProcess()
    try:
        proc.wait_ready()
        results = {m: Mode() for m in MODES}
        with RolloutClient(proc.target, timeout=300) as client:
            params = client.server_info().parameters
            seed = 0
            for _ in range(args.rounds):
                for mode in MODES:
                    seed += 1
                    r = _round(client, params, mode, lengths, args.before, seed)
                    m = results[mode]
                    for k in ("ack", "closed", "stall", "old", "new", "aborted"):
                        getattr(m, k).append(r[k])
                    for p, v in r["phases"].items():
                        m.phases[p].append(v)
                    m.held += r["held"]
        print(f"in-flight rollouts per round: {lengths} tokens, pushed after {args.before} each;")
        print(f"{args.rounds} rounds per mode, modes interleaved; medians")
        print("| mode | ack s | closed s | stall s | old tok | new tok | aborted | held |")
        print("|---|---|---|---|---|---|---|---|")
        for name, m in results.items():
            print(
                f"| {name} | {_med(m.ack):.3f} | {_med(m.closed):.3f} | {_med(m.stall):.3f} "
                f"| {_med(m.old):.0f} | {_med(m.new):.0f} | {_med(m.aborted):.0f} "
                f"| {m.held}/{len(m.ack)} |"
            )
        print("server phases, medians (s):")
        for name, m in results.items():
            print(f"  {name}: " + " ".join(f"{p} {_med(v):.4f}" for p, v in m.phases.items()))
        keep = _med(results["keep"].ack)
        print(
            f"ack ratio KEEP/WAIT {keep / _med(results['wait'].ack):.3f}, "
            f"KEEP/ABORT {keep / _med(results['abort'].ack):.3f}"
        )
    finally:
        proc.stop()


if __name__ == "__main__":
    main()
