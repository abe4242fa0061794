"""Tests against the real vLLM engine: sessions."""
