"""``dcgm-extractor`` (llm-d-router): per-endpoint GPU utilization from a DCGM exporter page."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Final

from epp.datalayer.api import Endpoint
from epp.datalayer.exposition import MetricFamilies
from epp.datalayer.scalar_attributes import data_key
from epp.plugin.base import Handle, PluginBase, PluginParams

EXTRACTOR_TYPE: Final = "dcgm-extractor"
GPU_UTIL_METRIC: Final = "DCGM_FI_DEV_GPU_UTIL"
POD_LABEL: Final = "pod"
# Upstream's data key: the producer part is the plugin type, whatever the instance is named.
GPU_UTILIZATION_KEY: Final = data_key("GPUUtilization", EXTRACTOR_TYPE)
_WANTED: Final = frozenset({GPU_UTIL_METRIC})


class DCGMExtractor(PluginBase):
    """GPU utilization in [0, 1] as attribute ``GPUUtilization/dcgm-extractor``.  Type ``dcgm-extractor``.

    Reads ``DCGM_FI_DEV_GPU_UTIL`` (percent) from a ``dcgm-data-source``'s page.  Samples with
    a ``pod`` label count only for the endpoint of that pod (a DaemonSet exporter reports
    every pod on its node); samples without one always count (a sidecar's page).  The busiest
    matching GPU wins (max), divided by 100.  A page without the metric, or with no sample
    for the pod, is an error for that poll and the last value stays, as upstream.  No
    parameters.  Read by ``endpoint-attribute-filter`` / ``endpoint-attribute-scorer``.
    """

    TYPE: ClassVar[str] = EXTRACTOR_TYPE
    INPUT: ClassVar[type[MetricFamilies]] = MetricFamilies

    def __init__(self, name: str, params: PluginParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self._values: dict[Endpoint, float] = {}

    def wanted_families(self) -> frozenset[str]:
        return _WANTED

    def scalar_values(self, key: str) -> Mapping[Endpoint, float] | None:
        return self._values if key == GPU_UTILIZATION_KEY else None

    def extract(self, data: MetricFamilies, endpoint: Endpoint) -> None:
        samples = data.get(GPU_UTIL_METRIC)
        if samples is None:
            raise ValueError(f'metric "{GPU_UTIL_METRIC}" not found in DCGM response')
        pod = endpoint.metadata.pod_name
        highest = 0.0
        found = False
        for sample in samples:
            if pod:
                sample_pod = sample.labels.get(POD_LABEL)
                if sample_pod is not None and sample_pod != pod:
                    continue
            highest = max(highest, sample.value)
            found = True
        if not found:
            raise ValueError(f'metric "{GPU_UTIL_METRIC}" present but has no samples for pod "{pod}"')
        self._values[endpoint] = highest / 100.0

    def endpoint_added(self, endpoint: Endpoint) -> None:
        """Nothing to do: a value appears with the endpoint's first successful scrape."""

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        self._values.pop(endpoint, None)
