"""Engine-free tests: http."""
