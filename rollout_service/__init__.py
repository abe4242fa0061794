"""rollout-service: an async gRPC service that serves LLM rollouts for RL
trainers on a vLLM engine, with atomic, never-stale weight updates."""

__version__ = "0.1.0"
