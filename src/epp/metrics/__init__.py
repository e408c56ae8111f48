"""The EPP's own Prometheus series (model-server metrics live in epp.datalayer)."""
