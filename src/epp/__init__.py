"""A Python Endpoint Picker for LLM inference behind Envoy's ext_proc filter."""

__version__ = "0.1.0"
