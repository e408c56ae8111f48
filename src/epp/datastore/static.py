"""No-Kubernetes discovery: endpoints from ``--endpoints`` or an ``--endpoints-file`` YAML list."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from epp.datalayer.api import EndpointMetadata, join_host_port
from epp.errors import ConfigError
from epp.plugin.registry import format_validation_error


class EndpointSpec(BaseModel):
    """One endpoint in an endpoints file."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)

    address: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    name: str = ""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("address")
    @classmethod
    def _strip_brackets(cls, v: str) -> str:
        return v[1:-1] if v.startswith("[") and v.endswith("]") else v


class EndpointsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    endpoints: list[EndpointSpec] = Field(default_factory=list)


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


def resolve(host: str) -> str:
    """An IP literal as is; a DNS name resolved once (IPv4 first), since Envoy's ORIGINAL_DST
    cluster needs an IP in the destination header.  Blocking: call it off the event loop."""
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(host))
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as e:
        raise ConfigError(f"cannot resolve endpoint host {host!r}: {e}") from None
    infos.sort(key=lambda i: i[0] != socket.AF_INET)
    return str(infos[0][4][0])


def to_metadata(spec: EndpointSpec, namespace: str) -> EndpointMetadata:
    name = spec.name or join_host_port(spec.address, spec.port)
    return EndpointMetadata(
        name=name,
        address=resolve(spec.address),
        port=spec.port,
        pod_name=name,
        namespace=namespace,
        metrics_port=spec.metrics_port,
        labels=dict(spec.labels),
    )


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


def load_endpoints_file(
    text: str, namespace: str, *, source: str = "endpoints file"
) -> list[EndpointMetadata]:
    """Parse an endpoints file: ``endpoints: [...]`` or a bare list of endpoint mappings.

    Errors name the entry and field, e.g. ``endpoints[2].port: Input should be less than or
    equal to 65535``.
    """
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: invalid YAML: {e}") from None
    if data is None:
        data = {"endpoints": []}
    if isinstance(data, list):
        data = {"endpoints": data}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping with 'endpoints' or a list of endpoints")
    try:
        parsed = EndpointsFile.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{source}: {format_validation_error('', e)}") from None
    out = [to_metadata(s, namespace) for s in parsed.endpoints]
    names: set[str] = set()
    for i, md in enumerate(out):
        if md.name in names:
            raise ConfigError(f"{source}: endpoints[{i}].name: duplicate endpoint name {md.name!r}")
        names.add(md.name)
    return out
