"""The plugin classes this concept contributes to the registry."""

from __future__ import annotations

from typing import Final

from epp.datalayer.discovery.file import FileDiscovery, MultiClusterFileDiscovery
from epp.datalayer.extractors.core_metrics import CoreMetricsExtractor
from epp.datalayer.extractors.dcgm import DCGMExtractor
from epp.datalayer.extractors.models import ModelsDataExtractor
from epp.datalayer.extractors.multicluster_metrics import MultiClusterMetricsExtractor
from epp.datalayer.extractors.topology import TopologyExtractor
from epp.datalayer.sources.dcgm import DCGMDataSource
from epp.datalayer.sources.kv_events import KVEventsSource
from epp.datalayer.sources.metrics_http import MetricsDataSource
from epp.datalayer.sources.models import ModelsDataSource
from epp.datalayer.sources.multicluster_metrics import MultiClusterMetricsDataSource
from epp.datalayer.sources.notifications import EndpointNotificationSource, K8sNotificationSource
from epp.plugin.base import Plugin

BUILTINS: Final[tuple[type[Plugin], ...]] = (
    MetricsDataSource,
    CoreMetricsExtractor,
    EndpointNotificationSource,
    K8sNotificationSource,
    KVEventsSource,
    TopologyExtractor,
    DCGMDataSource,
    DCGMExtractor,
    FileDiscovery,
    MultiClusterFileDiscovery,
    ModelsDataSource,
    ModelsDataExtractor,
    MultiClusterMetricsDataSource,
    MultiClusterMetricsExtractor,
)
