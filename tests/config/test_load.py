"""Loading config text: strict schema, field paths in every error, the built-in default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from epp.config.load import DEFAULT_CONFIG_YAML, default_config, load, load_config, load_config_file
from epp.config.schema import (
    DEFAULT_BAND_MAX_BYTES,
    EndpointPickerConfig,
    FlowControlConfig,
    PriorityBandConfig,
    parse_quantity,
)
from epp.errors import ConfigError
from epp.units import parse_go_duration

REPO = Path(__file__).resolve().parents[2]
HEAD = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            HEAD + "bogus: 1\n", "bogus: Extra inputs are not permitted", id="unknown-top-level-field"
        ),
        pytest.param(
            "apiVersion: v1\nkind: EndpointPickerConfig\n",
            "apiVersion: Input should be 'inference.networking.x-k8s.io/v1alpha1'",
            id="wrong-api-version",
        ),
        pytest.param(
            "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: Pod\n",
            "kind: Input should be 'EndpointPickerConfig'",
            id="wrong-kind",
        ),
        pytest.param("kind: EndpointPickerConfig\n", "apiVersion: Field required", id="missing-api-version"),
        pytest.param(
            HEAD + "plugins:\n- type: a\n- type: b\n  extra: 1\n",
            "plugins[1].extra: Extra inputs are not permitted",
            id="unknown-plugin-field",
        ),
        pytest.param(
            HEAD + "plugins:\n- type: a\n  name: 5\n",
            "plugins[0].name: Input should be a valid string",
            id="wrong-type",
        ),
        pytest.param(
            HEAD + "plugins:\n- type: a\n- name: b\n",
            "plugins[1].type: plugin 'b' is missing a type",
            id="missing-type",
        ),
        pytest.param(
            HEAD + "plugins:\n- type: a\n- {type: b, name: a}\n",
            "plugins[1].name: duplicate plugin name 'a'",
            id="duplicate-plugin-name",
        ),
        pytest.param(
            HEAD + "plugins:\n- type: a\n- type: a\n",
            "plugins[1].name: duplicate plugin name 'a'",
            id="duplicate-name-from-type",
        ),
        pytest.param(
            HEAD + "plugins: {type: a}\n", "plugins: Input should be a valid tuple", id="plugins-not-a-list"
        ),
        pytest.param(
            HEAD + "schedulingProfiles:\n- plugins: []\n",
            "schedulingProfiles[0].name: schedulingProfiles[0] is missing a name",
            id="missing-profile-name",
        ),
        pytest.param(
            HEAD + "schedulingProfiles:\n- name: p\n- name: p\n",
            "schedulingProfiles[1].name: schedulingProfiles[1] has duplicate name 'p'",
            id="duplicate-profile-name",
        ),
        pytest.param(
            HEAD + "schedulingProfiles:\n- name: p\n  plugins: [{pluginRef: a}, {weight: 2}]\n",
            "schedulingProfiles[0].plugins[1].pluginRef: "
            "schedulingProfiles[p].plugins[1] is missing a 'pluginRef'",
            id="missing-plugin-ref",
        ),
        pytest.param(
            HEAD
            + "schedulingProfiles:\n- name: p\n  plugins: [{pluginRef: a}, {pluginRef: b, weight: '2'}]\n",
            "schedulingProfiles[0].plugins[1].weight: Input should be a valid number",
            id="weight-wrong-type",
        ),
        pytest.param(
            HEAD + "schedulingProfiles:\n- name: p\n  plugins: [{pluginRef: a, weight: -1}]\n",
            "schedulingProfiles[0].plugins[0].weight: Input should be greater than or equal to 0",
            id="weight-negative",
        ),
        pytest.param(
            HEAD + "schedulingProfiles:\n- name: p\n  plugins: [{pluginRef: a, weight: .nan}]\n",
            "schedulingProfiles[0].plugins[0].weight: Input should be a finite number",
            id="weight-nan",
        ),
        pytest.param(
            HEAD + "featureGates: [flowControl, warpDrive]\n",
            "featureGates[1]: feature gate validation failed: "
            "feature gate 'warpDrive' is unknown or unregistered",
            id="unknown-feature-gate",
        ),
        pytest.param(
            HEAD + "flowControl:\n  priorityBands:\n  - {priority: 1, maxBytes: 12XB}\n",
            "flowControl.priorityBands[0].maxBytes: invalid quantity '12XB'",
            id="bad-quantity",
        ),
        pytest.param(
            HEAD + "flowControl: {maxRequests: -5}\n",
            "flowControl.maxRequests: quantity must not be negative",
            id="negative-quantity",
        ),
        pytest.param(
            HEAD + "flowControl: {defaultRequestTTL: 30}\n",
            "flowControl.defaultRequestTTL: duration must be a string",
            id="duration-not-a-string",
        ),
        pytest.param(
            HEAD + "flowControl: {defaultRequestTTL: 30 days}\n",
            'flowControl.defaultRequestTTL: time: unknown unit " days" in duration "30 days"',
            id="bad-duration",
        ),
        pytest.param(
            HEAD + "flowControl:\n  priorityBands: [{priority: 5}, {priority: 5}]\n",
            "flowControl.priorityBands[1].priority: duplicate priority level 5",
            id="duplicate-band-priority",
        ),
        pytest.param(
            HEAD + "flowControl: {maxBytez: 1}\n",
            "flowControl.maxBytez: Extra inputs are not permitted",
            id="fc-typo",
        ),
        pytest.param(
            HEAD + "dataLayer: {}\n",
            "dataLayer: data layer enabled but no data sources configured",
            id="data-layer-without-sources",
        ),
        pytest.param(
            HEAD + "dataLayer:\n  sources: [{pluginRef: s, extractors: [{}]}]\n",
            "dataLayer.sources[0].extractors[0].pluginRef: extractor is missing a 'pluginRef'",
            id="extractor-without-ref",
        ),
        pytest.param(
            HEAD + "dataLayer:\n  sources: [{extractors: []}]\n",
            "dataLayer.sources[0].pluginRef: Field required",
            id="source-without-ref",
        ),
        pytest.param(
            HEAD + "parser: {pluginRef: ''}\n",
            "parser.pluginRef: parser is missing a 'pluginRef'",
            id="parser-empty",
        ),
        pytest.param(
            HEAD + "saturationDetector: {pluginRef: d, threshold: 1}\n",
            "saturationDetector.threshold: Extra inputs are not permitted",
            id="detector-unknown-field",
        ),
        pytest.param(
            HEAD + "plugins: [\n",
            "failed to parse config: line 4, column 1:",
            id="yaml-syntax-error-line-column",
        ),
        pytest.param(
            HEAD + "plugins: []\nplugins: []\n",
            "failed to parse config: line 4, column 1: duplicate field 'plugins'",
            id="duplicate-yaml-key",
        ),
        pytest.param(
            "- a\n- b\n",
            "failed to parse config: expected a mapping (an EndpointPickerConfig), got list",
            id="not-a-mapping",
        ),
        pytest.param(
            "# only a comment\n",
            "failed to parse config: expected a mapping (an EndpointPickerConfig), got NoneType",
            id="comment",
        ),
    ],
)
def test_invalid_config_is_rejected_with_its_path(text: str, expected: str) -> None:
    """Each class of invalid config fails to load with a ConfigError that starts with the field path."""
    with pytest.raises(ConfigError) as err:
        load_config(text)
    assert str(err.value).startswith(expected), str(err.value)


def test_every_schema_error_is_reported_at_once() -> None:
    """Several schema errors in one file are all named, separated by '; '."""
    text = HEAD + "plugins:\n- {type: a, foo: 1}\nflowControl: {maxBytes: x}\n"
    with pytest.raises(ConfigError) as err:
        load_config(text)
    assert str(err.value).split("; ") == [
        "plugins[0].foo: Extra inputs are not permitted",
        "flowControl.maxBytes: invalid quantity 'x': expected a number with an optional suffix "
        "(Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P, E, m or an exponent like e9)",
    ]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("  \n\t\n", id="whitespace"),
        pytest.param(b"", id="empty-bytes"),
    ],
)
def test_blank_text_is_the_builtin_default(text: str | bytes) -> None:
    """No config at all means GIE's built-in default (queue w2, kv w2, prefix w3, metrics source)."""
    cfg = load_config(text)
    assert cfg == default_config()
    assert [p.name for p in cfg.plugins] == [
        "queue-scorer",
        "kv-cache-utilization-scorer",
        "prefix-cache-scorer",
        "metrics-data-source",
        "core-metrics-extractor",
    ]
    assert [(r.plugin_ref, r.weight) for r in cfg.scheduling_profiles[0].plugins] == [
        ("queue-scorer", 2.0),
        ("kv-cache-utilization-scorer", 2.0),
        ("prefix-cache-scorer", 3.0),
    ]


def test_default_yaml_file_matches_the_builtin_default() -> None:
    """config/default.yaml documents exactly what the EPP runs without a config."""
    assert load_config_file(REPO / "config" / "default.yaml") == load_config(DEFAULT_CONFIG_YAML)


def test_json_text_is_accepted() -> None:
    """JSON (a YAML subset) loads like YAML; plugin names default to their type."""
    doc = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [{"type": "queue-scorer", "parameters": {"x": [1, 2]}}],
    }
    cfg = load_config(json.dumps(doc))
    assert cfg.plugins[0].name == "queue-scorer"
    assert cfg.plugins[0].parameters == {"x": [1, 2]}


def test_weights_are_floats_and_optional() -> None:
    """An int weight becomes a float; an omitted weight stays None until the builder defaults it."""
    cfg = load_config(
        HEAD + "schedulingProfiles:\n- name: p\n  plugins: [{pluginRef: a, weight: 2}, {pluginRef: b}]\n"
    )
    weights = [r.weight for r in cfg.scheduling_profiles[0].plugins]
    assert weights == [2.0, None]
    assert isinstance(weights[0], float)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("1Gi", 1 << 30, id="Gi"),
        pytest.param("500M", 500_000_000, id="M"),
        pytest.param("1024", 1024, id="plain-string"),
        pytest.param(1024, 1024, id="int"),
        pytest.param(1e9, 1_000_000_000, id="float"),
        pytest.param("1.5Gi", 1_610_612_736, id="fractional-binary"),
        pytest.param(".5Ki", 512, id="leading-dot"),
        pytest.param("+5k", 5000, id="plus-sign"),
        pytest.param("1e3", 1000, id="exponent"),
        pytest.param("1E3", 1000, id="capital-exponent"),
        pytest.param("2E", 2 * 10**18, id="exa"),
        pytest.param("500m", 1, id="milli-rounds-up"),
        pytest.param("0", 0, id="zero"),
    ],
)
def test_quantity(value: object, expected: int) -> None:
    """Kubernetes quantities become byte/request counts, rounded up like Quantity.Value()."""
    assert parse_quantity(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("1Gx", id="bad-suffix"),
        pytest.param("", id="empty"),
        pytest.param("Gi", id="no-number"),
        pytest.param("1.2.3", id="two-dots"),
        pytest.param("1 Gi", id="space"),
        pytest.param(True, id="bool"),
        pytest.param(-1, id="negative-int"),
        pytest.param("-1Ki", id="negative-string"),
        pytest.param(float("inf"), id="infinite"),
        pytest.param([1], id="list"),
    ],
)
def test_quantity_rejects(value: object) -> None:
    """Anything that is not a non-negative quantity is refused."""
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(value)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("30s", 30.0, id="seconds"),
        pytest.param("1m30s", 90.0, id="compound"),
        pytest.param("250ms", 0.25, id="millis"),
        pytest.param("1.5h", 5400.0, id="fractional-hours"),
        pytest.param("2us", 2e-6, id="micros"),
        pytest.param("2µs", 2e-6, id="micro-sign"),
        pytest.param("10ns", 1e-8, id="nanos"),
        pytest.param("0", 0.0, id="bare-zero"),
        pytest.param("-1s", -1.0, id="negative"),
    ],
)
def test_go_duration(text: str, seconds: float) -> None:
    """Go's time.ParseDuration syntax, in seconds."""
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("30", "time: missing unit in duration", id="no-unit"),
        pytest.param("s", "time: invalid duration", id="no-number"),
        pytest.param("1d", 'time: unknown unit "d"', id="days"),
        pytest.param("", "time: invalid duration", id="empty"),
    ],
)
def test_go_duration_rejects(text: str, message: str) -> None:
    """Strings Go would refuse are refused, with Go's message."""
    with pytest.raises(ValueError, match=message):
        parse_go_duration(text)


def test_flow_control_quantities_and_resolved_defaults() -> None:
    """Quantities and durations parse; resolved() fills GIE's band defaults and policy names."""
    cfg = load_config(
        HEAD
        + "flowControl:\n  maxBytes: 1Gi\n  defaultRequestTTL: 1m30s\n"
        + "  priorityBands:\n"
        + "  - {priority: 100, maxBytes: 500M, maxRequests: '10'}\n"
        + "  - {priority: 0, maxBytes: 0}\n"
    )
    assert cfg.flow_control is not None
    fc = cfg.flow_control.resolved()
    assert (fc.max_bytes, fc.max_requests, fc.default_request_ttl) == (1 << 30, 0, 90.0)
    assert fc.usage_limit_policy_plugin_ref == "static-usage-limit-policy"
    assert fc.default_priority_band == PriorityBandConfig(
        priority=0,
        max_bytes=DEFAULT_BAND_MAX_BYTES,
        max_requests=0,
        fairness_policy_ref="global-strict-fairness-policy",
        ordering_policy_ref="fcfs-ordering-policy",
    )
    assert [(b.priority, b.max_bytes, b.max_requests) for b in fc.priority_bands] == [
        (100, 500_000_000, 10),
        (0, DEFAULT_BAND_MAX_BYTES, 0),
    ]
    assert FlowControlConfig().resolved().default_request_ttl == 0.0


def test_load_from_flags(tmp_path: Path) -> None:
    """--config-file reads the file; --config-text is inline; neither is the default; both is GIE's error."""
    path = tmp_path / "epp.yaml"
    path.write_text(HEAD + "plugins: [{type: x}]\n")
    assert load(config_file=str(path)).plugins[0].type == "x"
    assert load(config_text=HEAD + "plugins: [{type: y}]\n").plugins[0].type == "y"
    assert load() == default_config()
    with pytest.raises(ConfigError, match='both the "configText" and "configFile" flags can not be set'):
        load(config_file=str(path), config_text="x")


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    """A missing file and an invalid file both say which file."""
    with pytest.raises(ConfigError, match=r"failed to read config file '.*nope\.yaml'"):
        load_config_file(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text(HEAD + "bogus: 1\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: bogus: Extra inputs are not permitted"):
        load_config_file(bad)


def test_models_are_frozen() -> None:
    """A loaded config cannot be mutated behind the builder's back."""
    cfg = default_config()
    with pytest.raises(ValueError, match="frozen"):
        cfg.plugins = ()
    assert isinstance(cfg, EndpointPickerConfig)
    assert yaml.safe_load(DEFAULT_CONFIG_YAML)["kind"] == "EndpointPickerConfig"
