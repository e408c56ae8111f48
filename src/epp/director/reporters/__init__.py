"""Response-side request-control plugins: reporters that answer Envoy, and conformance checks."""
