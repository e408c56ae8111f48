"""core-metrics-extractor's ``customMetrics``: any scalar metric as a numeric endpoint attribute.

Vectors from llm-d-router's extractor/metrics tests (metrics_extraction_from_config_test.go,
extractor_test.go at ebab68792): ``custom_queue_depth{tier=gold}`` 42.5 → ``custom.queue_depth``,
a counter ``custom_total_requests`` 12 → ``custom.total_requests``, and the factory's errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

from epp.admission.shedding import AlwaysAdmit
from epp.app.build import BuildOptions, build
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.datalayer.engines import ExtractionError
from epp.datalayer.exposition import ExpositionParser
from epp.datalayer.extractors.core_metrics import CoreMetricsExtractor
from epp.datalayer.runtime import DataLayerRuntime
from epp.datalayer.scalar_attributes import ScalarAttributeRef
from epp.datastore.store import Datastore
from epp.director.director import Director
from epp.errors import ConfigError
from epp.testing.plugins import FakeHandle
from epp.testing.waiting import until
from tests.datalayer.conftest import make_endpoint, make_extractor

ENGINE_LABEL = "llm-d.ai/engine-type"


def _vllm_with(*custom: dict[str, str]) -> dict[str, Any]:
    return {"engineConfigs": [{"name": "vllm", "customMetrics": list(custom)}]}


def test_scalar_from_labelled_series_is_the_attribute() -> None:
    """Upstream's vector: the gold-tier series' 42.5 is stored; the overridden vllm table reads nothing else."""
    ext = make_extractor(
        **_vllm_with({"attributeKey": "custom.queue_depth", "metricSpec": "custom_queue_depth{tier=gold}"})
    )
    ep = make_endpoint(labels={ENGINE_LABEL: "vllm"})
    page = b'custom_queue_depth{tier="silver"} 7\ncustom_queue_depth{tier="gold"} 42.5\n'
    ext.extract(ExpositionParser(ext.wanted_families()).parse(page), ep)
    values = ext.scalar_values("custom.queue_depth/core-metrics-extractor")
    assert values is not None and values[ep] == pytest.approx(42.5)
    assert ext.scalar_values("custom.queue_depth") is values  # the later spelling: no producer given
    assert (ep.metrics.waiting_queue_size, ep.metrics.running_requests_size) == (0, 0)
    assert ep.metrics.kv_cache_usage_percent == 0.0
    assert ep.metrics.update_time > 0  # a custom read alone counts as an update, as upstream


def test_counter_family_is_read() -> None:
    """Upstream's vector: a counter (here with its TYPE line) is a scalar too."""
    ext = make_extractor(
        **_vllm_with({"attributeKey": "custom.total_requests", "metricSpec": "custom_total_requests"})
    )
    ep = make_endpoint()
    page = b"# TYPE custom_total_requests counter\ncustom_total_requests 12\n"
    ext.extract(ExpositionParser(ext.wanted_families()).parse(page), ep)
    values = ext.scalar_values("custom.total_requests/core-metrics-extractor")
    assert values is not None and values[ep] == 12.0


def test_missing_series_keeps_the_last_value_and_names_the_key() -> None:
    """A failed read is an error naming the attribute; the previous value stays until the next read."""
    ext = make_extractor(
        **_vllm_with({"attributeKey": "depth", "metricSpec": "custom_queue_depth{tier=gold}"})
    )
    ep = make_endpoint()
    parser = ExpositionParser(ext.wanted_families())
    ext.extract(parser.parse(b'custom_queue_depth{tier="gold"} 3\n'), ep)
    with pytest.raises(ExtractionError, match='custom metric "depth"'):
        ext.extract(parser.parse(b'custom_queue_depth{tier="bronze"} 9\n'), ep)
    values = ext.scalar_values("depth/core-metrics-extractor")
    assert values is not None and values[ep] == 3.0


def test_values_leave_with_the_endpoint_and_follow_the_engine() -> None:
    """Only the endpoint's engine table's custom metrics are read; a removed endpoint's value goes."""
    ext = make_extractor(
        engineConfigs=[
            {
                "name": "vllm",
                "queuedRequestsSpec": "q",
                "customMetrics": [{"attributeKey": "a", "metricSpec": "m_a"}],
            },
            {
                "name": "other",
                "queuedRequestsSpec": "q",
                "customMetrics": [{"attributeKey": "b", "metricSpec": "m_b"}],
            },
        ]
    )
    vllm, other = make_endpoint("ns/v"), make_endpoint("ns/o", labels={ENGINE_LABEL: "other"})
    fams = ExpositionParser(ext.wanted_families()).parse(b"q 1\nm_a 5\nm_b 6\n")
    ext.extract(fams, vllm)
    ext.extract(fams, other)
    a, b = ext.scalar_values("a/core-metrics-extractor"), ext.scalar_values("b/core-metrics-extractor")
    assert a == {vllm: 5.0} and b == {other: 6.0}
    ext.endpoint_removed(vllm)
    assert a == {} and b == {other: 6.0}
    assert ext.scalar_values("c/core-metrics-extractor") is None


def test_readers_find_the_values_through_the_handle() -> None:
    """endpoint-attribute-* read through ScalarAttributeRef: the extractor is found among the plugins."""
    ext = make_extractor(**_vllm_with({"attributeKey": "custom.queue_depth", "metricSpec": "depth"}))
    handle = FakeHandle([ext])
    ep = make_endpoint()
    ext.extract(ExpositionParser(ext.wanted_families()).parse(b"depth 4\n"), ep)
    assert ScalarAttributeRef(handle, "custom.queue_depth/core-metrics-extractor").values()[ep] == 4.0


@pytest.mark.parametrize(
    ("custom", "message"),
    [
        pytest.param([{"metricSpec": "custom_queue_depth"}], "attributeKey cannot be empty", id="no-key"),
        pytest.param(
            [{"attributeKey": "custom.queue_depth"}],
            'custom metric "custom.queue_depth" spec cannot be empty',
            id="no-spec",
        ),
        pytest.param(
            [{"attributeKey": "k", "metricSpec": "a"}, {"attributeKey": "k", "metricSpec": "b"}],
            'custom metric attributeKey "k" is duplicated',
            id="duplicate",
        ),
        pytest.param([{"attributeKey": "k", "metricSpec": "a{b"}], 'custom metric "k": ', id="bad-spec"),
    ],
)
def test_bad_custom_metrics_are_refused(custom: list[dict[str, str]], message: str) -> None:
    """Upstream's factory errors, naming the engine: the config does not start."""
    with pytest.raises(ConfigError, match=f'failed to create mapping for engine "custom": .*{message}'):
        make_extractor(engineConfigs=[{"name": "custom", "customMetrics": custom}])


def test_custom_families_are_parsed() -> None:
    """The source is asked to parse the custom metrics' families too (it parses only what is wanted)."""
    ext = make_extractor(**_vllm_with({"attributeKey": "k", "metricSpec": "my_metric{x=y}"}))
    assert "my_metric" in ext.wanted_families()


CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: core-metrics-extractor
  parameters:
    engineConfigs:
    - name: vllm
      queuedRequestsSpec: "vllm:num_requests_waiting"
      customMetrics:
      - attributeKey: custom.queue_depth
        metricSpec: "custom_queue_depth{tier=gold}"
- type: endpoint-attribute-scorer
  name: depth
  parameters:
    attributeKey: custom.queue_depth
    algorithm: {type: linear_lower_is_better}
- type: max-score-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: depth
  - pluginRef: max-score-picker
"""


async def test_a_custom_metric_steers_routing(servers: Callable[[int], Any]) -> None:
    """Scraped by the default source, published by the extractor, read by endpoint-attribute-scorer
    (the key given without a producer): the request goes where it is lowest."""
    deep, shallow = await servers(2)
    deep.behaviour.body = b'vllm:num_requests_waiting 0\ncustom_queue_depth{tier="gold"} 40\n'
    shallow.behaviour.body = b'vllm:num_requests_waiting 0\ncustom_queue_depth{tier="gold"} 3\n'
    components = build(load_config(CONFIG), default_registry(entry_points=False), BuildOptions())
    ext = components.plugins["core-metrics-extractor"]
    assert isinstance(ext, CoreMetricsExtractor)
    ds = Datastore()
    async with DataLayerRuntime(ds, components.data_sources, refresh_interval=0.02):
        for srv in (deep, shallow):
            ds.upsert(srv.endpoint().metadata)
        depths = ext.scalar_values("custom.queue_depth/core-metrics-extractor")
        assert depths is not None
        await until(lambda: len(depths) == 2, what="both custom values scraped")
        pipeline = components.request_control.pipeline(
            scheduler=components.scheduler, admission=AlwaysAdmit()
        )
        body = orjson.dumps({"model": "m", "prompt": "hi", "max_tokens": 1})
        decision = await Director(ds, pipeline).start({}, {}).route(body)
    assert decision.destination == f"127.0.0.1:{shallow.port}"
