"""Which endpoints may serve a request: all of them, or Envoy's subset hint (GIE §3.4)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from epp.datalayer.api import Endpoint

SUBSET_NAMESPACE: Final = "envoy.lb.subset_hint"
SUBSET_KEY: Final = "x-gateway-destination-endpoint-subset"


def _host(hostport: str) -> str:
    """Strip ``:port`` after the last colon, and IPv6 brackets."""
    host = hostport.rsplit(":", 1)[0] if ":" in hostport else hostport
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def locate(
    endpoints: Sequence[Endpoint], metadata: Mapping[str, Any], *, subset_filter: bool = True
) -> Sequence[Endpoint]:
    """The candidates for a request.

    Without a hint (or with ``--disable-endpoint-subset-filter``) every endpoint is a
    candidate.  A present but empty hint means none is.  Hint entries are ``ip:port``
    strings; as in GIE, only the IP is compared, so every rank of a pod matches.
    """
    if not subset_filter:
        return endpoints
    ns = metadata.get(SUBSET_NAMESPACE)
    if not isinstance(ns, Mapping):
        return endpoints
    subset = ns.get(SUBSET_KEY)
    if not isinstance(subset, (list, tuple)):
        return endpoints
    if not subset:
        return ()
    hosts = {_host(s) for s in subset if isinstance(s, str)}
    return [ep for ep in endpoints if ep.metadata.address in hosts]
