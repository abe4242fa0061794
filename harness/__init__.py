"""What tests and benchmarks share: a server subprocess, test weights,
test certificates. Neither imports the other; both import this."""
