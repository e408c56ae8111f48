"""llm-d-router's EndpointPickerConfig (``llm-d.ai/v1alpha1``, ``llm-d.ai/v1``): its moved fields map onto
GIE's, validation stays strict and errors keep their field paths."""

from __future__ import annotations

import pytest

from epp.app.build import build
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.config.schema import DataLayerSource, PluginRef
from epp.errors import ConfigError

LLMD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
PLUGINS = "plugins:\n- type: queue-scorer\n- type: utilization-detector\n- type: openai-parser\n"


@pytest.mark.parametrize("version", ["llm-d.ai/v1alpha1", "llm-d.ai/v1"])
def test_llm_d_api_versions_load_and_keep_their_version(version: str) -> None:
    cfg = load_config(f"apiVersion: {version}\nkind: EndpointPickerConfig\n{PLUGINS}")
    assert cfg.api_version == version
    assert [p.name for p in cfg.plugins] == ["queue-scorer", "utilization-detector", "openai-parser"]


def test_moved_fields_map_to_gie_ones() -> None:
    cfg = load_config(
        LLMD
        + PLUGINS
        + "requestHandler:\n  parsers:\n  - pluginRef: openai-parser\n"
        + "flowControl:\n  saturationDetector: {pluginRef: utilization-detector}\n  maxRequests: 10\n"
    )
    assert cfg.parser == PluginRef(plugin_ref="openai-parser")
    assert cfg.saturation_detector == PluginRef(plugin_ref="utilization-detector")
    assert cfg.flow_control is not None and cfg.flow_control.max_requests == 10


def test_new_fields_win_over_deprecated_top_level_ones() -> None:
    cfg = load_config(
        LLMD
        + PLUGINS
        + "parser: {pluginRef: old-parser}\nsaturationDetector: {pluginRef: old-detector}\n"
        + "requestHandler: {parsers: [{pluginRef: openai-parser}]}\n"
        + "flowControl: {saturationDetector: {pluginRef: utilization-detector}}\n"
    )
    assert cfg.parser == PluginRef(plugin_ref="openai-parser")
    assert cfg.saturation_detector == PluginRef(plugin_ref="utilization-detector")


def test_deprecated_top_level_fields_still_accepted() -> None:
    cfg = load_config(
        LLMD + PLUGINS + "parser: {pluginRef: openai-parser}\nsaturationDetector: {pluginRef: x}\n"
    )
    assert cfg.parser == PluginRef(plugin_ref="openai-parser")
    assert cfg.saturation_detector == PluginRef(plugin_ref="x")


def test_feature_gate_values() -> None:
    cfg = load_config(
        LLMD + "featureGates: [flowControl=true, enableLegacyMetrics=false, haPopulateNonLeaderDatastore]\n"
    )
    assert cfg.feature_gates == ("flowControl",)


def test_inject_defaults_adds_the_metrics_source_beside_listed_ones() -> None:
    text = LLMD + "plugins:\n- {type: my-source}\ndataLayer:\n  sources:\n  - pluginRef: my-source\n"
    cfg = load_config(text)
    assert cfg.data_layer is not None
    assert cfg.data_layer.sources == (
        DataLayerSource(plugin_ref="my-source"),
        DataLayerSource(
            plugin_ref="metrics-data-source", extractors=(PluginRef(plugin_ref="core-metrics-extractor"),)
        ),
    )
    assert [p.name for p in cfg.plugins] == ["my-source", "metrics-data-source", "core-metrics-extractor"]
    opted_out = load_config(text + "  injectDefaults: false\n")
    assert opted_out.data_layer is not None
    assert opted_out.data_layer.sources == (DataLayerSource(plugin_ref="my-source"),)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param("bogus: 1\n", "bogus: Extra inputs are not permitted", id="unknown-top-level-field"),
        pytest.param(
            "requestHandler: {parsers: [{pluginRef: a}], extra: 1}\n",
            "requestHandler.extra: Extra inputs are not permitted",
            id="unknown-request-handler-field",
        ),
        pytest.param(
            "requestHandler: {parsers: [{pluginRef: 3}]}\n",
            "requestHandler.parsers[0].pluginRef: Input should be a valid string",
            id="parser-ref-type",
        ),
        pytest.param(
            "flowControl: {saturationDetector: {pluginRef: x, bogus: 1}}\n",
            "flowControl.saturationDetector.bogus: Extra inputs are not permitted",
            id="unknown-detector-field",
        ),
        pytest.param(
            "flowControl: {maxBytes: -1}\n",
            "flowControl.maxBytes: quantity must not be negative",
            id="gie-field-validation-kept",
        ),
        pytest.param(
            "flowControl: {enableEviction: yes-please}\n",
            "flowControl.enableEviction: Input should be a valid boolean",
            id="eviction-type",
        ),
        pytest.param(
            "flowControl: {noEndpointRequestTTL: 5m}\n",
            "flowControl.noEndpointRequestTTL) is not supported",
            id="no-endpoint-ttl-unsupported",
        ),
        pytest.param(
            "flowControl: {noEndpointRequestTTL: soon}\n",
            "flowControl.noEndpointRequestTTL: ",
            id="no-endpoint-ttl-type",
        ),
        pytest.param(
            "dataLayer: {peerDiscovery: {pluginRef: d, bogus: 1}}\n",
            "dataLayer.peerDiscovery.bogus: Extra inputs are not permitted",
            id="peer-discovery-strict",
        ),
        pytest.param(
            "dataLayer: {injectDefaults: false}\n",
            "dataLayer.injectDefaults: false with no dataLayer.sources",
            id="no-sources-at-all",
        ),
        pytest.param(
            "featureGates: [flowControl=maybe]\n",
            "featureGates[0]: feature gate 'flowControl' has value 'maybe'",
            id="gate-value",
        ),
        pytest.param(
            "featureGates: [noSuchGate=true]\n",
            "featureGates[0]: feature gate validation failed: feature gate 'noSuchGate' is unknown",
            id="unknown-gate",
        ),
        pytest.param(
            "plugins:\n- type: a\n- type: a\n",
            "plugins[1].name: duplicate plugin name 'a'",
            id="structure-checks-kept",
        ),
    ],
)
def test_strict_validation_with_field_paths(body: str, expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(LLMD + body)
    assert expected in str(e.value)


def test_gie_api_version_with_llm_d_only_fields_is_read_as_llm_d_router_reads_it() -> None:
    """llm-d-router decodes GIE's group with its own schema (its integration configs use
    ``requestHandler`` under GIE's apiVersion), so such a file is read with llm-d's layout."""
    cfg = load_config(
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
        "requestHandler: {parsers: [{pluginRef: passthrough-parser}]}\n"
    )
    assert cfg.api_version == "inference.networking.x-k8s.io/v1alpha1"
    assert cfg.parser is not None
    assert cfg.parser.plugin_ref == "passthrough-parser"
    with pytest.raises(ConfigError, match=r"flowControl\.noEndpointRequestTTL"):
        load_config(
            "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
            "requestHandler: {parsers: []}\nflowControl: {noEndpointRequestTTL: 5m}\n"
        )


def test_llm_d_config_builds_like_its_gie_twin() -> None:
    """The same setup in both layouts builds the same components."""
    body = (
        "plugins:\n- type: queue-scorer\n- type: utilization-detector\n"
        "  parameters: {queueDepthThreshold: 3}\n- type: openai-parser\n"
        "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n"
    )
    llmd = load_config(
        LLMD
        + "featureGates: [flowControl=true]\n"
        + body
        + "requestHandler: {parsers: [{pluginRef: openai-parser}]}\n"
        + "flowControl: {saturationDetector: {pluginRef: utilization-detector}, defaultRequestTTL: 30s}\n"
    )
    gie = load_config(
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
        + "featureGates: [flowControl]\n"
        + body
        + "parser: {pluginRef: openai-parser}\nsaturationDetector: {pluginRef: utilization-detector}\n"
        + "flowControl: {defaultRequestTTL: 30s}\n"
    )
    assert llmd.model_dump(exclude={"api_version"}) == gie.model_dump(exclude={"api_version"})
    assert build(llmd, default_registry()).summary() == build(gie, default_registry()).summary()
