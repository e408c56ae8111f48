"""``multicluster-metrics-data-source`` (llm-d-router): scrape a peer cluster's pool metrics."""

from __future__ import annotations

from typing import ClassVar, Final

from pydantic import Field

from epp.datalayer.sources.metrics_http import MetricsDataSource, MetricsDataSourceParams
from epp.plugin.base import Handle, PluginParams

SOURCE_TYPE: Final = "multicluster-metrics-data-source"
MAX_RESPONSE_BYTES: Final = 8 << 20  # upstream's cap on a peer's page


class MultiClusterMetricsDataSourceParams(MetricsDataSourceParams):
    """The metrics source's parameters with the cross-cluster defaults: https, verified, 8 MiB."""

    scheme: str = "https"
    insecure_skip_verify: bool = False
    max_body_bytes: int = Field(default=MAX_RESPONSE_BYTES, gt=0)


class MultiClusterMetricsDataSource(MetricsDataSource):
    """A peer cluster's EPP metrics, for ``multicluster-metrics-extractor``.  Type
    ``multicluster-metrics-data-source``.

    The metrics source, with upstream's defaults for a scrape across a cluster trust boundary:
    ``scheme`` ``https`` and ``insecureSkipVerify`` false (set ``caCertPath`` for a private
    cluster CA), a page bounded at 8 MiB (``maxBodyBytes``; upstream reads at most that much,
    here a larger page is an error for that poll).  The target is the endpoint's metrics host:
    a ``multicluster-file-discovery`` entry's ``metricsAddress`` / ``metricsPort`` labels, else
    its address and port.  ``port`` is accepted and, as upstream, not used.
    """

    TYPE: ClassVar[str] = SOURCE_TYPE
    PARAMS: ClassVar[type[PluginParams]] = MultiClusterMetricsDataSourceParams

    def __init__(self, name: str, params: PluginParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self._port = 0  # upstream decodes ``port`` but does not apply it to this source
