"""Engine-free tests: client."""
