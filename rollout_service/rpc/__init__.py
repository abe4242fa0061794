"""The gRPC front: the servicer (an adapter between rollout.v1 and the engine), the
update RPCs, GenerateMany's multiplexer, the running-calls registry and the
handlers' error policy."""
