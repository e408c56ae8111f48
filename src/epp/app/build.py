"""EndpointPickerConfig → plugin instances → each concept's assembly, all or nothing.

The config layer loads, validates and instantiates plugins through the registry; it no
longer knows how a scheduler, a data layer, flow control or a request pipeline is put
together.  Each concept does that in its own ``assembly`` module, from its config section
and the plugins built here (issue #14: one assembly per concept).  Those modules sit below
``epp.config`` in the import layers, so they get a ``PluginSet`` (``_Plugins`` here) through
which they may ask for a default plugin by type name; this module alone talks to the
registry.

Follows GIE's loader (gie-inventory §8.2 steps 4-13) with its messages, each prefixed by
the config path at fault, but deterministically: wherever Go iterates a map, we use
config order.  Nothing is started here: no tasks, no sockets.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import structlog

from epp.admission.assembly import AdmissionPlan
from epp.config.features import ENABLE_LEGACY_METRICS, FLOW_CONTROL, effective_gates
from epp.config.load import check_structure
from epp.config.schema import (
    DEFAULT_FAIRNESS_POLICY,
    DEFAULT_ORDERING_POLICY,
    DEFAULT_PARSER,
    DEFAULT_SATURATION_DETECTOR,
    DEFAULT_USAGE_LIMIT_POLICY,
    EndpointPickerConfig,
    FlowControlConfig,
)
from epp.datalayer import assembly as datalayer_assembly
from epp.datalayer.api import EndpointObserver, SourceBinding
from epp.datalayer.assembly import CORE_METRICS_EXTRACTOR, METRICS_DATA_SOURCE, DataLayer
from epp.datalayer.sources.metrics_http import ModelServerMetricsFlags
from epp.director import assembly as director_assembly
from epp.director.api import (
    Admitter,
    DataProducer,
    PreRequest,
    ResponseBodyProcessor,
    ResponseCompleteProcessor,
    ResponseHeaderProcessor,
)
from epp.director.pipeline import RequestControl
from epp.errors import ConfigError
from epp.flowcontrol import assembly as flowcontrol_assembly
from epp.flowcontrol.api import SaturationDetector
from epp.flowcontrol.assembly import FlowControlPlan
from epp.parsers.api import Parser
from epp.parsers.registry import ParserRegistry
from epp.plugin.base import Lifecycle, Plugin
from epp.plugin.registry import Registry
from epp.scheduling import assembly as scheduling_assembly
from epp.scheduling.assembly import (
    DEFAULT_PROFILE,
    DEFAULT_SCORER_WEIGHT,
    MAX_SCORE_PICKER,
    SINGLE_PROFILE_HANDLER,
)
from epp.scheduling.scheduler import Scheduler

log = structlog.get_logger(__name__)

# Kept importable from here; each is declared by the concept that uses it.
__all__ = [
    "CORE_METRICS_EXTRACTOR",
    "DEFAULT_PROFILE",
    "DEFAULT_SCORER_WEIGHT",
    "MAX_SCORE_PICKER",
    "METRICS_DATA_SOURCE",
    "SINGLE_PROFILE_HANDLER",
    "BuildOptions",
    "Components",
    "MetricsFlags",
    "build",
    "parser_supports",
]

# The deprecated ``--model-server-metrics-*`` flags: declared once, with the parameters of
# ``metrics-data-source`` they stand for.
MetricsFlags = ModelServerMetricsFlags


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildOptions:
    """What the builder needs from outside the config file."""

    metrics: ModelServerMetricsFlags = field(default_factory=ModelServerMetricsFlags)
    env: Mapping[str, str] = field(default_factory=dict)  # for ENABLE_EXPERIMENTAL_FLOW_CONTROL_LAYER
    # A live reload (app/reload.py): plugins of this build whose name, type and parameters
    # are unchanged are taken over as the same instances, so their state survives.
    previous: Components | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Components:
    """What each concept assembled from the config, and the plugins; nothing started.

    ``lifecycle`` leaves out the data sources the data layer binds: its runtime starts and
    stops those itself.  The flat properties below read through to the concepts.
    """

    config: EndpointPickerConfig
    feature_gates: frozenset[str]
    plugins: Mapping[str, Plugin]  # by name: config order, then auto-added
    scheduler: Scheduler
    request_control: RequestControl
    admission: AdmissionPlan
    data_layer: DataLayer
    lifecycle: tuple[Lifecycle, ...]
    # name -> (type, canonical parameters) each plugin was built from: what a reload compares.
    specs: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    reused: frozenset[str] = frozenset()  # names taken over from ``BuildOptions.previous``

    @property
    def parser(self) -> Parser | ParserRegistry:
        return self.request_control.parser

    @property
    def producers(self) -> tuple[DataProducer, ...]:  # topological order
        return self.request_control.producers

    @property
    def admitters(self) -> tuple[Admitter, ...]:
        return self.request_control.admitters

    @property
    def pre_request(self) -> tuple[PreRequest, ...]:
        return self.request_control.pre_request

    @property
    def response_header(self) -> tuple[ResponseHeaderProcessor, ...]:
        return self.request_control.response_header

    @property
    def response_body(self) -> tuple[ResponseBodyProcessor, ...]:
        return self.request_control.response_body

    @property
    def response_complete(self) -> tuple[ResponseCompleteProcessor, ...]:
        return self.request_control.response_complete

    @property
    def saturation_detector(self) -> SaturationDetector:
        return self.admission.detector

    @property
    def flow_control(self) -> FlowControlConfig | None:
        """Resolved defaults; None unless the gate is on."""
        plan = self.admission.flow_control
        return None if plan is None else plan.settings

    @property
    def observers(self) -> tuple[EndpointObserver, ...]:
        return self.data_layer.observers

    @property
    def data_sources(self) -> tuple[SourceBinding, ...]:
        return self.data_layer.bindings

    def summary(self) -> dict[str, Any]:
        """The effective configuration, defaults included, for one startup log line."""
        flow_control = self.flow_control
        return {
            "feature_gates": sorted(self.feature_gates),
            "plugins": [str(p.typed_name) for p in self.plugins.values()],
            "profiles": {
                name: {
                    "filters": [str(f.typed_name) for f in profile.filters],
                    "scorers": [f"{s.typed_name}*{w:g}" for s, w in profile.scorers],
                    "picker": str(profile.picker.typed_name),
                }
                for name, profile in self.scheduler.profiles.items()
            },
            "profile_handler": str(self.scheduler.handler.typed_name),
            "parser": str(self.parser.typed_name),
            "saturation_detector": str(self.saturation_detector.typed_name),
            "producers": [str(p.typed_name) for p in self.producers],
            "data_sources": {
                str(b.source.typed_name): [str(e.typed_name) for e in b.extractors] for b in self.data_sources
            },
            "flow_control": None if flow_control is None else flow_control.model_dump(by_alias=True),
        }


def parser_supports(parser: Parser | ParserRegistry, app_protocol: str) -> bool:
    """Whether ``parser`` can serve a pool with this ``appProtocol`` (empty means ``http``)."""
    protocols = parser.APP_PROTOCOLS
    return not protocols or (app_protocol or "http") in protocols


def build(
    config: EndpointPickerConfig, registry: Registry, options: BuildOptions | None = None
) -> Components:
    """Instantiate, default and validate everything; any problem is a ConfigError, raised before
    anything could have started."""
    return _build(config, registry, options or BuildOptions())


class _Handle:
    """What plugins see while being built; lookups are complete once the build returns."""

    __slots__ = ("_plugins",)

    def __init__(self, plugins: Mapping[str, Plugin]) -> None:
        self._plugins = plugins  # the builder's dict, filled as plugins are built

    def plugin(self, name: str) -> Any:
        return self._plugins[name]

    def plugins(self) -> Sequence[Any]:
        return tuple(self._plugins.values())


class _Plugins:
    """The ``PluginSet`` of one build: instantiates through the registry; dies with the build,
    so a failed build leaves nothing behind."""

    def __init__(
        self, registry: Registry, metrics: ModelServerMetricsFlags, previous: Components | None = None
    ) -> None:
        self.registry = registry
        self.metrics = metrics
        self.previous = previous
        self.by_name: dict[str, Plugin] = {}  # in build order
        self.specs: dict[str, tuple[str, str]] = {}
        self.reused: set[str] = set()
        self.handle = _Handle(self.by_name)

    # --- PluginSet ------------------------------------------------------------------------
    def get(self, name: str) -> Plugin | None:
        return self.by_name.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self.by_name

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self.by_name))

    def values(self) -> tuple[Plugin, ...]:
        return tuple(self.by_name.values())

    def registered(self, type_name: str) -> bool:
        return type_name in self.registry

    def create(self, type_name: str, path: str) -> Plugin:
        return self.instantiate(type_name, type_name, None, path)

    def ensure(self, type_name: str, why: str) -> Plugin:
        existing = self.by_name.get(type_name)
        if existing is not None:
            return existing
        if type_name not in self.registry:
            raise ConfigError(f"{why}: default plugin type '{type_name}' is not registered")
        log.debug("default_plugin_added", plugin=type_name, reason=why)
        return self.instantiate(type_name, type_name, None, f"{why} (default {type_name})")

    # --- instantiation -------------------------------------------------------------------
    def _parameters(self, type_name: str, parameters: Any) -> Any:
        """Deprecated metrics flags slot between the plugin's defaults and its parameters (§6.4)."""
        if type_name != METRICS_DATA_SOURCE or not (parameters is None or isinstance(parameters, dict)):
            return parameters
        explicit = self.metrics.explicit_params()
        if not explicit:
            return parameters
        fields = self.registry.get(type_name).PARAMS.model_fields
        known = {n for name, f in fields.items() for n in (name, f.alias) if n}
        return {**{k: v for k, v in explicit.items() if k in known}, **(parameters or {})}

    def _reusable(self, name: str, spec: tuple[str, str]) -> Plugin | None:
        """The previous build's plugin of this name, if built from the same type and parameters.

        A plugin that kept its build's handle may look other plugins up through it later
        (the concurrency detector does): taken over, it would see the previous build's
        plugins, so such a plugin is always built afresh.
        """
        prev = self.previous
        if prev is None or prev.specs.get(name) != spec:
            return None
        plugin = prev.plugins.get(name)
        if plugin is None or _keeps_handle(plugin):
            return None
        return plugin

    def instantiate(self, name: str, type_name: str, parameters: Any, path: str) -> Plugin:
        parameters = self._parameters(type_name, parameters)
        spec = (type_name, _canonical(parameters))
        plugin = self._reusable(name, spec)
        if plugin is not None:
            self.reused.add(name)
        else:
            try:
                plugin = self.registry.build(
                    name=name, type_name=type_name, parameters=parameters, handle=self.handle, path=path
                )
            except ConfigError:
                raise
            # why: a plugin's constructor is foreign code, and all-or-nothing needs every error.
            except Exception as e:
                raise ConfigError(f"{path} ({name}/{type_name}): failed to create plugin: {e!r}") from e
        self.by_name[name] = plugin
        self.specs[name] = spec
        return plugin


def _canonical(parameters: Any) -> str:
    """Parameters as comparable text: key order does not matter, ``1`` and ``1.0`` differ."""
    try:
        return json.dumps(parameters, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return repr(parameters)


def _keeps_handle(plugin: object) -> bool:
    values = list(getattr(plugin, "__dict__", {}).values())
    for cls in type(plugin).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        values.extend(getattr(plugin, slot, None) for slot in ((slots,) if isinstance(slots, str) else slots))
    return any(isinstance(v, _Handle) for v in values)


def _build(config: EndpointPickerConfig, registry: Registry, options: BuildOptions) -> Components:
    check_structure(config)
    gates = effective_gates(config.feature_gates, options.env)
    plugins = _Plugins(registry, options.metrics, options.previous)
    for i, spec in enumerate(config.plugins):
        if spec.type not in registry:
            raise ConfigError(f"plugins[{i}].type: plugin type '{spec.type}' is not registered")
        plugins.instantiate(spec.name, spec.type, spec.parameters, f"plugins[{i}]")

    # System defaults first (GIE step 6), so profiles may reference any auto-added plugin;
    # the order of these calls is the order default plugins are created in.
    scheduling = scheduling_assembly.plan(config.scheduling_profiles, plugins)
    flow_control = _flow_control(config, gates, plugins)
    parser_refs = [p.plugin_ref for p in config.parsers] or [
        config.parser.plugin_ref if config.parser is not None else DEFAULT_PARSER
    ]
    parser = director_assembly.parsers(parser_refs, DEFAULT_PARSER, plugins)
    sd = config.saturation_detector
    detector = flowcontrol_assembly.saturation_detector(
        (sd.plugin_ref if sd is not None else "") or DEFAULT_SATURATION_DETECTOR,
        DEFAULT_SATURATION_DETECTOR,
        plugins,
    )
    bindings = _data_layer(config, gates, plugins, options.metrics)
    scheduler = scheduling.build(plugins)
    producers = director_assembly.producers(plugins)

    data_layer = DataLayer(bindings, datalayer_assembly.observers(plugins))
    frozen = MappingProxyType(dict(plugins.by_name))
    return Components(
        config=config,
        feature_gates=gates,
        plugins=frozen,
        scheduler=scheduler,
        request_control=director_assembly.request_control(parser, producers, plugins),
        admission=AdmissionPlan(
            detector, None if flow_control is None else FlowControlPlan(flow_control, detector, frozen)
        ),
        data_layer=data_layer,
        lifecycle=tuple(p for p in plugins.values() if isinstance(p, Lifecycle) and not data_layer.owns(p)),
        specs=MappingProxyType(dict(plugins.specs)),
        reused=frozenset(plugins.reused),
    )


def _flow_control(
    config: EndpointPickerConfig, gates: frozenset[str], plugins: _Plugins
) -> FlowControlConfig | None:
    """Step 10: the default policies and this section's defaults; flow control checks the rest."""
    if FLOW_CONTROL not in gates:
        if config.flow_control is not None:
            log.warning("flow_control_section_ignored", reason=f"feature gate '{FLOW_CONTROL}' is off")
        return None
    for type_name in (DEFAULT_ORDERING_POLICY, DEFAULT_FAIRNESS_POLICY, DEFAULT_USAGE_LIMIT_POLICY):
        plugins.ensure(type_name, "flowControl")
    settings = (config.flow_control or FlowControlConfig()).resolved()
    flowcontrol_assembly.check_policies(settings, plugins)
    return settings


def _data_layer(
    config: EndpointPickerConfig, gates: frozenset[str], plugins: _Plugins, metrics: ModelServerMetricsFlags
) -> tuple[SourceBinding, ...]:
    """Steps 6 and 9: the legacy poller when its gate is on, else what ``dataLayer`` wires."""
    if ENABLE_LEGACY_METRICS in gates:
        for i, spec in enumerate(config.plugins):
            if spec.type == CORE_METRICS_EXTRACTOR:
                raise ConfigError(
                    f"plugins[{i}].type: '{CORE_METRICS_EXTRACTOR}' cannot be used with the "
                    f"'{ENABLE_LEGACY_METRICS}' feature gate; remove the plugin or the gate"
                )
        if config.data_layer is not None:
            log.warning("data_layer_section_ignored", reason=f"feature gate '{ENABLE_LEGACY_METRICS}' is on")
        return datalayer_assembly.legacy(metrics)
    return datalayer_assembly.bindings(config.data_layer, plugins)
