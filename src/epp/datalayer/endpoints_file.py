"""The endpoints file: one parser for ``--endpoints-file`` and the ``file-discovery`` plugins.

The format is a YAML (or JSON) mapping ``endpoints: [...]`` or a bare list; each entry has
``address``, ``port`` (a number or, as llm-d-router writes it, a string), and optionally
``name``, ``namespace``, ``metricsPort`` and ``labels``.  ``--endpoints-file`` refuses a file
with any bad entry (``load_endpoints_file``); ``file-discovery`` skips bad entries and applies
the rest, as llm-d-router does (``parse_entries`` + ``entry_spec``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Mapping
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
    namespace: str = ""  # "" : the EPP's namespace
    metrics_port: int = Field(default=0, ge=0, le=65535)
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("address")
    @classmethod
    def _strip_brackets(cls, v: str) -> str:
        return v[1:-1] if v.startswith("[") and v.endswith("]") else v


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
        namespace=spec.namespace or namespace,
        metrics_port=spec.metrics_port,
        labels=dict(spec.labels),
    )


def parse_entries(text: str, source: str) -> list[Any]:
    """The file's raw entries; a file that is not YAML or not one of the two shapes is an error."""
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: invalid YAML: {e}") from None
    if data is None:
        return []
    if isinstance(data, list):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping with 'endpoints' or a list of endpoints")
    for key in data:
        if key != "endpoints":
            raise ConfigError(f"{source}: {key}: unknown field (expected 'endpoints')")
    entries = data.get("endpoints") or []
    if not isinstance(entries, list):
        raise ConfigError(f"{source}: endpoints: expected a list of endpoints")
    return entries


def entry_spec(entry: Any, index: int, source: str) -> EndpointSpec:
    """One entry validated; the error names it, e.g. ``endpoints[2].port: Input should be ...``."""
    try:
        return EndpointSpec.model_validate(entry)
    except ValidationError as e:
        raise ConfigError(f"{source}: {format_validation_error(f'endpoints[{index}]', e)}") from None


def load_endpoints_file(
    text: str, namespace: str, *, source: str = "endpoints file"
) -> list[EndpointMetadata]:
    """Parse an endpoints file strictly (``--endpoints-file``): any bad entry refuses the file.

    Errors name the entry and field, e.g. ``endpoints[2].port: Input should be less than or
    equal to 65535``.
    """
    out = [
        to_metadata(entry_spec(e, i, source), namespace) for i, e in enumerate(parse_entries(text, source))
    ]
    names: set[str] = set()
    for i, md in enumerate(out):
        if md.name in names:
            raise ConfigError(f"{source}: endpoints[{i}].name: duplicate endpoint name {md.name!r}")
        names.add(md.name)
    return out
