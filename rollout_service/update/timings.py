"""Where an update's time went, for its acknowledgement, the metrics and the
log; and whether a PAUSE_MODE_KEEP update kept.

An update's clock, from its first message to its acknowledgement:

    receive -> check -> wait -> [drain] -> pause -> load (decode) -> reset -> resume
    first msg  commit  checked  lock held   paused                  reset    resumed

`Arrival` is what the receiving side knows (update/transfers.py): when the
commit came, how long the checksums took, and which generations were running
in the engine at the commit. `Quiesced` (quiesce.py) is what the quiesce knows.
`ack_timings` puts both into the proto's UpdateTimings.

KEEP promises that running generations are frozen where they are and continue
on the new weights. A KEEP whose engine pause comes much later than the
commit did not keep: every generation that ended meanwhile ran to its end on
the old weights, as if the trainer had asked for WAIT. `keep_held` says when
that happened and by what (the phase that took the time); the ack carries it
(UpdateWeightsResponse.keep_held), `rollout_keep_held_total` counts it and
the log says it, so that it is never silent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from rollout.v1 import rollout_pb2 as pb
from rollout_service.ops import metrics
from rollout_service.update.quiesce import Quiesced

log = logging.getLogger(__name__)

# A KEEP whose engine paused later than this after its commit was held. When
# it keeps, the pause comes 0.01-0.05 s after the commit on the embedded
# model (the bytes' checksums, the lock, the pause); ten times that is held,
# not noise, and still shorter than any rollout worth keeping.
KEEP_HOLD_SECONDS = 0.5


@dataclass(frozen=True)
class Arrival:
    """An update's bytes, as they came in."""

    # From the first message to the commit.
    receive_s: float
    # perf_counter() at the commit (the last message, or CommitUpdate).
    committed_at: float
    # perf_counter() once its bytes were checked.
    checked_at: float
    # Engine requests running at the commit: those a KEEP should keep.
    running: frozenset[str] = frozenset()

    @property
    def check_s(self) -> float:
        return self.checked_at - self.committed_at


def ack_timings(
    arrival: Arrival, quiesced: Quiesced, t_end: float, load_s: float = 0.0, decode_s: float = 0.0
) -> pb.UpdateTimings:
    """The acknowledgement's UpdateTimings; `t_end`: the gate reopened."""
    return pb.UpdateTimings(
        receive_seconds=arrival.receive_s,
        check_seconds=arrival.check_s,
        wait_seconds=max(quiesced.t0 - arrival.checked_at, 0.0),
        drain_seconds=quiesced.drain_s,
        pause_seconds=quiesced.pause_s,
        apply_seconds=quiesced.t_reset - quiesced.t0,
        load_seconds=load_s,
        decode_seconds=decode_s,
        reset_seconds=t_end - quiesced.t_reset,
        resume_seconds=quiesced.resume_s,
        admission_closed_seconds=t_end - quiesced.t0,
    )


def phases(timings: pb.UpdateTimings) -> str:
    """The timings for the log: "receive 0.012s check 0.001s ..."."""
    return " ".join(f"{f.name.removesuffix('_seconds')} {v:.3f}s" for f, v in timings.ListFields())


def keep_held(arrival: Arrival, quiesced: Quiesced) -> pb.KeepHeld | None:
    """Whether a KEEP update was held past KEEP_HOLD_SECONDS between its
    commit and the engine's pause, and by what; None when it kept."""
    held = quiesced.t_paused - arrival.committed_at
    if held <= KEEP_HOLD_SECONDS:
        return None
    phases = {
        "check": arrival.check_s,
        "wait": max(quiesced.t0 - arrival.checked_at, 0.0),
        "drain": quiesced.drain_s,
        "pause": quiesced.pause_s,
    }
    phase = max(phases, key=lambda p: phases[p])
    finished = len(arrival.running - quiesced.running)
    return pb.KeepHeld(
        seconds=held,
        phase=phase,
        requests_finished=finished,
        reason=(
            f"the engine paused {held:.2f}s after the commit (KEEP keeps within "
            f"{KEEP_HOLD_SECONDS}s): "
            + ", ".join(f"{p} {s:.2f}s" for p, s in phases.items())
            + f"; {finished} of the {len(arrival.running)} generations running at the commit "
            "ran to their end on the old weights meanwhile"
        ),
    )


def report_held(version: str, held: pb.KeepHeld) -> None:
    """Counts and logs a KEEP that was held: never silent."""
    metrics.KEEP_HELD.labels(held.phase).inc()
    log.warning("PAUSE_MODE_KEEP update %r was held: %s", version, held.reason)
