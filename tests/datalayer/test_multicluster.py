"""llm-d-router's multicluster family, wired as its plugins README's example: peer clusters from
``multicluster-file-discovery``, their pool aggregates scraped by ``multicluster-metrics-data-source``
into ``multicluster-metrics-extractor``'s attributes, read by the multicluster scorers, and a
request routed to the least-loaded cluster through the real director and scheduler.

Vectors from llm-d-router's extractor/metrics/multicluster_test.go, source/metrics/multicluster_test.go,
scorer/queuedepth and scorer/kvcacheutilization at ebab68792.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from epp.admission.shedding import AlwaysAdmit
from epp.app.build import BuildOptions, build
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.datalayer.api import EndpointObserver
from epp.datalayer.engines import ExtractionError
from epp.datalayer.exposition import ExpositionParser
from epp.datalayer.extractors.multicluster_metrics import (
    MultiClusterMetricsExtractor,
    MultiClusterMetricsExtractorParams,
)
from epp.datalayer.runtime import DataLayerRuntime
from epp.datalayer.scalar_attributes import MULTICLUSTER_KV_CACHE_UTILIZATION_KEY, MULTICLUSTER_QUEUE_SIZE_KEY
from epp.datalayer.sources.multicluster_metrics import MultiClusterMetricsDataSourceParams
from epp.datastore.store import Datastore
from epp.director.director import Director
from epp.errors import ConfigError
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.scorers.multicluster import MultiClusterKVCacheUtilizationScorer, MultiClusterQueueScorer
from epp.testing.plugins import FakeHandle
from epp.testing.waiting import until
from tests.datalayer.conftest import make_endpoint


def _extractor(**params: str) -> MultiClusterMetricsExtractor:
    return MultiClusterMetricsExtractor(
        "mc", MultiClusterMetricsExtractorParams.model_validate(params), FakeHandle()
    )


def _page(kv: float, queue: float) -> bytes:
    return f"llm_d_epp_average_kv_cache_utilization {kv}\nllm_d_epp_average_queue_size {queue}\n".encode()


def test_source_defaults_cross_a_trust_boundary() -> None:
    """Upstream: https, verified by default, an 8 MiB page; interval honoured, a bad one refused."""
    p = MultiClusterMetricsDataSourceParams()
    assert (p.scheme, p.insecure_skip_verify, p.max_body_bytes) == ("https", False, 8 << 20)
    assert MultiClusterMetricsDataSourceParams.model_validate({"interval": "2s"}).interval == 2.0
    with pytest.raises(ValidationError, match="invalid duration"):
        MultiClusterMetricsDataSourceParams.model_validate({"interval": "soon"})


@pytest.mark.parametrize(
    ("page", "kv", "queue", "error"),
    [
        pytest.param(_page(0.42, 7), 0.42, 7.0, False, id="both"),
        pytest.param(b"llm_d_epp_average_kv_cache_utilization 0.9\n", 0.9, None, True, id="missing-queue"),
        pytest.param(b"", None, None, True, id="empty"),
    ],
)
def test_extractor_vectors(page: bytes, kv: float | None, queue: float | None, error: bool) -> None:
    """Upstream's TestMultiClusterMetricsExtractor: a missing metric errors but the other is written."""
    ext, ep = _extractor(), make_endpoint()
    fams = ExpositionParser(ext.wanted_families()).parse(page)
    if error:
        with pytest.raises(ExtractionError):
            ext.extract(fams, ep)
    else:
        ext.extract(fams, ep)
    kv_values, queue_values = (
        ext.scalar_values(MULTICLUSTER_KV_CACHE_UTILIZATION_KEY),
        ext.scalar_values(MULTICLUSTER_QUEUE_SIZE_KEY),
    )
    assert kv_values is not None and queue_values is not None
    assert (kv_values.get(ep), queue_values.get(ep)) == (kv, queue)
    ext.endpoint_removed(ep)
    assert ep not in kv_values and ep not in queue_values


def test_extractor_custom_names_and_bad_name() -> None:
    """Upstream's CustomNames and InvalidMetricName vectors."""
    ext, ep = (
        _extractor(kvCacheUtilizationMetric="custom_kv", queueSizeMetric="custom_queue"),
        make_endpoint(),
    )
    ext.extract(ExpositionParser(ext.wanted_families()).parse(b"custom_kv 0.3\ncustom_queue 2\n"), ep)
    values = ext.scalar_values(MULTICLUSTER_KV_CACHE_UTILIZATION_KEY)
    assert values is not None and values[ep] == pytest.approx(0.3)
    with pytest.raises(ConfigError, match="kvCacheUtilizationMetric: invalid metric specification '1_bad'"):
        _extractor(kvCacheUtilizationMetric="1_bad")


def test_scorers_read_the_pool_aggregates() -> None:
    """Queue: min-max, shortest 1, longest 0, all equal 1, missing 0; KV: 1 - utilization, missing 0."""
    ext = _extractor()
    handle = FakeHandle([ext])
    a, b, c, none = (make_endpoint(f"default/c{i}") for i in range(4))
    parser = ExpositionParser(ext.wanted_families())
    for ep, kv, q in ((a, 0.9, 4), (b, 0.2, 1), (c, 0.5, 2)):
        ext.extract(parser.parse(_page(kv, q)), ep)
    queue = MultiClusterQueueScorer("q", MultiClusterMetricsExtractorParams(), handle)
    kv_scorer = MultiClusterKVCacheUtilizationScorer("kv", MultiClusterMetricsExtractorParams(), handle)
    state, request = CycleState(), InferenceRequest(request_id="r", target_model="m", body=None, headers={})
    assert list(queue.score(state, request, [a, b, c, none])) == pytest.approx([0.0, 1.0, 2 / 3, 0.0])
    assert list(queue.score(state, request, [a, none])) == [1.0, 0.0]
    assert list(kv_scorer.score(state, request, [a, b, none])) == pytest.approx([0.1, 0.8, 0.0])


CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: multicluster-file-discovery
    name: discovery
    parameters:
      path: {path}
  - type: multicluster-metrics-data-source
    name: metrics-source
    parameters:
      scheme: http
      interval: 20ms
  - type: multicluster-metrics-extractor
    name: metrics-extractor
  - type: multicluster-session-affinity-filter
    name: session-affinity
  - type: multicluster-kv-cache-utilization-scorer
    name: kv-cache
  - type: multicluster-queue-scorer
    name: queue
  - type: max-score-picker
  - type: single-profile-handler
dataLayer:
  discovery:
    pluginRef: discovery
  sources:
    - pluginRef: metrics-source
      extractors:
        - pluginRef: metrics-extractor
"""


async def test_readme_wiring_routes_to_the_least_loaded_cluster(
    tmp_path: Path, servers: Callable[[int], Any]
) -> None:
    """The README's example (scheme http, no CA file here): two clusters reached by gateway host
    name, scraped where their metricsAddress labels say; the request goes to the idle one."""
    busy, idle = await servers(2)
    busy.behaviour.body, idle.behaviour.body = _page(0.9, 12), _page(0.1, 0)
    clusters = tmp_path / "clusters.yaml"
    clusters.write_text(
        "endpoints:\n"
        f'- {{name: cluster-a, address: gw.cluster-a.example.com, port: "443", '
        f'labels: {{metricsAddress: "127.0.0.1", metricsPort: "{busy.port}"}}}}\n'
        f'- {{name: cluster-b, address: gw.cluster-b.example.com, port: "443", '
        f'labels: {{metricsAddress: "127.0.0.1", metricsPort: "{idle.port}"}}}}\n'
    )
    components = build(
        load_config(CONFIG.format(path=clusters)), default_registry(entry_points=False), BuildOptions()
    )
    ds = Datastore()
    pipeline = components.request_control.pipeline(scheduler=components.scheduler, admission=AlwaysAdmit())
    ext = components.plugins["metrics-extractor"]
    assert isinstance(ext, MultiClusterMetricsExtractor)
    async with DataLayerRuntime(ds, components.data_sources, refresh_interval=0.02):
        for plugin in components.plugins.values():  # the datastore's observers, as the server registers them
            if isinstance(plugin, EndpointObserver):
                ds.add_observer(plugin)
        queues = ext.scalar_values(MULTICLUSTER_QUEUE_SIZE_KEY)
        assert queues is not None
        await until(lambda: len(queues) == 2, what="both clusters scraped")
        body = orjson.dumps({"model": "m", "prompt": "hello", "max_tokens": 1})
        decision = await Director(ds, pipeline).start({}, {}).route(body)
    assert decision.destination == "gw.cluster-b.example.com:443"
