"""No-Kubernetes discovery: endpoints from ``--endpoints`` or an ``--endpoints-file`` YAML list."""

from __future__ import annotations

from collections.abc import Sequence

# The endpoints file's one parser, shared with the file-discovery plugins (datalayer/discovery).
from epp.datalayer.api import EndpointMetadata
from epp.datalayer.endpoints_file import EndpointSpec, load_endpoints_file, resolve, to_metadata
from epp.errors import ConfigError

__all__ = [
    "EndpointSpec",
    "endpoints_from_flag",
    "endpoints_from_pairs",
    "load_endpoints_file",
    "resolve",
    "split_hostport",
    "to_metadata",
]


def split_hostport(value: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → (host, port); raises ValueError with the reason."""
    value = value.strip()
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError("IPv6 addresses must be written [addr]:port")
        port_s = rest[1:]
    else:
        host, sep, port_s = value.rpartition(":")
        if not sep:
            raise ValueError("missing port")
        if ":" in host:
            raise ValueError("IPv6 addresses must be written [addr]:port")
    if not host:
        raise ValueError("missing host")
    if not port_s.isdigit() or not 1 <= int(port_s) <= 65535:
        raise ValueError(f"invalid port {port_s!r}")
    return host, int(port_s)


def endpoints_from_flag(value: str, namespace: str) -> list[EndpointMetadata]:
    """Parse ``--endpoints HOST:PORT[,HOST:PORT...]``."""
    pairs: list[tuple[str, int]] = []
    for item in (v for v in value.split(",") if v.strip()):
        try:
            pairs.append(split_hostport(item))
        except ValueError as e:
            raise ConfigError(f'invalid endpoint {item.strip()!r} in "endpoints": {e}') from None
    return endpoints_from_pairs(pairs, namespace)


def endpoints_from_pairs(pairs: Sequence[tuple[str, int]], namespace: str) -> list[EndpointMetadata]:
    """Endpoints for (host, port) pairs, named ``host:port``; duplicates are an error."""
    out: list[EndpointMetadata] = []
    seen: set[str] = set()
    for host, port in pairs:
        md = to_metadata(EndpointSpec(address=host, port=port), namespace)
        if md.name in seen:
            raise ConfigError(f'duplicate endpoint {md.name!r} in "endpoints"')
        seen.add(md.name)
        out.append(md)
    if not out:
        raise ConfigError('flag "endpoints" needs at least one HOST:PORT')
    return out
