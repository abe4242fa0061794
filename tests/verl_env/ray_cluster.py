"""Runs in the verl venv (tests/verl_env/build.py): the Ray cluster that
every drive of a test run joins (tests/support/verl_drive.py starts it with
the run's first drive). A drive that started Ray itself spent about 3 s on
the start and 1.3 s on the stop; a join and a leave take 0.04 s and 0.3 s.

argv[1]: the folder for Ray's session files (the caller removes it). The
cluster's token comes from the environment (RAY_AUTH_TOKEN with
RAY_AUTH_MODE=token), so nothing is written to ~/.ray either. Prints the
address the drives join, then holds the cluster until its stdin closes
(the test run ended, or died).
"""

from __future__ import annotations

import sys

import ray

if __name__ == "__main__":
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=sys.argv[1])
    print(ray.get_runtime_context().gcs_address, flush=True)
    sys.stdin.read()
    ray.shutdown()
