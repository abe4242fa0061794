"""Tests against the real vLLM engine: generation."""
