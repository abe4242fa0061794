"""Engine-free tests, by the package they test: no test here starts a
server or an engine (tests/support/orchestration.py refuses one)."""
