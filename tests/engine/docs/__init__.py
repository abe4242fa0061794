"""Tests against the real vLLM engine: docs."""
