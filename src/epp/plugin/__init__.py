"""The plugin kernel: names, typed parameters, typed keys, the registry. Knows nothing about LLMs."""
