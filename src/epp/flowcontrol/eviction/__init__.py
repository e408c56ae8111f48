"""In-flight eviction (llm-d-router's ``flowControl.enableEviction``): which running requests may
be ended, in which order, and when flow control ends them to unblock higher-priority work."""
