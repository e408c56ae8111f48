"""``dcgm-data-source`` (llm-d-router): scrape an NVIDIA DCGM exporter's Prometheus page per endpoint."""

from __future__ import annotations

from typing import ClassVar, Final

from pydantic import Field, field_validator

from epp.datalayer.api import Endpoint, EndpointEvent
from epp.datalayer.exposition import MetricFamilies
from epp.datalayer.sources.metrics_http import MetricsDataSource, MetricsDataSourceParams
from epp.plugin.base import Handle, PluginParams

SOURCE_TYPE: Final = "dcgm-data-source"
DEFAULT_PORT: Final = 9400


class DCGMDataSourceParams(MetricsDataSourceParams):
    """Upstream's parameters (``scheme``, ``path``, ``insecureSkipVerify`` as metrics-data-source)."""

    port: int | None = Field(default=DEFAULT_PORT, ge=0, le=65535)  # 0: the endpoint's metrics port
    use_node_address: bool = False

    @field_validator("port")
    @classmethod
    def _port(cls, v: int | None) -> int | None:
        return v  # the range is the field's: 0 is allowed here, unlike on metrics-data-source


class DCGMDataSource(MetricsDataSource):
    """GPU telemetry from a DCGM exporter.  Type ``dcgm-data-source``.

    Scrapes ``scheme://<pod IP>:port/path`` (the exporter as a sidecar), or with
    ``useNodeAddress`` the node's IP (the exporter as a DaemonSet: it reports every pod on the
    node, and the ``dcgm-extractor`` keeps the samples whose ``pod`` label is the endpoint's).
    ``port`` 0 scrapes the endpoint's own metrics port.  ``interval`` (a Go duration, e.g.
    ``"1s"``) is the scrape period, rounded to the nearest multiple of
    ``--refresh-metrics-interval``; omitted, every tick.  Parameters and defaults: ``scheme``
    (``http``), ``path`` (``/metrics``), ``port`` (9400), ``insecureSkipVerify`` (true),
    ``useNodeAddress`` (false), ``interval``; ours as ``metrics-data-source``: ``timeout``,
    ``maxBodyBytes``.  Output: ``MetricFamilies`` (only the families its extractors name).
    """

    TYPE: ClassVar[str] = SOURCE_TYPE
    PARAMS: ClassVar[type[PluginParams]] = DCGMDataSourceParams
    OUTPUT: ClassVar[type[MetricFamilies]] = MetricFamilies
    # A GPU exporter that is down (a node's DaemonSet pod restarting) says nothing of the model
    # servers: its polls' outcomes are no endpoint-health signal, unlike a metrics scrape's.
    HEALTH_SIGNAL: ClassVar[bool] = False

    def __init__(self, name: str, params: PluginParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        assert isinstance(params, DCGMDataSourceParams)
        self._node = params.use_node_address

    def target(self, endpoint: Endpoint) -> tuple[str, int]:
        """Where this endpoint's exporter listens."""
        md = endpoint.metadata
        port = self._port or md.metrics_port or md.port
        if not self._node:
            return md.address, port
        if not md.node_address:
            raise ValueError(f"useNodeAddress: endpoint {md.name} has no node address (the pod's hostIP)")
        return md.node_address, port

    def endpoint_event(self, event: EndpointEvent) -> None:
        """Close idle connections to an endpoint's exporter when it leaves (not a shared node's)."""
        if not self._node:
            super().endpoint_event(event)
