"""llm-d-router's EndpointPickerConfig layout (``llm-d.ai/v1alpha1``, ``llm-d.ai/v1``), mapped onto GIE's.

llm-d-router (v0.10, ``apix/config/v1alpha1`` with group ``llm-d.ai``) kept GIE's schema and moved or
added a few fields (docs/configuration.md, "llm-d-router configs"):

* ``requestHandler.parsers: [{pluginRef}]`` replaces the top-level ``parser`` (still accepted,
  deprecated; the new field wins when both are set).  Several parsers are resolved per request
  by the longest path suffix they claim (``epp.parsers.registry``), as llm-d-router does.
* ``flowControl.saturationDetector`` replaces the top-level ``saturationDetector`` (same rule).
* ``featureGates`` entries may carry ``=true`` / ``=false``.
* ``dataLayer.injectDefaults`` (default true) adds the default metrics source beside the user's
  sources unless one named ``metrics-data-source`` is listed.
* Fields for features this EPP does not have (``flowControl.noEndpointRequestTTL``,
  ``defaultNegativePriorityBand``) are rejected with their field path rather than silently
  ignored.
* ``dataLayer.crossReplicaSyncerPluginRef``, ``crossReplicaSyncInterval`` and ``peerDiscovery``
  are kept: ``epp.sync`` reads them (docs/scale-out.md).

The result is a plain ``EndpointPickerConfig`` (keeping the llm-d ``apiVersion``), so the builder and
everything after it see one model.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from epp.config.schema import (
    DataLayerConfig,
    DataLayerSource,
    Duration,
    EndpointPickerConfig,
    FlowControlConfig,
    PluginRef,
    PluginSpec,
    PriorityBandConfig,
    SchedulingProfile,
    Seq,
    _Model,
)
from epp.errors import ConfigError

LLMD_API_VERSIONS: Final = ("llm-d.ai/v1alpha1", "llm-d.ai/v1")
# Top-level fields only llm-d-router's schema has: a GIE-apiVersion file using them was written
# for llm-d-router (which accepts GIE's group as an alias) and is read with its schema.
LLMD_ONLY_FIELDS: Final = frozenset({"requestHandler"})

# Gates llm-d-router registers that have nothing to switch here; accepted and dropped.
LLMD_NOOP_GATES: Final = frozenset({"haPopulateNonLeaderDatastore"})

DEFAULT_METRICS_SOURCE: Final = "metrics-data-source"
DEFAULT_METRICS_EXTRACTOR: Final = "core-metrics-extractor"

_TRUE: Final = frozenset({"true", "True", "TRUE", "1", "t", "T"})
_FALSE: Final = frozenset({"false", "False", "FALSE", "0", "f", "F"})


def _unsupported(what: str) -> PydanticCustomError:
    return PydanticCustomError("unsupported", "{what} is not supported by this EPP", {"what": what})


class LlmdDataLayerConfig(_Model):
    sources: Seq[DataLayerSource] = ()
    inject_defaults: bool | None = None
    discovery: PluginRef | None = None
    peer_discovery: PluginRef | None = None
    cross_replica_syncer_plugin_ref: str = ""
    cross_replica_sync_interval: Duration | None = None


class LlmdFlowControlConfig(FlowControlConfig):
    saturation_detector: PluginRef | None = None
    no_endpoint_request_ttl: Duration | None = Field(default=None, alias="noEndpointRequestTTL")
    default_negative_priority_band: PriorityBandConfig | None = None

    @model_validator(mode="after")
    def _supported(self) -> LlmdFlowControlConfig:
        if self.no_endpoint_request_ttl is not None:
            raise _unsupported("a separate queue budget for an empty pool (flowControl.noEndpointRequestTTL)")
        if self.default_negative_priority_band is not None:
            raise _unsupported("a negative-priority band template (flowControl.defaultNegativePriorityBand)")
        return self

    def as_gie(self) -> FlowControlConfig:
        return FlowControlConfig.model_construct(
            **{name: getattr(self, name) for name in FlowControlConfig.model_fields}
        )


class RequestHandlerConfig(_Model):
    # In order; several are resolved per request by the longest claimed path suffix
    # (epp.parsers.registry, llm-d-router's ParserRegistry).
    parsers: Seq[PluginRef] = ()


def _gates(value: object) -> object:
    """``["flowControl", "x=true", "y=false"]`` → the gates switched on; bad values name their index."""
    if not isinstance(value, list | tuple):
        return value
    out: list[object] = []
    for i, entry in enumerate(value):
        if not isinstance(entry, str):
            out.append(entry)  # the type error is the model's to report
            continue
        name, sep, raw = entry.partition("=")
        name = name.strip()
        if sep:
            raw = raw.strip()
            if raw in _FALSE:
                continue
            if raw not in _TRUE:
                raise PydanticCustomError(
                    "gate_value",
                    "featureGates[{i}]: feature gate '{name}' has value '{raw}'; expected true or false",
                    {"i": i, "name": name, "raw": raw},
                )
        if name not in LLMD_NOOP_GATES:
            out.append(name)
    return out


class LlmdEndpointPickerConfig(_Model):
    """The llm-d-router file, strictly decoded like GIE's; ``to_gie`` gives the model the builder reads."""

    # GIE's group too: llm-d-router decodes it with this same schema (a deprecated alias there),
    # so a GIE-apiVersion file using llm-d's fields (``requestHandler``) is read with this model.
    api_version: Literal["llm-d.ai/v1alpha1", "llm-d.ai/v1", "inference.networking.x-k8s.io/v1alpha1"]
    kind: Literal["EndpointPickerConfig"]
    feature_gates: Seq[str] = ()
    plugins: Seq[PluginSpec] = ()
    scheduling_profiles: Seq[SchedulingProfile] = ()
    data_layer: LlmdDataLayerConfig | None = None
    flow_control: LlmdFlowControlConfig | None = None
    request_handler: RequestHandlerConfig | None = None
    saturation_detector: PluginRef | None = None  # deprecated: flowControl.saturationDetector
    parser: PluginRef | None = None  # deprecated: requestHandler.parsers

    @model_validator(mode="before")
    @classmethod
    def _gate_values(cls, data: Any) -> Any:
        if isinstance(data, dict) and "featureGates" in data:
            data = {**data, "featureGates": _gates(data["featureGates"])}
        return data

    def to_gie(self) -> EndpointPickerConfig:
        parser = self.parser
        parsers: tuple[PluginRef, ...] = ()
        if self.request_handler is not None and self.request_handler.parsers:
            parser = self.request_handler.parsers[0]
            if len(self.request_handler.parsers) > 1:
                parsers = tuple(self.request_handler.parsers)
        detector = self.saturation_detector
        flow_control: FlowControlConfig | None = None
        if self.flow_control is not None:
            detector = self.flow_control.saturation_detector or detector
            flow_control = self.flow_control.as_gie()
        plugins = self.plugins
        data_layer: DataLayerConfig | None = None
        if self.data_layer is not None:
            sources = self.data_layer.sources
            inject = self.data_layer.inject_defaults is not False
            if inject and not any(s.plugin_ref == DEFAULT_METRICS_SOURCE for s in sources):
                sources = (
                    *sources,
                    DataLayerSource(
                        plugin_ref=DEFAULT_METRICS_SOURCE,
                        extractors=(PluginRef(plugin_ref=DEFAULT_METRICS_EXTRACTOR),),
                    ),
                )
                names = {p.name for p in plugins}
                plugins = (
                    *plugins,
                    *(
                        PluginSpec(name=t, type=t)
                        for t in (DEFAULT_METRICS_SOURCE, DEFAULT_METRICS_EXTRACTOR)
                        if t not in names
                    ),
                )
            if not sources:
                raise ConfigError(
                    "dataLayer.injectDefaults: false with no dataLayer.sources leaves the EPP without "
                    "endpoint metrics; list a source or drop injectDefaults"
                )
            data_layer = DataLayerConfig.model_construct(
                sources=sources,
                discovery=self.data_layer.discovery,
                cross_replica_syncer_plugin_ref=self.data_layer.cross_replica_syncer_plugin_ref,
                cross_replica_sync_interval=self.data_layer.cross_replica_sync_interval,
                peer_discovery=self.data_layer.peer_discovery,
            )
        return EndpointPickerConfig.model_construct(
            api_version=self.api_version,
            kind=self.kind,
            feature_gates=self.feature_gates,
            plugins=plugins,
            scheduling_profiles=self.scheduling_profiles,
            saturation_detector=detector,
            data_layer=data_layer,
            flow_control=flow_control,
            parser=parser,
        ).with_parsers(parsers)
