"""Built-in scorers: each rates every candidate endpoint in [0, 1]."""
