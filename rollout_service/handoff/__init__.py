"""The hand-off between the server's update path and the weight backend in
vLLM's worker processes: the shared-memory staging region the server writes
(region.py) and the descriptor of each tensor lying in it (staged_tensor.py);
and, for tests only, the fault file both read (faults.py).
The ground both sides import; it imports nothing else of the service."""
