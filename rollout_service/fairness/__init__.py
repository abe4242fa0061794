"""Fair sharing of one engine between callers.

vLLM serves its waiting requests first come, first served: a caller that
submits hundreds of requests puts everyone else's behind them (measured: a
16-token call that takes 6 ms idle took 3.9 s behind another caller's 600).
Here every engine request gets a priority from its caller's load (share.py):
the caller's requests already in flight, divided by the caller's share, so
the engine's waiting queue (vLLM's priority scheduling) interleaves callers
round-robin, weighted by their shares. A caller is its bearer token, or with
auth off its `rollout-tenant` metadata, else its connection (identity.py).
"""
