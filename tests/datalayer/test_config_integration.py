"""The data layer as the config builder wires it: the default config and the legacy gate both scrape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from epp.app.build import BuildOptions, MetricsFlags, build
from epp.app.registry import default_registry
from epp.config.load import default_config, load_config
from epp.datalayer.legacy_poller import LegacyMetricsExtractor
from epp.datalayer.runtime import DataLayerRuntime
from epp.datalayer.sources.metrics_http import MetricsDataSource
from epp.datastore.store import Datastore
from epp.testing.waiting import until

LEGACY = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [enableLegacyMetrics]
plugins:
- type: queue-scorer
"""


@pytest.mark.parametrize(
    ("config", "extractor_type"),
    [
        pytest.param(default_config, "core-metrics-extractor", id="default"),
        pytest.param(lambda: load_config(LEGACY), LegacyMetricsExtractor.TYPE, id="legacy-gate"),
    ],
)
async def test_built_bindings_scrape(
    servers: Callable[[int], Any], config: Callable[[], Any], extractor_type: str
) -> None:
    """What build() returns for the data layer runs in the runtime and fills Metrics."""
    (srv,) = await servers(1)
    flags = MetricsFlags(path="/metrics", explicitly_set=frozenset({"path"}))
    components = build(config(), default_registry(entry_points=False), BuildOptions(metrics=flags))
    (binding,) = components.data_sources
    assert isinstance(binding.source, MetricsDataSource)
    assert [e.typed_name.type for e in binding.extractors] == [extractor_type]
    ds = Datastore()
    async with DataLayerRuntime(ds, components.data_sources, refresh_interval=0.02):
        ep = ds.upsert(srv.endpoint().metadata)
        await until(lambda: ep.metrics.update_time > 0)
    assert (ep.metrics.waiting_queue_size, ep.metrics.running_requests_size) == (3, 7)
    assert binding.source.wanted is not None  # the extractor narrowed what is parsed
