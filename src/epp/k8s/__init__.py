"""The only code that talks to a Kubernetes API server."""
