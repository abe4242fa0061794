"""The engine's life: start-up and the facts read from it, CPU placement,
sleep, and the parent watch of vLLM's processes."""
