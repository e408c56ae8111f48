"""Built-in filters: each narrows the candidate endpoints."""
