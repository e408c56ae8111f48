"""precise-prefix-cache-producer: the precise match published as PREFIX_MATCH for prefix-cache-scorer."""

from __future__ import annotations

from typing import Any

import pytest

from epp.app.build import build as build_config
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.datalayer.attributes import PREFIX_MATCH
from epp.datalayer.kvevents.hashing import BlockHasher
from epp.director.producers.approx_prefix import ApproxPrefixCacheProducer
from epp.director.producers.precise_prefix import PrecisePrefixCacheProducer
from epp.errors import ConfigError
from epp.plugin.state import CycleState
from epp.scheduling.scorers.prefix_cache import PrefixCacheScorer
from epp.testing.plugins import build
from tests.scheduling.builders import endpoint, request

TOKENS = list(range(1000, 1000 + 16 * 8))  # 8 blocks
PARAMS: dict[str, Any] = {"tokenProcessorConfig": {"hashSeed": "42"}}


def test_prefix_cache_scorer_reads_the_engines_match() -> None:
    producer: PrecisePrefixCacheProducer = build(PrecisePrefixCacheProducer, **PARAMS)
    hashes = BlockHasher("sha256_cbor", 16, "42").hashes(TOKENS)
    eps = [endpoint(i) for i in range(3)]
    for ep, n in zip(eps, (8, 2, 0), strict=True):
        st = producer.index.add_endpoint(ep.metadata.name)
        st.consistent = True
        producer.index.stored(st.slot, hashes[:n])
    state = CycleState()
    producer.prepare(state, request(), eps, TOKENS)
    infos = state.attributes(PREFIX_MATCH)
    assert [infos[ep].match_blocks for ep in eps] == [8, 2, 0]
    scorer = build(PrefixCacheScorer, prefixMatchInfoProducerName="precise-prefix-cache-producer")
    assert scorer.score(state, request(), eps) == pytest.approx([1.0, 0.25, 0.0])


def test_speculative_ttl_is_a_go_duration() -> None:
    producer: PrecisePrefixCacheProducer = build(PrecisePrefixCacheProducer, speculativeTTL="1m30s")
    assert producer.index.pending.ttl == 90.0
    with pytest.raises(ConfigError, match="speculativeTTL"):
        build(PrecisePrefixCacheProducer, speculativeTTL="soon")


CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
- type: prefix-cache-scorer
  parameters:
    prefixMatchInfoProducerName: precise-prefix-cache-producer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
"""


def test_llm_d_pipeline_builds_without_the_approximate_producer() -> None:
    components = build_config(load_config(CONFIG), default_registry())
    types = [type(p) for p in components.producers]
    assert PrecisePrefixCacheProducer in types
    assert ApproxPrefixCacheProducer not in types
