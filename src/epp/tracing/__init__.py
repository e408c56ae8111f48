"""OpenTelemetry tracing: setup, span names, and the spans of the routing stages."""
