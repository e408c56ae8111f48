"""Built-in ordering policies: which request of a flow dispatches first."""
