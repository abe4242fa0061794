"""The gRPC front: plain handler classes (generation, session and update RPCs)
that reach the App and the pipeline through one `Serving` (readiness.py),
which answers STARTING or ENGINE_DEAD when they cannot run; servicer.py maps
each RPC to its method, handlers.py puts the error policy around it."""
