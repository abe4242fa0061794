"""Code that runs inside vLLM's worker processes (loaded there through the
`vllm.general_plugins` entry point): no event loop, another process, forked.
It imports only the ground modules (staging, staged) and vLLM."""
