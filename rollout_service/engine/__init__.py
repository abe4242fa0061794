"""The engine's life: start-up and the facts read from it, CPU placement, the
embedded models, and the process hooks of vLLM's processes (the parent
watch, the forked workers)."""
