"""kv-events-source: the subscription wired in the data layer, read by the precise scorer."""

from __future__ import annotations

import pytest

from epp.app.build import build
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.datalayer.api import EndpointEvent
from epp.datalayer.sources.kv_events import KVEventsSource
from epp.errors import ConfigError
from epp.scheduling.scorers.precise_prefix import PrecisePrefixCacheScorer
from epp.testing.builders import make_endpoint

CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: metrics-data-source
- type: core-metrics-extractor
- type: kv-events-source
  parameters: {tokenProcessorConfig: {blockSize: %d, hashSeed: "1"}, kvEventsConfig: {replayPort: 5558}}
- type: precise-prefix-cache-scorer
  parameters: {kvEventsSource: kv-events-source, tokenProcessorConfig: {blockSize: 16, hashSeed: "1"}}
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors: [{pluginRef: core-metrics-extractor}]
  - pluginRef: kv-events-source
schedulingProfiles:
- name: default
  plugins: [{pluginRef: precise-prefix-cache-scorer}]
"""


def test_scorer_reads_the_data_layer_source() -> None:
    components = build(load_config(CONFIG % 16), default_registry())
    source = components.plugins["kv-events-source"]
    scorer = components.plugins["precise-prefix-cache-scorer"]
    assert isinstance(source, KVEventsSource) and isinstance(scorer, PrecisePrefixCacheScorer)
    assert scorer.subscriber is source.subscriber
    assert components.data_layer.owns(source)  # the data layer starts and stops it
    assert source not in components.lifecycle
    ep = make_endpoint(3)
    source.endpoint_event(EndpointEvent("AddOrUpdate", ep))
    scorer.endpoint_added(ep)  # the scorer leaves the referenced subscription alone
    assert list(scorer.index.states) == [ep.metadata.name]
    assert source.subscriber.address(ep)[1] == "tcp://192.168.1.4:5558"
    source.endpoint_event(EndpointEvent("Delete", ep))
    assert not scorer.index.states


def test_block_size_must_agree() -> None:
    with pytest.raises(ConfigError, match="blockSize 16 differs"):
        build(load_config(CONFIG % 32), default_registry())
