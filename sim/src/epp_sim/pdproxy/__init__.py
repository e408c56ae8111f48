"""The decode-side P/D proxy: the project's equivalent of llm-d's routing sidecar (``cmd/pd-sidecar``)."""
