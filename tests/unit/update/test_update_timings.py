"""An update's clock (rollout_service/update/timings.py), engine-free: the
ack's phases add up from the two sides that know them, and a KEEP is held
exactly when its engine pause came past KEEP_HOLD_SECONDS after its commit,
blamed on the phase that took the time."""

from __future__ import annotations

from rollout_service.update.quiesce import Quiesced
from rollout_service.update.timings import KEEP_HOLD_SECONDS, Arrival, ack_timings, keep_held


def _clock(check: float, wait: float, pause: float, running_after=frozenset()):
    arrival = Arrival(
        receive_s=0.2,
        committed_at=10.0,
        checked_at=10.0 + check,
        running=frozenset({"a", "b"}),
    )
    t0 = 10.0 + check + wait
    quiesced = Quiesced(t0=t0, t_paused=t0 + pause, pause_s=pause, running=running_after)
    quiesced.t_reset = quiesced.t_paused + 0.05
    quiesced.resume_s = 0.01
    return arrival, quiesced


def test_the_ack_timings_split_the_update_into_its_phases():
    arrival, quiesced = _clock(check=0.1, wait=0.3, pause=0.02)
    t = ack_timings(arrival, quiesced, t_end=quiesced.t_reset + 0.02, load_s=0.04)
    assert round(t.check_seconds, 6) == 0.1 and round(t.wait_seconds, 6) == 0.3
    assert round(t.pause_seconds, 6) == 0.02 and round(t.resume_seconds, 6) == 0.01
    assert round(t.admission_closed_seconds, 6) == round(0.02 + 0.05 + 0.02, 6)
    assert t.receive_seconds == 0.2 and t.load_seconds == 0.04


def test_a_keep_that_paused_in_time_kept():
    arrival, quiesced = _clock(check=0.01, wait=0.0, pause=KEEP_HOLD_SECONDS - 0.02)
    assert keep_held(arrival, quiesced) is None


def test_a_held_keep_names_the_phase_that_held_it_and_what_ran_out():
    for phase, clock in {
        "check": dict(check=0.9, wait=0.01, pause=0.01),
        "wait": dict(check=0.01, wait=2.0, pause=0.01),
        "pause": dict(check=0.01, wait=0.01, pause=0.7),
    }.items():
        arrival, quiesced = _clock(**clock, running_after=frozenset({"b"}))
        held = keep_held(arrival, quiesced)
        assert held is not None and held.phase == phase, (phase, held)
        assert held.requests_finished == 1 and held.seconds > KEEP_HOLD_SECONDS
        assert f"{phase} " in held.reason and "1 of the 2 generations" in held.reason
