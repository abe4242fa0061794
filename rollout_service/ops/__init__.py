"""What runs beside every call: bearer-token auth, Prometheus metrics,
OpenTelemetry tracing, structured logs."""
