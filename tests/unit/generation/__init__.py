"""Engine-free tests: generation."""
