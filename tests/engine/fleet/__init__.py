"""Tests against the real vLLM engine: fleet."""
