"""Tests against the real vLLM engine: weights."""
