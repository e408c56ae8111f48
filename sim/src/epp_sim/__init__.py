"""A vLLM-compatible model-server simulator: HTTP, gRPC, metrics and KV events over a modelled engine."""

__version__ = "0.1.0"
