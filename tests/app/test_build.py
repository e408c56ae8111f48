"""Building components from a config: GIE's defaulting and validation, deterministic, all or nothing."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

import epp.datalayer.assembly as datalayer_assembly
from epp.app.build import BuildOptions, Components, MetricsFlags, build, parser_supports
from epp.config.features import FLOW_CONTROL_ENV
from epp.datalayer.api import SourceBinding
from epp.errors import ConfigError
from epp.plugin.registry import Registry
from tests.config import fakes
from tests.config.conftest import ConfigFactory

Doc = dict[str, Any]

SCORERS: list[Doc] = [{"type": "test-scorer"}, {"name": "s2", "type": "test-scorer"}]
ONE_PROFILE: list[Doc] = [{"name": "p", "plugins": [{"pluginRef": "test-scorer"}]}]


def _build(
    make_config: ConfigFactory, registry: Registry, options: BuildOptions | None = None, **doc: Any
) -> Components:
    return build(make_config(**doc), registry, options)


def _names(components: Components) -> list[str]:
    return list(components.plugins)


def _profile(components: Components, name: str = "default") -> Any:
    return components.scheduler.profiles[name]


# --- invalid configs -------------------------------------------------------------------------

INVALID: list[Any] = [
    pytest.param(
        {"plugins": [{"type": "test-scorer"}, {"type": "nope"}]},
        "plugins[1].type: plugin type 'nope' is not registered",
        id="unregistered-type",
    ),
    pytest.param(
        {"plugins": [{"type": "test-scorer", "parameters": {"threshold": "x"}}]},
        "plugins[0].parameters.threshold: Input should be a valid integer",
        id="bad-plugin-param",
    ),
    pytest.param(
        {"plugins": [{"type": "test-scorer", "parameters": {"treshold": 1}}]},
        "plugins[0].parameters.treshold: Extra inputs are not permitted",
        id="unknown-plugin-param",
    ),
    pytest.param(
        {"plugins": [{"type": "test-scorer"}, {"type": "test-exploding"}]},
        "plugins[1] (test-exploding/test-exploding): failed to create plugin: RuntimeError('boom')",
        id="constructor-raises",
    ),
    pytest.param(
        {
            "plugins": SCORERS,
            "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "s2"}, {"pluginRef": "s3"}]}],
        },
        "schedulingProfiles[0].plugins[1].pluginRef: schedulingProfiles[p] references undefined plugin 's3'",
        id="dangling-profile-ref",
    ),
    pytest.param(
        {
            "plugins": [{"type": "max-score-picker"}, {"type": "test-picker"}],
            "schedulingProfiles": [
                {"name": "p", "plugins": [{"pluginRef": "max-score-picker"}, {"pluginRef": "test-picker"}]}
            ],
        },
        "schedulingProfiles[0].plugins[1].pluginRef: failed to set 'test-picker' as picker, "
        "already have a registered picker plugin 'max-score-picker'",
        id="two-pickers-in-profile",
    ),
    pytest.param(
        {"plugins": SCORERS, "schedulingProfiles": [{"name": "a"}, {"name": "b"}]},
        "schedulingProfiles: no profile handler configured",
        id="two-profiles-no-handler",
    ),
    pytest.param(
        {
            "plugins": [{"type": "single-profile-handler"}],
            "schedulingProfiles": [{"name": "a"}, {"name": "b"}],
        },
        "schedulingProfiles: SingleProfileHandler cannot support multiple scheduling profiles (got 2)",
        id="single-handler-two-profiles",
    ),
    pytest.param(
        {"plugins": [{"type": "single-profile-handler"}, {"type": "test-multi-handler"}]},
        "plugins: multiple profile handlers found ('single-profile-handler', 'test-multi-handler'); "
        "only one is allowed",
        id="two-handlers",
    ),
    pytest.param(
        {"plugins": SCORERS, "saturationDetector": {"pluginRef": "mine"}},
        "saturationDetector.pluginRef: saturation detector references undefined plugin 'mine'",
        id="dangling-saturation-detector",
    ),
    pytest.param(
        {"plugins": SCORERS, "saturationDetector": {"pluginRef": "s2"}},
        "saturationDetector.pluginRef: plugin 's2' is not a fwkflowcontrol.SaturationDetector",
        id="saturation-detector-wrong-kind",
    ),
    pytest.param(
        {"plugins": SCORERS, "parser": {"pluginRef": "my-parser"}},
        "parser.pluginRef: the configured parser is not loaded (no plugin named 'my-parser')",
        id="dangling-parser",
    ),
    pytest.param(
        {"plugins": SCORERS, "parser": {"pluginRef": "s2"}},
        "parser.pluginRef: the specified plugin is not a parser plugin in the config ('s2/test-scorer')",
        id="parser-wrong-kind",
    ),
    pytest.param(
        {"plugins": SCORERS, "dataLayer": {"sources": [{"pluginRef": "src"}]}},
        "dataLayer.sources[0].pluginRef: data source references undefined plugin 'src'",
        id="dangling-data-source",
    ),
    pytest.param(
        {
            "plugins": [{"type": "metrics-data-source"}],
            "dataLayer": {
                "sources": [{"pluginRef": "metrics-data-source", "extractors": [{"pluginRef": "ext"}]}]
            },
        },
        "dataLayer.sources[0].extractors[0].pluginRef: extractor references undefined plugin 'ext'",
        id="dangling-extractor",
    ),
    pytest.param(
        {"plugins": SCORERS, "dataLayer": {"sources": [{"pluginRef": "s2"}]}},
        "dataLayer.sources[0].pluginRef: the plugin s2 is not a fwkdl.DataSource",
        id="source-wrong-kind",
    ),
    pytest.param(
        {
            "plugins": [{"type": "metrics-data-source"}, *SCORERS],
            "dataLayer": {
                "sources": [{"pluginRef": "metrics-data-source", "extractors": [{"pluginRef": "s2"}]}]
            },
        },
        "dataLayer.sources[0].extractors[0].pluginRef: the plugin s2 is not a fwkdl.Extractor",
        id="extractor-wrong-kind",
    ),
    pytest.param(
        {
            "plugins": [{"type": "metrics-data-source"}, {"type": "test-bytes-extractor"}],
            "dataLayer": {
                "sources": [
                    {
                        "pluginRef": "metrics-data-source",
                        "extractors": [{"pluginRef": "test-bytes-extractor"}],
                    }
                ]
            },
        },
        "dataLayer.sources[0].extractors[0].pluginRef: extractor 'test-bytes-extractor/test-bytes-extractor' "
        "expects bytes but source 'metrics-data-source/metrics-data-source' produces str",
        id="extractor-input-mismatch",
    ),
    pytest.param(
        {
            "plugins": [{"type": "metrics-data-source"}],
            "dataLayer": {
                "sources": [{"pluginRef": "metrics-data-source"}, {"pluginRef": "metrics-data-source"}]
            },
        },
        "dataLayer.sources[1].pluginRef: data source 'metrics-data-source' is listed twice",
        id="source-twice",
    ),
    pytest.param(
        {"plugins": [{"type": "test-orphan-consumer"}]},
        "plugins: plugin 'test-orphan-consumer/test-orphan-consumer' consumes 'test-unproduced' "
        "but no plugin produces it",
        id="consumer-without-producer",
    ),
    pytest.param(
        {"plugins": [{"type": "test-latency-scorer"}]},
        "plugins: plugin 'test-latency-scorer/test-latency-scorer' consumes 'LatencyPredictionInfoKey' "
        "but its default producer type 'predicted-latency-producer' is not registered",
        id="default-producer-unregistered",
    ),
    pytest.param(
        {
            "plugins": [
                {"type": "test-prefix-scorer"},
                {"name": "approx-prefix-cache-producer", "type": "test-filter"},
            ]
        },
        "plugins: plugin 'test-prefix-scorer/test-prefix-scorer' consumes 'PrefixCacheMatchInfoKey'; "
        "its default producer 'approx-prefix-cache-producer' cannot be added because "
        "'approx-prefix-cache-producer/test-filter' has that name",
        id="default-producer-name-taken",
    ),
    pytest.param(
        {
            "featureGates": ["flowControl"],
            "plugins": SCORERS,
            "flowControl": {"priorityBands": [{"priority": 1, "orderingPolicyRef": "edf"}]},
        },
        'flowControl.priorityBands[0].orderingPolicyRef: no ordering policy registered for name "edf"',
        id="fc-dangling-ordering-policy",
    ),
    pytest.param(
        {
            "featureGates": ["flowControl"],
            "plugins": SCORERS,
            "flowControl": {"defaultPriorityBand": {"fairnessPolicyRef": "rr"}},
        },
        'flowControl.defaultPriorityBand.fairnessPolicyRef: no fairness policy registered for name "rr"',
        id="fc-dangling-fairness-policy",
    ),
    pytest.param(
        {
            "featureGates": ["flowControl"],
            "plugins": SCORERS,
            "flowControl": {"usageLimitPolicyPluginRef": "x"},
        },
        "flowControl.usageLimitPolicyPluginRef: usage limit policy plugin 'x' not found",
        id="fc-dangling-usage-limit",
    ),
    pytest.param(
        {
            "featureGates": ["flowControl"],
            "plugins": SCORERS,
            "flowControl": {"usageLimitPolicyPluginRef": "s2"},
        },
        "flowControl.usageLimitPolicyPluginRef: plugin 's2' does not implement UsageLimitPolicy",
        id="fc-usage-limit-wrong-kind",
    ),
    pytest.param(
        {"featureGates": ["enableLegacyMetrics"], "plugins": [*SCORERS, {"type": "core-metrics-extractor"}]},
        "plugins[2].type: 'core-metrics-extractor' cannot be used with the "
        "'enableLegacyMetrics' feature gate",
        id="legacy-with-core-extractor",
    ),
]


@pytest.mark.parametrize(("doc", "expected"), INVALID)
def test_invalid_config_fails_to_build(
    make_config: ConfigFactory, registry: Registry, doc: Doc, expected: str
) -> None:
    """Each invalid config raises one ConfigError whose message starts with the path at fault."""
    with pytest.raises(ConfigError) as err:
        _build(make_config, registry, **doc)
    assert str(err.value).startswith(expected), str(err.value)


@pytest.mark.parametrize(
    "missing",
    [
        "single-profile-handler",
        "max-score-picker",
        "openai-parser",
        "utilization-detector",
        "metrics-data-source",
    ],
)
def test_missing_default_plugin_type_is_reported(make_config: ConfigFactory, missing: str) -> None:
    """An auto-added plugin whose type is not registered fails with the section that needed it."""
    registry = Registry(cls for cls in fakes.FAKES if missing != cls.TYPE)
    with pytest.raises(ConfigError, match=f"default plugin type '{missing}' is not registered"):
        _build(make_config, registry, plugins=SCORERS)


# --- defaulting (§8.2 step 6) ------------------------------------------------------------------


def test_no_profiles_gives_a_default_profile_in_config_order(
    make_config: ConfigFactory, registry: Registry
) -> None:
    """Without profiles, one 'default' profile holds every filter, scorer and picker in config order."""
    c = _build(
        make_config,
        registry,
        plugins=[
            {"type": "test-scorer"},
            {"type": "test-filter"},
            {"type": "test-picker"},
            {"type": "test-reporter"},
            {"name": "s2", "type": "test-scorer"},
            {"name": "f2", "type": "test-filter"},
        ],
    )
    profile = _profile(c)
    assert list(c.scheduler.profiles) == ["default"]
    assert [f.typed_name.name for f in profile.filters] == ["test-filter", "f2"]
    assert [(s.typed_name.name, w) for s, w in profile.scorers] == [("test-scorer", 1.0), ("s2", 1.0)]
    assert profile.picker is c.plugins["test-picker"]
    assert "max-score-picker" not in c.plugins


def test_auto_added_plugins_follow_config_plugins(make_config: ConfigFactory, registry: Registry) -> None:
    """Defaults are added after the configured plugins, in a fixed order."""
    c = _build(make_config, registry, plugins=[{"type": "test-prefix-scorer"}])
    assert _names(c) == [
        "test-prefix-scorer",
        "single-profile-handler",
        "max-score-picker",
        "openai-parser",
        "utilization-detector",
        "metrics-data-source",
        "core-metrics-extractor",
        "approx-prefix-cache-producer",
    ]
    assert isinstance(c.parser, fakes.OpenAIParser)
    assert isinstance(c.saturation_detector, fakes.UtilizationDetector)
    assert c.producers == (c.plugins["approx-prefix-cache-producer"],)


def test_profile_without_picker_gets_first_picker_in_config_order(
    make_config: ConfigFactory, registry: Registry
) -> None:
    """A profile with no picker gets the first configured picker; one with a picker keeps it."""
    c = _build(
        make_config,
        registry,
        plugins=[
            {"type": "test-multi-handler"},
            {"type": "test-picker"},
            {"type": "max-score-picker"},
            {"type": "test-scorer"},
        ],
        schedulingProfiles=[
            {"name": "a", "plugins": [{"pluginRef": "test-scorer"}]},
            {"name": "b", "plugins": [{"pluginRef": "max-score-picker"}]},
        ],
    )
    assert _profile(c, "a").picker is c.plugins["test-picker"]
    assert _profile(c, "b").picker is c.plugins["max-score-picker"]
    assert list(c.scheduler.profiles) == ["a", "b"]


@pytest.mark.parametrize(
    ("weight", "expected"),
    [
        pytest.param(None, [("test-scorer", 1.0)], id="omitted-defaults-to-1"),
        pytest.param(2, [("test-scorer", 2.0)], id="int-becomes-float"),
        pytest.param(0.25, [("test-scorer", 0.25)], id="fraction"),
        pytest.param(0, [], id="zero-is-skipped"),
    ],
)
def test_scorer_weight(
    make_config: ConfigFactory, registry: Registry, weight: float | None, expected: list[tuple[str, float]]
) -> None:
    """Scorer weights default to 1.0; a zero weight drops the scorer (it could not change any total)."""
    ref: Doc = (
        {"pluginRef": "test-scorer"} if weight is None else {"pluginRef": "test-scorer", "weight": weight}
    )
    c = _build(make_config, registry, plugins=SCORERS, schedulingProfiles=[{"name": "p", "plugins": [ref]}])
    assert [(s.typed_name.name, w) for s, w in _profile(c, "p").scorers] == expected


def test_non_scheduling_plugin_in_profile_is_ignored_with_a_warning(
    make_config: ConfigFactory, registry: Registry
) -> None:
    """A reporter placed in a profile does nothing there (as in GIE) but is logged."""
    with capture_logs() as logs:
        c = _build(
            make_config,
            registry,
            plugins=[{"type": "test-reporter"}, {"type": "test-filter"}],
            schedulingProfiles=[
                {
                    "name": "p",
                    "plugins": [{"pluginRef": "test-reporter"}, {"pluginRef": "test-filter", "weight": 3}],
                }
            ],
        )
    assert [f.typed_name.name for f in _profile(c, "p").filters] == ["test-filter"]
    events = [(e["event"], e["plugin"]) for e in logs if "plugin" in e]
    assert ("profile_plugin_ignored", "test-reporter/test-reporter") in events
    assert ("weight_ignored_not_a_scorer", "test-filter/test-filter") in events
    assert c.response_complete == (c.plugins["test-reporter"],)


def test_multi_profile_handler_accepts_several_profiles(
    make_config: ConfigFactory, registry: Registry
) -> None:
    """A handler without MAX_PROFILES may run any number of profiles; none is auto-added."""
    c = _build(
        make_config,
        registry,
        plugins=[{"type": "test-multi-handler"}, *SCORERS],
        schedulingProfiles=[{"name": "a"}, {"name": "b"}, {"name": "c"}],
    )
    assert list(c.scheduler.profiles) == ["a", "b", "c"]
    assert "single-profile-handler" not in c.plugins


def test_declared_parser_and_detector_are_used(make_config: ConfigFactory, registry: Registry) -> None:
    """Explicit parser and saturation detector references win over the defaults, which are not added."""
    c = _build(
        make_config,
        registry,
        plugins=[
            *SCORERS,
            {"name": "pt", "type": "passthrough-parser"},
            {"name": "ud", "type": "utilization-detector"},
        ],
        schedulingProfiles=ONE_PROFILE,
        parser={"pluginRef": "pt"},
        saturationDetector={"pluginRef": "ud"},
    )
    assert c.parser is c.plugins["pt"]
    assert c.saturation_detector is c.plugins["ud"]
    assert "openai-parser" not in c.plugins
    assert "utilization-detector" not in c.plugins


# --- data layer --------------------------------------------------------------------------------


def test_default_data_source_reuses_declared_plugins(make_config: ConfigFactory, registry: Registry) -> None:
    """Without dataLayer, declared metrics-data-source/core-metrics-extractor become the default binding."""
    c = _build(
        make_config,
        registry,
        plugins=[
            {"type": "metrics-data-source", "parameters": {"scheme": "https"}},
            {"type": "core-metrics-extractor"},
            *SCORERS,
        ],
    )
    source: Any = c.plugins["metrics-data-source"]
    extractor: Any = c.plugins["core-metrics-extractor"]
    assert c.data_sources == (SourceBinding(source, (extractor,)),)
    assert source.params.scheme == "https"
    assert source not in c.lifecycle


def test_explicit_data_layer_is_bound_in_order(make_config: ConfigFactory, registry: Registry) -> None:
    """dataLayer sources bind their extractors as listed; no default source is added."""
    c = _build(
        make_config,
        registry,
        plugins=[
            {"name": "m1", "type": "metrics-data-source"},
            {"name": "m2", "type": "metrics-data-source"},
            {"name": "e1", "type": "core-metrics-extractor"},
        ],
        dataLayer={
            "sources": [{"pluginRef": "m2", "extractors": [{"pluginRef": "e1"}]}, {"pluginRef": "m1"}]
        },
    )
    assert [
        (b.source.typed_name.name, [e.typed_name.name for e in b.extractors]) for b in c.data_sources
    ] == [
        ("m2", ["e1"]),
        ("m1", []),
    ]
    assert "metrics-data-source" not in c.plugins
    # m1 and m2 are bound, so the data-layer runtime (not the lifecycle list) starts them.
    assert c.lifecycle == ()


def test_push_source_takes_its_extractors_unchecked(make_config: ConfigFactory, registry: Registry) -> None:
    """A notification (push) source is bound with its extractors; it vets them itself when bound."""
    c = _build(
        make_config,
        registry,
        plugins=[{"type": "test-push-source"}, {"type": "test-hooks"}, {"type": "metrics-data-source"}],
        dataLayer={
            "sources": [
                {"pluginRef": "test-push-source", "extractors": [{"pluginRef": "test-hooks"}]},
                {"pluginRef": "metrics-data-source"},
            ]
        },
    )
    hooks: Any = c.plugins["test-hooks"]
    assert c.data_sources[0] == SourceBinding(c.plugins["test-push-source"], (hooks,))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("flags", "parameters", "expected"),
    [
        pytest.param(MetricsFlags(), None, ("http", "/metrics", True), id="defaults"),
        pytest.param(
            MetricsFlags(scheme="https", path="/m", insecure_skip_verify=False),
            None,
            ("http", "/metrics", True),
            id="flags-not-explicit-ignored",
        ),
        pytest.param(
            MetricsFlags(scheme="https", insecure_skip_verify=False, explicitly_set=frozenset({"scheme"})),
            None,
            ("https", "/metrics", True),
            id="explicit-flag-beats-default",
        ),
        pytest.param(
            MetricsFlags(
                scheme="https",
                path="/flag",
                insecure_skip_verify=False,
                explicitly_set=frozenset(
                    {"model-server-metrics-path", "model-server-metrics-https-insecure-skip-verify"}
                ),
            ),
            {"path": "/param"},
            ("http", "/param", False),
            id="param-beats-explicit-flag",
        ),
    ],
)
def test_metrics_flag_precedence(
    make_config: ConfigFactory,
    registry: Registry,
    flags: MetricsFlags,
    parameters: Doc | None,
    expected: tuple[str, str, bool],
) -> None:
    """metrics-data-source params: defaults < deprecated flags explicitly set < plugin parameters."""
    spec: Doc = (
        {"type": "metrics-data-source"}
        if parameters is None
        else {"type": "metrics-data-source", "parameters": parameters}
    )
    c = _build(make_config, registry, BuildOptions(metrics=flags), plugins=[spec, *SCORERS])
    params = c.plugins["metrics-data-source"].params  # type: ignore[attr-defined]
    assert (params.scheme, params.path, params.insecure_skip_verify) == expected


def test_explicit_flags_reach_the_auto_added_source(make_config: ConfigFactory, registry: Registry) -> None:
    """The default source added by the builder also honours explicitly set metrics flags."""
    flags = MetricsFlags(path="/stats", explicitly_set=frozenset({"path"}))
    c = _build(make_config, registry, BuildOptions(metrics=flags), plugins=SCORERS)
    assert c.plugins["metrics-data-source"].params.path == "/stats"  # type: ignore[attr-defined]


def test_legacy_metrics_gate_uses_the_legacy_binding(
    make_config: ConfigFactory, registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """enableLegacyMetrics: data_sources is legacy_binding(metrics flags) and dataLayer is ignored."""
    flags = MetricsFlags(port=9100, explicitly_set=frozenset({"port"}))
    seen: list[object] = []
    binding = SourceBinding(fakes.MetricsSource("legacy", fakes.MetricsSourceParams(), None), ())  # type: ignore[arg-type]

    def legacy_binding(metrics: object) -> SourceBinding:
        seen.append(metrics)
        return binding

    monkeypatch.setattr(datalayer_assembly, "legacy_binding", legacy_binding)
    with capture_logs() as logs:
        c = _build(
            make_config,
            registry,
            BuildOptions(metrics=flags),
            featureGates=["enableLegacyMetrics"],
            plugins=[{"type": "metrics-data-source"}, *SCORERS],
            dataLayer={"sources": [{"pluginRef": "metrics-data-source"}]},
        )
    assert c.data_sources == (binding,)
    assert seen == [flags]
    assert "core-metrics-extractor" not in c.plugins
    assert "data_layer_section_ignored" in [e["event"] for e in logs]


# --- flow control ------------------------------------------------------------------------------


def test_flow_control_off_ignores_the_section(make_config: ConfigFactory, registry: Registry) -> None:
    """Without the gate the flowControl section is ignored (logged) and no policy plugin is added."""
    with capture_logs() as logs:
        c = _build(make_config, registry, plugins=SCORERS, flowControl={"maxBytes": "1Gi"})
    assert c.flow_control is None
    assert not {"fcfs-ordering-policy", "global-strict-fairness-policy", "static-usage-limit-policy"} & set(
        c.plugins
    )
    assert "flow_control_section_ignored" in [e["event"] for e in logs]


@pytest.mark.parametrize(
    ("gates", "env"),
    [
        pytest.param(["flowControl"], {}, id="gate"),
        pytest.param([], {FLOW_CONTROL_ENV: "true"}, id="deprecated-env-var"),
    ],
)
def test_flow_control_on_adds_policies_and_resolves(
    make_config: ConfigFactory, registry: Registry, gates: list[str], env: dict[str, str]
) -> None:
    """With the gate (or the env var) the default policies are added and the section is resolved."""
    c = _build(
        make_config,
        registry,
        BuildOptions(env=env),
        featureGates=gates,
        plugins=SCORERS,
        flowControl={"maxBytes": "1Gi", "priorityBands": [{"priority": 100, "maxBytes": "500M"}]},
    )
    assert "flowControl" in c.feature_gates
    assert _names(c)[-7:-4] == [
        "fcfs-ordering-policy",
        "global-strict-fairness-policy",
        "static-usage-limit-policy",
    ]
    assert c.flow_control is not None
    assert c.flow_control.max_bytes == 1 << 30
    assert c.flow_control.priority_bands[0].ordering_policy_ref == "fcfs-ordering-policy"
    assert c.flow_control.usage_limit_policy_plugin_ref == "static-usage-limit-policy"


def test_flow_control_gate_without_section_gets_defaults(
    make_config: ConfigFactory, registry: Registry
) -> None:
    """The gate alone yields GIE's defaults: unlimited globals, 1 GB default band, no TTL."""
    c = _build(make_config, registry, featureGates=["flowControl"], plugins=SCORERS)
    assert c.flow_control is not None
    assert (c.flow_control.max_bytes, c.flow_control.default_request_ttl) == (0, 0.0)
    assert c.flow_control.default_priority_band is not None
    assert c.flow_control.default_priority_band.max_bytes == 1_000_000_000


# --- hooks, determinism, all or nothing ----------------------------------------------------------


def test_plugin_in_several_hook_tuples(make_config: ConfigFactory, registry: Registry) -> None:
    """A plugin implementing several hooks appears in each tuple; producers also count as hooks."""
    c = _build(make_config, registry, plugins=[{"type": "test-hooks"}, {"type": "test-prefix-scorer"}])
    hooks: Any = c.plugins["test-hooks"]
    producer: Any = c.plugins["approx-prefix-cache-producer"]
    assert c.admitters == (hooks,)
    assert c.pre_request == (hooks, producer)
    assert c.response_header == (hooks,)
    assert c.response_body == (hooks,)
    assert c.response_complete == (hooks,)
    assert c.observers == (producer,)
    assert c.lifecycle == (hooks,)


def test_build_is_deterministic(make_config: ConfigFactory, registry: Registry) -> None:
    """Two builds of one config produce the same plugin, profile and producer order."""
    doc: Doc = {
        "plugins": [{"type": "test-prefix-scorer"}, {"type": "test-filter"}, *SCORERS, {"type": "test-hooks"}]
    }

    def shape(c: Components) -> tuple[Any, ...]:
        profile = _profile(c)
        return (
            _names(c),
            [f.typed_name.name for f in profile.filters],
            [(s.typed_name.name, w) for s, w in profile.scorers],
            [str(p.typed_name) for p in c.producers],
        )

    assert shape(_build(make_config, registry, **doc)) == shape(_build(make_config, registry, **doc))


def test_broken_last_plugin_builds_nothing(make_config: ConfigFactory, registry: Registry) -> None:
    """All or nothing: a broken last plugin raises before anything is returned or started.

    The fakes' start()/stop() raise AssertionError, so reaching them would fail this test
    with a different error.
    """
    with pytest.raises(ConfigError, match=r"^plugins\[3\] \(test-exploding/test-exploding\)"):
        _build(
            make_config,
            registry,
            plugins=[
                {"type": "test-hooks"},
                {"type": "metrics-data-source"},
                *SCORERS[:1],
                {"type": "test-exploding"},
            ],
        )


@pytest.mark.parametrize(
    ("parser_type", "protocol", "expected"),
    [
        pytest.param("openai-parser", "http", True, id="openai-http"),
        pytest.param("openai-parser", "", True, id="openai-empty-means-http"),
        pytest.param("openai-parser", "kubernetes.io/h2c", True, id="openai-h2c"),
        pytest.param("openai-parser", "kubernetes.io/ws", False, id="openai-other"),
        pytest.param("passthrough-parser", "kubernetes.io/ws", True, id="passthrough-any"),
    ],
)
def test_parser_supports(registry: Registry, parser_type: str, protocol: str, expected: bool) -> None:
    """Health: a parser serves a pool only if the pool's appProtocol is in its APP_PROTOCOLS (empty = any)."""
    cls: Any = registry.get(parser_type)
    parser = cls(parser_type, cls.PARAMS(), None)
    assert parser_supports(parser, protocol) is expected


def test_summary_shows_the_effective_configuration(make_config: ConfigFactory, registry: Registry) -> None:
    """summary() lists what actually runs, auto-added defaults and weights included."""
    c = _build(make_config, registry, plugins=[{"type": "test-prefix-scorer"}, {"type": "test-filter"}])
    s = c.summary()
    assert s["profiles"] == {
        "default": {
            "filters": ["test-filter/test-filter"],
            "scorers": ["test-prefix-scorer/test-prefix-scorer*1"],
            "picker": "max-score-picker/max-score-picker",
        }
    }
    assert s["profile_handler"] == "single-profile-handler/single-profile-handler"
    assert s["producers"] == ["approx-prefix-cache-producer/approx-prefix-cache-producer"]
    assert s["data_sources"] == {
        "metrics-data-source/metrics-data-source": ["core-metrics-extractor/core-metrics-extractor"]
    }
    assert s["flow_control"] is None


def test_two_pickers_without_profiles_point_at_the_plugin(
    make_config: ConfigFactory, registry: Registry
) -> None:
    """Without profiles every picker joins the default profile, so a second one is named by its index."""
    with pytest.raises(ConfigError) as err:
        _build(
            make_config, registry, plugins=[{"type": "max-score-picker"}, *SCORERS, {"type": "test-picker"}]
        )
    assert str(err.value) == (
        "plugins[3] (default profile): failed to set 'test-picker' as picker, "
        "already have a registered picker plugin 'max-score-picker'"
    )


def test_profile_may_reference_an_auto_added_plugin(make_config: ConfigFactory, registry: Registry) -> None:
    """Defaults are applied before references are checked, as in GIE: the default detector can be a filter."""
    c = _build(
        make_config,
        registry,
        plugins=SCORERS,
        schedulingProfiles=[{"name": "p", "plugins": [{"pluginRef": "utilization-detector"}]}],
    )
    assert _profile(c, "p").filters == (c.plugins["utilization-detector"],)
    assert c.saturation_detector is c.plugins["utilization-detector"]
