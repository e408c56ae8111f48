"""``file-discovery`` and ``multicluster-file-discovery`` (llm-d-router): endpoints from a file.

The config's ``dataLayer.discovery`` names one of these; the data-layer runtime starts it with
the datastore, which it then fills: on start (a file that cannot be read or parsed, or is over
1 MiB, fails startup) and, with ``watchFile``, on every change of the file (a bad version is
logged and the last good set stays).  As upstream, a bad entry is skipped with a warning and
the others are applied, and endpoints missing from a new version are removed.  The file format
and its parser are ``--endpoints-file``'s (datalayer/endpoints_file.py).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from typing import Any, ClassVar, Final

import structlog
from pydantic import Field

from epp.datalayer.api import EndpointMetadata, EndpointSink, join_host_port
from epp.datalayer.endpoints_file import EndpointSpec, entry_spec, parse_entries
from epp.datalayer.watch import WatchedFile
from epp.errors import ConfigError
from epp.plugin.base import Handle, PluginBase, PluginParams

log = structlog.get_logger(__name__)

FILE_DISCOVERY: Final = "file-discovery"
MULTICLUSTER_FILE_DISCOVERY: Final = "multicluster-file-discovery"
MAX_FILE_BYTES: Final = 1 << 20  # upstream's cap on the endpoints file
DEFAULT_NAMESPACE: Final = "default"
METRICS_ADDRESS_LABEL: Final = "metricsAddress"
METRICS_PORT_LABEL: Final = "metricsPort"
# Kubernetes' IsDNS1123Subdomain: dot-separated lower-case labels, 253 characters at most.
_DNS1123_LABEL: Final = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN: Final = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*\Z")


class FileDiscoveryParams(PluginParams):
    path: str = Field(min_length=1)  # required, as upstream ("'path' parameter is required")
    watch_file: bool = False


class FileDiscovery(PluginBase):
    """Endpoints from a YAML/JSON file.  Type ``file-discovery``.

    Parameters: ``path`` (required), ``watchFile`` (false: read once at startup).  Entries:
    ``name``, ``namespace`` (``default``), ``address`` (an IPv4 literal, as upstream), ``port``
    (1..65535, a string as upstream writes it, or a number), ``labels``; ours as
    ``--endpoints-file``: ``metricsPort``.  An entry repeated by name: the last one wins.
    """

    TYPE: ClassVar[str] = FILE_DISCOVERY
    PARAMS: ClassVar[type[PluginParams]] = FileDiscoveryParams

    def __init__(self, name: str, params: PluginParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        assert isinstance(params, FileDiscoveryParams)
        self.path = params.path
        self.watch_file = params.watch_file
        self.skipped: tuple[str, ...] = ()  # why entries of the last version read were skipped
        self._watched: WatchedFile[list[EndpointMetadata]] | None = None

    def check_address(self, address: str) -> str:
        """The error for an address this discovery does not take, or ""."""
        try:
            ipaddress.IPv4Address(address)
        except ValueError:
            return f'invalid IPv4 address "{address}"'
        return ""

    def metadata(self, spec: EndpointSpec) -> EndpointMetadata:
        """The endpoint of an entry: named ``<namespace>/<name>``, upstream's endpoint id."""
        namespace = spec.namespace or DEFAULT_NAMESPACE
        name = spec.name or join_host_port(spec.address, spec.port)
        return EndpointMetadata(
            name=f"{namespace}/{name}",
            address=spec.address,
            port=spec.port,
            pod_name=name,
            namespace=namespace,
            metrics_port=spec.metrics_port,
            labels=dict(spec.labels),
        )

    def load(self, text: str) -> list[EndpointMetadata]:
        """One version of the file → its valid endpoints; a file-level problem raises ConfigError."""
        source = f"{self.TYPE} {self.path}"
        if len(text.encode()) > MAX_FILE_BYTES:
            raise ConfigError(f"{source}: endpoints file exceeds 1 MiB limit")
        found: dict[str, EndpointMetadata] = {}
        skipped: list[str] = []
        for i, entry in enumerate(parse_entries(text, source)):
            try:
                md = self._entry(entry, i, source)
            except ConfigError as e:
                skipped.append(str(e))
                log.warning("endpoint_skipped", plugin=str(self.typed_name), error=str(e))
                continue
            found[md.name] = md
        self.skipped = tuple(skipped)
        return list(found.values())

    def _entry(self, entry: object, index: int, source: str) -> EndpointMetadata:
        spec = entry_spec(entry, index, source)
        if problem := self.check_address(spec.address):
            raise ConfigError(f"{source}: endpoints[{index}].address: {problem}")
        return self.metadata(spec)

    async def start_discovery(self, sink: EndpointSink) -> None:
        """Fill ``sink`` from the file now (raising ConfigError if it cannot be read), then on changes."""
        if self._watched is not None:
            return
        watched = WatchedFile(self.path, self.load, sink.replace_all, what=f"{self.TYPE} endpoints file")
        try:
            watched.load_now()
        except ConfigError as e:
            raise ConfigError(f"{self.TYPE}: initial load failed: {e}") from None
        if self.skipped:  # as upstream: a bad entry fails startup, though only skipped on reloads
            raise ConfigError(f"{self.TYPE}: initial load failed: " + "; ".join(self.skipped))
        if self.watch_file:
            await watched.start()  # reads the file again and watches it from this version on
        self._watched = watched

    async def stop(self) -> None:
        watched, self._watched = self._watched, None
        if watched is not None:
            await watched.stop()

    def debug_state(self) -> dict[str, Any]:
        return {"path": self.path, "watchFile": self.watch_file, "skipped": list(self.skipped)}


class MultiClusterFileDiscovery(FileDiscovery):
    """Peer clusters as endpoints.  Type ``multicluster-file-discovery``.

    As ``file-discovery``, except that an address may be an IP (v4 or v6) or a DNS-1123 host
    name (a cluster's gateway, kept as a name, as upstream), and an
    entry's ``metricsAddress`` label (with ``metricsPort``, default the entry's port) is where
    its pool metrics are scraped.
    """

    TYPE: ClassVar[str] = MULTICLUSTER_FILE_DISCOVERY

    def check_address(self, address: str) -> str:
        try:
            ipaddress.ip_address(address)
        except ValueError:
            if len(address) > 253 or not _DNS1123_SUBDOMAIN.match(address):
                return f'invalid host "{address}"'
        return ""

    def metadata(self, spec: EndpointSpec) -> EndpointMetadata:
        md = super().metadata(spec)  # a host name stays a name: a cluster's gateway is not resolved here
        address = spec.labels.get(METRICS_ADDRESS_LABEL, "")
        if not address:
            return md
        port_text = spec.labels.get(METRICS_PORT_LABEL, "")
        if port_text and not (port_text.isdecimal() and 1 <= int(port_text) <= 65535):
            raise ConfigError(f"labels.{METRICS_PORT_LABEL}: invalid port {port_text!r}")
        return dataclasses.replace(
            md, metrics_address=address, metrics_port=int(port_text) if port_text else spec.port
        )
