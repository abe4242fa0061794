"""Engine-free tests: sessions."""
