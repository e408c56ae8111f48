"""Request-header plugins: run before admission, they publish request-level values (agent identity)."""
