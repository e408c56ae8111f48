"""The one-command demo and the real-Envoy harness shared by tests and benchmarks."""
