"""EndpointPickerConfig → plugin instances and runtime components, all or nothing.

Follows GIE's loader (gie-inventory §8.2 steps 4-13) with its messages, each prefixed by
the config path at fault, but deterministically: wherever Go iterates a map, we use
config order.  Nothing is started here: no tasks, no sockets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

import structlog

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
    PriorityBandConfig,
)
from epp.datalayer.api import DataSource, EndpointObserver, Extractor, NotificationSource, SourceBinding
from epp.datalayer.legacy import legacy_binding
from epp.director.api import (
    Admitter,
    DataProducer,
    PreRequest,
    ResponseBodyProcessor,
    ResponseCompleteProcessor,
    ResponseHeaderProcessor,
)
from epp.director.dag import missing_producers, order_producers
from epp.errors import ConfigError
from epp.flowcontrol import api as flowcontrol_api
from epp.flowcontrol.api import SaturationDetector, UsageLimitPolicy
from epp.parsers.api import Parser
from epp.plugin.base import Lifecycle, Plugin
from epp.plugin.keys import AttributeKey
from epp.plugin.registry import Registry
from epp.scheduling.api import Filter, Picker, ProfileHandler, Scorer
from epp.scheduling.scheduler import Scheduler, SchedulerProfile, SchedulingError

log = structlog.get_logger(__name__)

DEFAULT_PROFILE: Final = "default"
DEFAULT_SCORER_WEIGHT: Final = 1.0
SINGLE_PROFILE_HANDLER: Final = "single-profile-handler"
MAX_SCORE_PICKER: Final = "max-score-picker"
METRICS_DATA_SOURCE: Final = "metrics-data-source"
CORE_METRICS_EXTRACTOR: Final = "core-metrics-extractor"

# MetricsFlags field -> metrics-data-source parameter; flag names are accepted too.
_METRICS_PARAMS: Final = {"scheme": "scheme", "path": "path", "insecure_skip_verify": "insecureSkipVerify"}
_METRICS_FLAG_FIELDS: Final = {
    "model-server-metrics-scheme": "scheme",
    "model-server-metrics-path": "path",
    "model-server-metrics-port": "port",
    "model-server-metrics-https-insecure-skip-verify": "insecure_skip_verify",
}


@dataclass(frozen=True, slots=True)
class MetricsFlags:
    """The deprecated ``--model-server-metrics-*`` flags (gie-inventory §1.1, §6.4).

    ``explicitly_set`` names the fields (or the flag names) the user gave on the command
    line; only those override the ``metrics-data-source`` defaults, and plugin parameters
    in the config override them in turn.
    """

    scheme: str = "http"
    path: str = "/metrics"
    port: int = 0
    insecure_skip_verify: bool = True
    explicitly_set: frozenset[str] = frozenset()

    def explicit_params(self) -> dict[str, Any]:
        """The explicitly set flags as metrics-data-source parameters (camelCase keys)."""
        fields = {_METRICS_FLAG_FIELDS.get(name, name) for name in self.explicitly_set}
        return {param: getattr(self, f) for f, param in _METRICS_PARAMS.items() if f in fields}


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildOptions:
    """What the builder needs from outside the config file."""

    metrics: MetricsFlags = MetricsFlags()
    env: Mapping[str, str] = field(default_factory=dict)  # for ENABLE_EXPERIMENTAL_FLOW_CONTROL_LAYER


@dataclass(frozen=True, slots=True, kw_only=True)
class Components:
    """Everything the config asked for, built and validated, nothing started.

    Hook tuples follow ``plugins`` order; a plugin implementing several protocols is in
    several tuples.  ``lifecycle`` leaves out the data sources bound in ``data_sources``:
    the data-layer runtime starts and stops those itself.
    """

    config: EndpointPickerConfig
    feature_gates: frozenset[str]
    plugins: Mapping[str, Plugin]  # by name: config order, then auto-added
    scheduler: Scheduler
    parser: Parser
    saturation_detector: SaturationDetector
    producers: tuple[DataProducer, ...]  # topological order
    admitters: tuple[Admitter, ...]
    pre_request: tuple[PreRequest, ...]
    response_header: tuple[ResponseHeaderProcessor, ...]
    response_body: tuple[ResponseBodyProcessor, ...]
    response_complete: tuple[ResponseCompleteProcessor, ...]
    observers: tuple[EndpointObserver, ...]
    lifecycle: tuple[Lifecycle, ...]
    data_sources: tuple[SourceBinding, ...]
    flow_control: FlowControlConfig | None  # resolved defaults; None unless the gate is on

    def summary(self) -> dict[str, Any]:
        """The effective configuration, defaults included, for one startup log line."""
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
            "flow_control": None
            if self.flow_control is None
            else self.flow_control.model_dump(by_alias=True),
        }


def parser_supports(parser: Parser, app_protocol: str) -> bool:
    """Whether ``parser`` can serve a pool with this ``appProtocol`` (empty means ``http``)."""
    protocols = parser.APP_PROTOCOLS
    return not protocols or (app_protocol or "http") in protocols


def build(
    config: EndpointPickerConfig, registry: Registry, options: BuildOptions | None = None
) -> Components:
    """Instantiate, default and validate everything; any problem is a ConfigError, raised before
    anything could have started."""
    return _Builder(config, registry, options or BuildOptions()).build()


class _Handle:
    """What plugins see while being built; lookups are complete once the build returns."""

    __slots__ = ("_plugins",)

    def __init__(self, plugins: Mapping[str, Plugin]) -> None:
        self._plugins = plugins  # the builder's dict, filled as plugins are built

    def plugin(self, name: str) -> Any:
        return self._plugins[name]

    def plugins(self) -> Sequence[Any]:
        return tuple(self._plugins.values())


def _label(plugin: object) -> str:
    typed_name = getattr(plugin, "typed_name", None)
    return str(typed_name) if typed_name is not None else repr(plugin)


def _accepts(input_type: Any, output_type: Any) -> bool:
    if input_type is Any or input_type is object:
        return True
    try:
        return issubclass(output_type, input_type)
    except TypeError:  # typing constructs (unions, generics): only equality is decidable
        return bool(input_type == output_type)


def _type_name(t: Any) -> str:
    return getattr(t, "__name__", None) or repr(t)


_Ref = tuple[str, float | None, str]  # plugin name, weight, config path for errors
_ProfileSpec = tuple[str, list[_Ref]]  # profile name, its plugin references in order


class _Builder:
    """One build; its state dies with it, so a failed build leaves nothing behind."""

    def __init__(self, config: EndpointPickerConfig, registry: Registry, options: BuildOptions) -> None:
        self.config = config
        self.registry = registry
        self.options = options
        self.plugins: dict[str, Plugin] = {}  # by name, in build order
        self.handle = _Handle(self.plugins)

    # --- instantiation -------------------------------------------------------------------
    def _parameters(self, type_name: str, parameters: Any) -> Any:
        """Deprecated metrics flags slot between the plugin's defaults and its parameters (§6.4)."""
        if type_name != METRICS_DATA_SOURCE or not (parameters is None or isinstance(parameters, dict)):
            return parameters
        explicit = self.options.metrics.explicit_params()
        if not explicit:
            return parameters
        fields = self.registry.get(type_name).PARAMS.model_fields
        known = {n for name, f in fields.items() for n in (name, f.alias) if n}
        return {**{k: v for k, v in explicit.items() if k in known}, **(parameters or {})}

    def _instantiate(self, name: str, type_name: str, parameters: Any, path: str) -> Plugin:
        try:
            plugin = self.registry.build(
                name=name,
                type_name=type_name,
                parameters=self._parameters(type_name, parameters),
                handle=self.handle,
                path=path,
            )
        except ConfigError:
            raise
        # why: a plugin's constructor is foreign code, and all-or-nothing needs every error.
        except Exception as e:
            raise ConfigError(f"{path} ({name}/{type_name}): failed to create plugin: {e!r}") from e
        self.plugins[name] = plugin
        return plugin

    def _instantiate_configured(self) -> None:
        for i, spec in enumerate(self.config.plugins):
            if spec.type not in self.registry:
                raise ConfigError(f"plugins[{i}].type: plugin type '{spec.type}' is not registered")
            self._instantiate(spec.name, spec.type, spec.parameters, f"plugins[{i}]")

    def _ensure(self, type_name: str, why: str) -> Plugin:
        """The plugin named ``type_name``, instantiated with default parameters if absent."""
        existing = self.plugins.get(type_name)
        if existing is not None:
            return existing
        if type_name not in self.registry:
            raise ConfigError(f"{why}: default plugin type '{type_name}' is not registered")
        log.debug("default_plugin_added", plugin=type_name, reason=why)
        return self._instantiate(type_name, type_name, None, f"{why} (default {type_name})")

    # --- the steps ------------------------------------------------------------------------
    def build(self) -> Components:
        check_structure(self.config)
        gates = effective_gates(self.config.feature_gates, self.options.env)
        self._instantiate_configured()
        # System defaults first (GIE step 6), so profiles may reference any auto-added plugin.
        profiles, default_picker = self._scheduling_defaults()
        flow_control = self._flow_control(gates)
        parser = self._parser()
        detector = self._saturation_detector()
        data_sources = self._data_layer(gates)
        scheduler = self._scheduler(profiles, default_picker)
        producers = self._producers()

        plugins = tuple(self.plugins.values())
        bound_sources = {id(binding.source) for binding in data_sources}
        return Components(
            config=self.config,
            feature_gates=gates,
            plugins=MappingProxyType(dict(self.plugins)),
            scheduler=scheduler,
            parser=parser,
            saturation_detector=detector,
            producers=producers,
            admitters=tuple(p for p in plugins if isinstance(p, Admitter)),
            pre_request=tuple(p for p in plugins if isinstance(p, PreRequest)),
            response_header=tuple(p for p in plugins if isinstance(p, ResponseHeaderProcessor)),
            response_body=tuple(p for p in plugins if isinstance(p, ResponseBodyProcessor)),
            response_complete=tuple(p for p in plugins if isinstance(p, ResponseCompleteProcessor)),
            observers=tuple(p for p in plugins if isinstance(p, EndpointObserver)),
            lifecycle=tuple(p for p in plugins if isinstance(p, Lifecycle) and id(p) not in bound_sources),
            data_sources=data_sources,
            flow_control=flow_control,
        )

    def _scheduling_defaults(self) -> tuple[list[_ProfileSpec], Picker]:
        """Step 6 for scheduling: the default profile, profile handler and picker."""
        profiles: list[_ProfileSpec] = []
        if self.config.scheduling_profiles:
            for i, prof in enumerate(self.config.scheduling_profiles):
                refs = [
                    (ref.plugin_ref, ref.weight, f"schedulingProfiles[{i}].plugins[{j}].pluginRef")
                    for j, ref in enumerate(prof.plugins)
                ]
                profiles.append((prof.name, refs))
        else:
            # GIE: every filter, scorer and picker, in map order; here in config order.
            refs = [
                (name, None, f"plugins[{i}] (default profile)")
                for i, (name, p) in enumerate(self.plugins.items())
                if isinstance(p, (Filter, Scorer, Picker))
            ]
            profiles.append((DEFAULT_PROFILE, refs))

        if len(profiles) == 1 and not any(isinstance(p, ProfileHandler) for p in self.plugins.values()):
            self._ensure(SINGLE_PROFILE_HANDLER, "schedulingProfiles")
        pickers = [p for p in self.plugins.values() if isinstance(p, Picker)]
        if not pickers:
            default_plugin = self._ensure(MAX_SCORE_PICKER, "schedulingProfiles")
            if not isinstance(default_plugin, Picker):
                raise ConfigError(
                    f"schedulingProfiles: default plugin '{_label(default_plugin)}' is not a picker"
                )
            pickers.append(default_plugin)
        return profiles, pickers[0]

    def _scheduler(self, profiles: list[_ProfileSpec], default_picker: Picker) -> Scheduler:
        """Steps 7-8: profile references, the one profile handler, then the scheduler."""
        for name, refs in profiles:
            for ref, _, path in refs:
                if ref not in self.plugins:
                    raise ConfigError(
                        f"{path}: schedulingProfiles[{name}] references undefined plugin '{ref}'"
                    )

        handlers = [p for p in self.plugins.values() if isinstance(p, ProfileHandler)]
        if len(handlers) > 1:
            names = ", ".join(f"'{h.typed_name.name}'" for h in handlers)
            raise ConfigError(f"plugins: multiple profile handlers found ({names}); only one is allowed")
        if not handlers:
            raise ConfigError("schedulingProfiles: no profile handler configured")
        handler = handlers[0]
        limit = getattr(handler, "MAX_PROFILES", None)
        if limit is not None and len(profiles) > limit:
            if limit == 1:
                msg = "SingleProfileHandler cannot support multiple scheduling profiles"
            else:
                msg = f"profile handler '{_label(handler)}' supports at most {limit} scheduling profiles"
            raise ConfigError(f"schedulingProfiles: {msg} (got {len(profiles)})")

        built = [self._profile(name, refs, default_picker) for name, refs in profiles]
        try:
            return Scheduler(handler, built)
        except (SchedulingError, ValueError, TypeError) as e:
            raise ConfigError(f"schedulingProfiles: {e}") from None

    def _profile(self, name: str, refs: list[_Ref], default_picker: Picker) -> SchedulerProfile:
        filters: list[Filter] = []
        scorers: list[tuple[Scorer, float]] = []
        picker: Picker | None = None
        for ref, weight, path in refs:
            plugin = self.plugins[ref]
            used = False
            if isinstance(plugin, Filter):
                filters.append(plugin)
                used = True
            if isinstance(plugin, Scorer):
                used = True
                w = DEFAULT_SCORER_WEIGHT if weight is None else weight
                if w == 0:
                    # Contributes nothing to any total; skipping it saves its cost per request.
                    log.warning("zero_weight_scorer_skipped", profile=name, plugin=_label(plugin), path=path)
                else:
                    scorers.append((plugin, w))
            elif weight is not None:
                log.warning("weight_ignored_not_a_scorer", profile=name, plugin=_label(plugin), path=path)
            if isinstance(plugin, Picker):
                used = True
                if picker is not None:
                    raise ConfigError(
                        f"{path}: failed to set '{ref}' as picker, already have a registered "
                        f"picker plugin '{picker.typed_name.name}'"
                    )
                picker = plugin
            if not used:
                log.warning("profile_plugin_ignored", profile=name, plugin=_label(plugin), path=path)
        try:
            return SchedulerProfile(name, filters=filters, scorers=scorers, picker=picker or default_picker)
        except (SchedulingError, ValueError, TypeError) as e:
            raise ConfigError(f"schedulingProfiles[{name}]: {e}") from None

    def _flow_control(self, gates: frozenset[str]) -> FlowControlConfig | None:
        """Step 10: default policies and the references of every band."""
        if FLOW_CONTROL not in gates:
            if self.config.flow_control is not None:
                log.warning("flow_control_section_ignored", reason=f"feature gate '{FLOW_CONTROL}' is off")
            return None
        for type_name in (DEFAULT_ORDERING_POLICY, DEFAULT_FAIRNESS_POLICY, DEFAULT_USAGE_LIMIT_POLICY):
            self._ensure(type_name, "flowControl")
        fc = (self.config.flow_control or FlowControlConfig()).resolved()
        template = fc.default_priority_band or PriorityBandConfig().resolved()
        bands = [("flowControl.defaultPriorityBand", template)]
        bands += [(f"flowControl.priorityBands[{i}]", band) for i, band in enumerate(fc.priority_bands)]
        for path, band in bands:
            self._policy(f"{path}.orderingPolicyRef", band.ordering_policy_ref, "ordering", "OrderingPolicy")
            self._policy(f"{path}.fairnessPolicyRef", band.fairness_policy_ref, "fairness", "FairnessPolicy")
        ref = fc.usage_limit_policy_plugin_ref
        policy = self.plugins.get(ref)
        if policy is None:
            raise ConfigError(
                f"flowControl.usageLimitPolicyPluginRef: usage limit policy plugin '{ref}' not found"
            )
        if not isinstance(policy, UsageLimitPolicy):
            raise ConfigError(
                f"flowControl.usageLimitPolicyPluginRef: plugin '{ref}' does not implement UsageLimitPolicy"
            )
        return fc

    def _policy(self, path: str, ref: str, kind: str, protocol_name: str) -> None:
        plugin = self.plugins.get(ref)
        if plugin is None:
            raise ConfigError(f'{path}: no {kind} policy registered for name "{ref}"')
        # The flow-control concept declares these Protocols with its policies; until it does,
        # only the reference is checked.
        protocol = getattr(flowcontrol_api, protocol_name, None)
        if protocol is not None and not isinstance(plugin, protocol):
            kind_name = plugin.typed_name.type
            raise ConfigError(
                f'{path}: plugin "{ref}" is not a flowcontrol.{protocol_name} (type: {kind_name})'
            )

    def _parser(self) -> Parser:
        """Steps 6 and 11: default openai-parser; the reference must name a Parser."""
        ref = self.config.parser.plugin_ref if self.config.parser is not None else DEFAULT_PARSER
        if ref not in self.plugins:
            if ref != DEFAULT_PARSER:
                raise ConfigError(
                    f"parser.pluginRef: the configured parser is not loaded (no plugin named '{ref}')"
                )
            self._ensure(DEFAULT_PARSER, "parser")
        plugin = self.plugins[ref]
        if not isinstance(plugin, Parser):
            raise ConfigError(
                "parser.pluginRef: the specified plugin is not a parser plugin in the config "
                f"('{_label(plugin)}')"
            )
        return plugin

    def _saturation_detector(self) -> SaturationDetector:
        """Steps 6, 7 and 12: default utilization-detector; the reference must name a detector."""
        sd = self.config.saturation_detector
        ref = (sd.plugin_ref if sd is not None else "") or DEFAULT_SATURATION_DETECTOR
        if ref not in self.plugins:
            if ref != DEFAULT_SATURATION_DETECTOR:
                raise ConfigError(
                    f"saturationDetector.pluginRef: saturation detector references undefined plugin '{ref}'"
                )
            self._ensure(DEFAULT_SATURATION_DETECTOR, "saturationDetector")
        plugin = self.plugins[ref]
        if not isinstance(plugin, SaturationDetector):
            raise ConfigError(
                f"saturationDetector.pluginRef: plugin '{ref}' is not a fwkflowcontrol.SaturationDetector"
            )
        return plugin

    def _data_layer(self, gates: frozenset[str]) -> tuple[SourceBinding, ...]:
        """Steps 6 and 9: the default metrics source, or the legacy poller, or ``dataLayer``."""
        if ENABLE_LEGACY_METRICS in gates:
            for i, spec in enumerate(self.config.plugins):
                if spec.type == CORE_METRICS_EXTRACTOR:
                    raise ConfigError(
                        f"plugins[{i}].type: '{CORE_METRICS_EXTRACTOR}' cannot be used with the "
                        f"'{ENABLE_LEGACY_METRICS}' feature gate; remove the plugin or the gate"
                    )
            if self.config.data_layer is not None:
                log.warning(
                    "data_layer_section_ignored", reason=f"feature gate '{ENABLE_LEGACY_METRICS}' is on"
                )
            return (self._legacy_binding(),)

        # (path, source ref, [(path, extractor ref)])
        wiring: list[tuple[str, str, list[tuple[str, str]]]]
        if self.config.data_layer is None:
            self._ensure(METRICS_DATA_SOURCE, "dataLayer")
            self._ensure(CORE_METRICS_EXTRACTOR, "dataLayer")
            wiring = [("dataLayer", METRICS_DATA_SOURCE, [("dataLayer", CORE_METRICS_EXTRACTOR)])]
        else:
            wiring = [
                (
                    f"dataLayer.sources[{i}].pluginRef",
                    src.plugin_ref,
                    [
                        (f"dataLayer.sources[{i}].extractors[{j}].pluginRef", ext.plugin_ref)
                        for j, ext in enumerate(src.extractors)
                    ],
                )
                for i, src in enumerate(self.config.data_layer.sources)
            ]

        bindings: list[SourceBinding] = []
        seen: set[str] = set()
        for path, ref, extractor_refs in wiring:
            if ref in seen:
                raise ConfigError(f"{path}: data source '{ref}' is listed twice")
            seen.add(ref)
            source = self._referenced(path, ref, "data source")
            extractors: list[Any]
            if isinstance(source, DataSource):
                extractors = [self._extractor(p, r, source) for p, r in extractor_refs]
            elif isinstance(source, NotificationSource):
                # A push source vets its own extractors (event types, GVKs) when it is bound.
                extractors = [self._referenced(p, r, "extractor") for p, r in extractor_refs]
            else:
                raise ConfigError(f"{path}: the plugin {ref} is not a fwkdl.DataSource")
            # SourceBinding is typed for polling sources; the data-layer runtime also takes push
            # sources there and tells them apart with NotificationSource.
            bindings.append(SourceBinding(source, tuple(extractors)))  # type: ignore[arg-type]
        return tuple(bindings)

    def _extractor(self, path: str, ref: str, source: DataSource) -> Extractor:
        extractor = self._referenced(path, ref, "extractor")
        if not isinstance(extractor, Extractor):
            raise ConfigError(f"{path}: the plugin {ref} is not a fwkdl.Extractor")
        if not _accepts(extractor.INPUT, source.OUTPUT):
            raise ConfigError(
                f"{path}: extractor '{_label(extractor)}' expects {_type_name(extractor.INPUT)} "
                f"but source '{_label(source)}' produces {_type_name(source.OUTPUT)}"
            )
        return extractor

    def _referenced(self, path: str, ref: str, what: str) -> Plugin:
        plugin = self.plugins.get(ref)
        if plugin is None:
            raise ConfigError(f"{path}: {what} references undefined plugin '{ref}'")
        return plugin

    def _legacy_binding(self) -> SourceBinding:
        try:
            return legacy_binding(self.options.metrics)
        except ConfigError:
            raise
        except Exception as e:  # why: all-or-nothing; surface any failure as a config error
            raise ConfigError(f"featureGates: failed to set up the legacy metrics poller: {e!r}") from e

    def _producers(self) -> tuple[DataProducer, ...]:
        """Step 13: a default producer for every consumed key nobody produces; then the DAG."""
        while missing := missing_producers(tuple(self.plugins.values())):
            consumer, key = missing[0]
            type_name = key.default_producer
            if not type_name:
                raise ConfigError(
                    f"plugins: plugin '{_label(consumer)}' consumes '{key.name}' but no plugin produces it"
                )
            if type_name in self.plugins:
                raise ConfigError(
                    f"plugins: plugin '{_label(consumer)}' consumes '{key.name}'; its default producer "
                    f"'{type_name}' cannot be added because '{_label(self.plugins[type_name])}' has that name"
                )
            if type_name not in self.registry:
                raise ConfigError(
                    f"plugins: plugin '{_label(consumer)}' consumes '{key.name}' but its default producer "
                    f"type '{type_name}' is not registered"
                )
            producer = self._instantiate(
                type_name, type_name, None, f"plugins (default producer {type_name})"
            )
            produced: frozenset[AttributeKey[Any]] = getattr(producer, "PRODUCES", frozenset())
            if not isinstance(producer, DataProducer) or all(k.name != key.name for k in produced):
                raise ConfigError(
                    f"plugins: default producer '{_label(producer)}' of key '{key.name}' "
                    f"(consumed by '{_label(consumer)}') does not produce it"
                )
        try:
            return order_producers(tuple(self.plugins.values()))
        except ConfigError as e:
            raise ConfigError(f"plugins: {e}") from None
