"""OpenTelemetry tracing setup and span names."""
