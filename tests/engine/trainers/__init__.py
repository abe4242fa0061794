"""Tests against the real vLLM engine: trainers."""
