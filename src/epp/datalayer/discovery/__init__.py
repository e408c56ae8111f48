"""Endpoint discovery plugins (``dataLayer.discovery``): what fills the datastore without Kubernetes."""
