"""Request-control screeners: plugins that cut the candidate set once, before every profile."""
