"""``multicluster-metrics-extractor`` (llm-d-router): a peer cluster's pool aggregates as attributes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Final

from epp.datalayer.api import Endpoint
from epp.datalayer.engines import ExtractionError, Spec, SpecError, finite_value, parse_spec
from epp.datalayer.exposition import MetricFamilies, with_total_aliases
from epp.datalayer.scalar_attributes import MULTICLUSTER_KV_CACHE_UTILIZATION_KEY, MULTICLUSTER_QUEUE_SIZE_KEY
from epp.errors import ConfigError
from epp.plugin.base import Handle, PluginBase, PluginParams

EXTRACTOR_TYPE: Final = "multicluster-metrics-extractor"
DEFAULT_KV_CACHE_UTILIZATION_METRIC: Final = "llm_d_epp_average_kv_cache_utilization"
DEFAULT_QUEUE_SIZE_METRIC: Final = "llm_d_epp_average_queue_size"


class MultiClusterMetricsExtractorParams(PluginParams):
    kv_cache_utilization_metric: str = ""  # "": llm_d_epp_average_kv_cache_utilization
    queue_size_metric: str = ""  # "": llm_d_epp_average_queue_size


class MultiClusterMetricsExtractor(PluginBase):
    """A peer EPP's pool averages → ``llm-d.ai/multicluster-kv-cache-utilization`` and
    ``llm-d.ai/multicluster-queue-size``.  Type ``multicluster-metrics-extractor``.

    Reads the latest series of each metric (``kvCacheUtilizationMetric``, default
    ``llm_d_epp_average_kv_cache_utilization``; ``queueSizeMetric``, default
    ``llm_d_epp_average_queue_size``; specs as ``core-metrics-extractor``'s) from a
    ``multicluster-metrics-data-source`` page and publishes each as a numeric endpoint attribute,
    read by ``multicluster-kv-cache-utilization-scorer`` / ``multicluster-queue-scorer`` (and
    ``endpoint-attribute-*``).  A missing metric is an error for that poll that does not stop the
    other; its last value stays.  A bad metric name is refused at startup.
    """

    TYPE: ClassVar[str] = EXTRACTOR_TYPE
    PARAMS: ClassVar[type[PluginParams]] = MultiClusterMetricsExtractorParams
    INPUT: ClassVar[type[MetricFamilies]] = MetricFamilies

    def __init__(self, name: str, params: PluginParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        assert isinstance(params, MultiClusterMetricsExtractorParams)
        self._metrics: tuple[tuple[str, Spec, dict[Endpoint, float]], ...] = (
            (
                MULTICLUSTER_KV_CACHE_UTILIZATION_KEY,
                _spec(
                    "kvCacheUtilizationMetric",
                    params.kv_cache_utilization_metric or DEFAULT_KV_CACHE_UTILIZATION_METRIC,
                ),
                {},
            ),
            (
                MULTICLUSTER_QUEUE_SIZE_KEY,
                _spec("queueSizeMetric", params.queue_size_metric or DEFAULT_QUEUE_SIZE_METRIC),
                {},
            ),
        )
        self._by_key = {key: values for key, _, values in self._metrics}
        self._wanted = with_total_aliases(spec.name for _, spec, _ in self._metrics)

    def wanted_families(self) -> frozenset[str]:
        return self._wanted

    def scalar_values(self, key: str) -> Mapping[Endpoint, float] | None:
        return self._by_key.get(key)

    def extract(self, data: MetricFamilies, endpoint: Endpoint) -> None:
        errors: list[str] = []
        for key, spec, values in self._metrics:
            try:
                values[endpoint] = finite_value(spec, spec.latest(data))
            except ExtractionError as e:
                errors.append(f"{key}: {e}")
        if errors:
            raise ExtractionError("; ".join(errors))

    def endpoint_added(self, endpoint: Endpoint) -> None:
        """Nothing to do: values appear with the endpoint's first successful scrape."""

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        for _, _, values in self._metrics:
            values.pop(endpoint, None)


def _spec(field: str, text: str) -> Spec:
    try:
        spec = parse_spec(text)
    except SpecError as e:
        raise ConfigError(f"{field}: {e}") from None
    assert spec is not None  # the text is never empty: a default stands in
    return spec
