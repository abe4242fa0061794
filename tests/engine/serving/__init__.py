"""Tests against the real vLLM engine: serving."""
