"""Generation requests to engine inputs (prompts, tokenizing, sampling and
structured outputs) and engine outputs to rollout.v1 responses."""
