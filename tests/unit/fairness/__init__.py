"""Engine-free tests: fairness."""
