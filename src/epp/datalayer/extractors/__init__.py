"""Built-in extractors: exposition text to endpoint state."""
