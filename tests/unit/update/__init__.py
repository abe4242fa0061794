"""Engine-free tests: update."""
