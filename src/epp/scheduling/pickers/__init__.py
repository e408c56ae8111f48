"""Built-in pickers: turn weighted totals into the target endpoints."""
