"""Engine-free tests: benchmarks."""
