"""Code that runs inside vLLM's worker processes (loaded there through the
`vllm.general_plugins` entry point): no event loop, another process, forked.
It imports only the ground modules (handoff/, vllm_compat), vLLM, and
engine/'s process hooks (parent_watch, worker_fork, tiny_models' alias)."""
