"""The one error policy: every failure the service answers with becomes a
gRPC status here (errors.py), with ErrorInfo, BadRequest and RetryInfo. The
ground every layer imports; it imports nothing else of the service."""
