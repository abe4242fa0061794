"""Tests against the real vLLM engine: openai."""
