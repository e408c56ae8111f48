"""Older upstream config forms load rewritten, with a warning naming what replaced them."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from epp.app.build import build
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.director.producers.approx_prefix import ApproxPrefixCacheProducer
from epp.errors import ConfigError
from epp.scheduling.profiles.deciders import AlwaysDisaggPDDecider, PrefixBasedPDDecider

GIE_14_PREFIX = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  parameters:
    blockSize: 64
    maxPrefixBlocksToMatch: 128
    lruCapacityPerServer: 9000
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
"""


def _producer(text: str) -> ApproxPrefixCacheProducer:
    components = build(load_config(text), default_registry())
    (producer,) = [p for p in components.producers if isinstance(p, ApproxPrefixCacheProducer)]
    return producer


def test_gie_14_prefix_parameters_move_to_the_producer() -> None:
    with capture_logs() as logs:
        producer = _producer(GIE_14_PREFIX)
    # GIE <= 1.3's blockSize was tokens: it becomes blockSizeTokens.
    assert (producer.block_size_tokens, producer.max_prefix_blocks, producer.lru_capacity) == (64, 128, 9000)
    (warning,) = [e for e in logs if e["event"] == "deprecated_plugin_parameters_moved"]
    assert warning["path"] == "plugins[0].parameters"
    assert "approx-prefix-cache-producer" in warning["replacement"]


def test_gie_10_hash_block_size_is_characters() -> None:
    producer = _producer(GIE_14_PREFIX.replace("blockSize: 64", "hashBlockSize: 256"))
    assert producer.block_size_tokens == 64


def test_declared_producer_wins_and_legacy_parameters_are_ignored_with_a_warning() -> None:
    text = GIE_14_PREFIX.replace(
        "plugins:\n- type: prefix-cache-scorer",
        "plugins:\n- type: approx-prefix-cache-producer\n  parameters: {blockSizeTokens: 32}\n"
        "- type: prefix-cache-scorer",
        1,
    )
    with capture_logs() as logs:
        producer = _producer(text)
    assert producer.block_size_tokens == 32
    assert any(e["event"] == "deprecated_plugin_parameters_ignored" for e in logs)


PD_05 = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefill-filter
- type: decode-filter
- type: prefix-cache-scorer
- type: max-score-picker
- type: pd-profile-handler
  parameters:
    threshold: {threshold}
    hashBlockSize: 5
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
"""


def test_llmd_05_pd_handler_threshold_becomes_a_prefix_decider() -> None:
    with capture_logs() as logs:
        components = build(load_config(PD_05.replace("{threshold}", "100")), default_registry())
    (decider,) = [p for p in components.plugins.values() if isinstance(p, PrefixBasedPDDecider)]
    assert decider.non_cached_tokens == 25  # 100 characters at 4 a token
    assert any(e["event"] == "deprecated_pd_profile_handler_decider_added" for e in logs)


def test_llmd_05_pd_handler_threshold_zero_always_disaggregates() -> None:
    components = build(load_config(PD_05.replace("{threshold}", "0")), default_registry())
    assert any(isinstance(p, AlwaysDisaggPDDecider) for p in components.plugins.values())


def test_negative_threshold_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"plugins\[4\]\.parameters\.threshold"):
        load_config(PD_05.replace("{threshold}", "-1"))


GIE_14_SECTIONS = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: metrics-data-source
- type: core-metrics-extractor
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
saturationDetector:
  queueDepthThreshold: 7
  kvCacheUtilThreshold: 0.5
data:
  sources:
  - pluginRef: metrics-data-source
    extractors:
    - pluginRef: core-metrics-extractor
"""


def test_gie_14_data_and_detector_thresholds() -> None:
    with capture_logs() as logs:
        cfg = load_config(GIE_14_SECTIONS)
    assert cfg.data_layer is not None
    assert cfg.saturation_detector is not None
    assert cfg.saturation_detector.plugin_ref == "utilization-detector"
    (spec,) = [p for p in cfg.plugins if p.type == "utilization-detector"]
    assert spec.parameters == {"queueDepthThreshold": 7, "kvCacheUtilThreshold": 0.5}
    components = build(cfg, default_registry())
    detector = components.saturation_detector
    assert getattr(detector, "queue_depth_threshold", None) == 7
    assert {e["path"] for e in logs if e["event"] == "deprecated_config_field_moved"} == {
        "data",
        "saturationDetector",
    }


def test_flow_control_saturation_detector_in_a_gie_file() -> None:
    text = GIE_14_SECTIONS.replace(
        "saturationDetector:\n  queueDepthThreshold: 7\n  kvCacheUtilThreshold: 0.5\n",
        "flowControl:\n  saturationDetector:\n    pluginRef: concurrency-detector\n",
    )
    cfg = load_config(text)
    assert cfg.saturation_detector is not None
    assert cfg.saturation_detector.plugin_ref == "concurrency-detector"


def test_both_data_and_data_layer_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^data: "):
        load_config(GIE_14_SECTIONS + "dataLayer:\n  sources: []\n")


PRODUCER_NAMES = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: inflight-load-producer
  name: loads
- type: active-request-scorer
  parameters: {inFlightLoadProducerName: loads, idleThreshold: 2}
- type: token-load-scorer
  parameters: {inFlightLoadProducerName: inflight-load-producer}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: active-request-scorer
  - pluginRef: token-load-scorer
"""


def test_producer_name_parameters_name_the_one_producer() -> None:
    components = build(load_config(PRODUCER_NAMES), default_registry())
    scorer = components.plugins["active-request-scorer"]
    assert getattr(scorer, "idle_threshold", None) == 2


def test_producer_name_naming_nothing_is_refused_with_its_field() -> None:
    with pytest.raises(ConfigError, match=r"plugins\[1\]\.parameters\.inFlightLoadProducerName: 'nope'"):
        load_config(
            PRODUCER_NAMES.replace("inFlightLoadProducerName: loads", "inFlightLoadProducerName: nope")
        )


def test_removed_type_names_its_replacement() -> None:
    text = (
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- type: predicted-latency-scorer\n"
    )
    with pytest.raises(
        ConfigError, match=r"plugins\[0\]\.type: .*predicted-latency-producer.*latency-scorer"
    ):
        load_config(text)


FLAT_DISAGG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: always-disagg-pd-decider
  name: always
- type: disagg-profile-handler
  parameters:
    decodeProfile: dec
    prefillProfile: pre
    deciderPluginName: always
schedulingProfiles:
- name: pre
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: max-score-picker
- name: dec
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
"""


def test_disagg_handler_flat_parameters_are_nested_with_a_warning() -> None:
    with capture_logs() as logs:
        cfg = load_config(FLAT_DISAGG)
    (spec,) = [p for p in cfg.plugins if p.type == "disagg-profile-handler"]
    assert spec.parameters == {
        "profiles": {"decode": "dec", "prefill": "pre"},
        "deciders": {"prefill": "always"},
    }
    assert any(e["event"] == "deprecated_plugin_parameters_moved" for e in logs)
    build(cfg, default_registry())


def test_disagg_handler_mixed_forms_are_refused_naming_the_field() -> None:
    mixed = FLAT_DISAGG.replace("    deciderPluginName: always", "    deciders: {prefill: always}")
    with pytest.raises(ConfigError, match="decodeProfile"):
        build(load_config(mixed), default_registry())
