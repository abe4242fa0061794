"""Engine-free tests: server."""
