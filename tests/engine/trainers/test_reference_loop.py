"""examples/grpo_loop.py, the framework-free reference loop, run as a user
runs it against a real server: bf16 with raw logprobs (the session server)
and float32 with processed logprobs at temperature 0.7 (`fp32_server`)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

LOOP = Path(__file__).resolve().parents[3] / "examples" / "grpo_loop.py"
STEPS = 8

# Bounds on |trainer - service| logprob of a sampled token, on the token's
# own version. float32: both sides compute the same function in float32 and
# differ by reduction order only (measured at most ~1e-6). bf16: the served
# weights are exact on both sides, but both compute in bf16 (8 significant
# bits, a relative step of 2^-8) with different kernels; logits of magnitude
# ~5 round by ~0.02 each (measured mean 5e-3, max 4e-2 over 512 tokens).
BOUNDS = {"bf16": (0.02, 0.15), "fp32": (1e-4, 1e-3)}


def run_loop(target: str, tmp_path: Path, *extra: str) -> list[dict]:
    report = tmp_path / "report.json"
    out = subprocess.run(
        [
            sys.executable,
            str(LOOP),
            "--target",
            target,
            "--steps",
            str(STEPS),
            "--report",
            str(report),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("mismatch over") == STEPS  # it prints every step's figures
    return json.loads(report.read_text())


def check(steps: list[dict], kind: str) -> None:
    mean_bound, max_bound = BOUNDS[kind]
    pushed = [s["pushed_version"] for s in steps]
    first = pushed[0].rsplit("-", 1)[0] + "-0"  # pushed before any rollout
    for k, s in enumerate(steps):
        # Step k's rollouts started on the weights served after step k-2's
        # push and went on, under KEEP, on those of step k-1's push.
        allowed = {first} if k == 0 else {first if k == 1 else pushed[k - 2], pushed[k - 1]}
        assert set(s["rollout_versions"]) <= allowed, (k, s["rollout_versions"], allowed)
        assert s["mismatch_mean"] < mean_bound and s["mismatch_max"] < max_bound, s
        assert 0 <= s["kl"] < mean_bound, s
        assert math.isfinite(s["loss"])
        # The straggler was still running when the rest were back: aborted.
        assert s["aborted_groups"] == 1
        # Every push reset every cache before the kept rollouts went on.
        assert s["caches_reset"] == [
            "CACHE_KIND_PREFIX",
            "CACHE_KIND_MULTIMODAL",
            "CACHE_KIND_ENCODER",
        ]
        if s["stale_mismatch_mean"] is not None:
            # Tokens produced after a KEEP update, scored on the weights
            # before it, are far off; on their tagged version they match:
            # the tags, and so the ratios built on them, are right.
            assert s["tagged_mismatch_after_update"] < mean_bound
            assert s["stale_mismatch_mean"] > 5 * s["tagged_mismatch_after_update"]
    # The first rollouts ran before any trained push; each later step's ran
    # across the push of the step before, and completions that crossed it
    # were running requests it kept (its ack's requests_kept).
    assert steps[0]["requests_kept"] == steps[0]["two_version_completions"] == 0
    for before, s in zip(steps, steps[1:]):
        assert s["crossing"].startswith(f"the push of {before['pushed_version']} kept"), s
        assert s["requests_kept"] > 0 or not s["two_version_completions"], s
    # A KEEP update during rollouts: completions whose tokens carry two versions.
    assert sum(s["two_version_completions"] for s in steps) > 0
    assert sum(s["stale_mismatch_mean"] is not None for s in steps) >= STEPS // 2


@pytest.mark.timeout(300)
def test_reference_loop_bf16_raw_logprobs(server, tmp_path):
    steps = run_loop(server.target, tmp_path)
    check(steps, "bf16")
    # The toy reward improves (measured 0.13 -> 0.28 over 8 steps).
    rewards = [s["reward"] for s in steps]
    assert sum(rewards[-3:]) > sum(rewards[:3]), rewards


def test_reference_loop_fp32_processed_logprobs(fp32_server, tmp_path):
    steps = run_loop(
        fp32_server.target, tmp_path, "--model", str(fp32_server.model), "--temperature", "0.7"
    )
    check(steps, "fp32")
