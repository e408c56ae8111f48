"""Built-in data producers: per-request endpoint attributes written before scheduling."""
