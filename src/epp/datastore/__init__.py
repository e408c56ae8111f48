"""The EPP's view of the pool: endpoints, objectives and model rewrites."""
