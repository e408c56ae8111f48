"""The in-process latency model behind predicted-latency-producer (a helper, not a plugin)."""
