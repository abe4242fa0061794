"""What the benchmarks share and start, never run by hand: the load
generator and its drivers (loadgen.py, drive.py), the servers compared and
their runs (compare_servers.py, compare_runs.py, compare_report.py,
thin_front.py, vllm_serve.py, sink_server.py, push_client.py), the
workloads (mixed.py, chat_turns.py, bigmodel.py) and the profile's split
(profile_split.py). The runnable benchmarks are the modules of
benchmarks/ itself (BENCHMARKS.md)."""
