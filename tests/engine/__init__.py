"""Tests against the real vLLM engine, by concern."""
