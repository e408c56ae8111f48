"""``header-based-testing-filter``: conformance hook that pins endpoints from a request header."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Final

from epp.datalayer.api import Endpoint
from epp.plugin.base import PluginBase
from epp.plugin.state import CycleState
from epp.request import InferenceRequest

HEADER: Final = "test-epp-endpoint-selection"


def split_host_port(item: str) -> tuple[str, str] | None:
    """Go's ``net.SplitHostPort``: ``(host, port)``, or None where Go returns an error."""
    i = item.rfind(":")
    if i < 0:
        return None  # missing port
    j = k = 0
    if item.startswith("["):
        end = item.find("]")
        if end < 0 or end + 1 != i:
            return None  # missing ']', missing port, or junk after ']'
        host = item[1:end]
        j, k = 1, end + 1
    else:
        host = item[:i]
        if ":" in host:
            return None  # too many colons (a bare IPv6 literal)
    if "[" in item[j:] or "]" in item[k:]:
        return None
    return host, item[i + 1 :]


class HeaderBasedTestingFilter(PluginBase):
    """Keep the endpoints named in ``test-epp-endpoint-selection``.  Type ``header-based-testing-filter``.

    For the Gateway API Inference Extension conformance suite only.  The header is a comma
    list of ``IP`` or ``IP:port`` items (IPv6 with or without brackets; ``[ip]:port`` with a
    port).  A missing or blank header keeps nothing (the request then fails with 429).
    ``IP:port`` needs an exact address and port match; a bare ``IP`` matches any port.
    The result follows header order and holds each endpoint at most once.  A bare ``IP``
    stands for one endpoint of that address (the last in candidate order); GIE also keeps
    only one endpoint per IP for ``IP:port`` items, which collapses data-parallel ranks and
    same-host replicas into one — here distinct ``IP:port`` items stay distinct.
    Consumes: the request headers.  Parameters: none.
    """

    TYPE: ClassVar[str] = "header-based-testing-filter"

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        value = request.headers.get(HEADER)
        if value is None or not value.strip():
            return ()
        by_ip: dict[str, Endpoint] = {}
        by_hostport: dict[str, Endpoint] = {}
        for ep in endpoints:
            ip = ep.metadata.address.strip().strip("[]")
            if not ip:
                continue
            by_ip[ip] = ep
            by_hostport[f"{ip}:{ep.metadata.port}"] = ep
        out: list[Endpoint] = []
        seen: set[str] = set()
        for raw in value.split(","):
            item = raw.strip()
            if not item:
                continue
            hp = split_host_port(item)
            host, port = hp if hp is not None else (item, "")
            host = host.strip("[]")
            hit = by_hostport.get(f"{host}:{port}") if port else by_ip.get(host)
            if hit is not None and hit.name not in seen:
                seen.add(hit.name)
                out.append(hit)
        return out
