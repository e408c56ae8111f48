"""The data layer assembles itself: ``dataLayer`` + instantiated plugins → ``DataLayer``.

Why here: which plugin is a polling or push source, which extractor fits which source's
output, and what the default wiring is (``metrics-data-source`` → ``core-metrics-extractor``)
is the data layer's knowledge (gie-inventory §8.2 steps 6 and 9).  The config layer hands
over its ``dataLayer`` section (or asks for the legacy poller when the
``enableLegacyMetrics`` gate is on) and gets back the bindings and a factory for the
runtime that polls them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from epp.config.schema import DataLayerConfig
from epp.datalayer.api import (
    DataSource,
    EndpointDiscovery,
    EndpointObserver,
    Extractor,
    NotificationSource,
    SourceBinding,
)
from epp.datalayer.legacy_poller import legacy_binding
from epp.datalayer.runtime import DataLayerRuntime, ObservableEndpoints
from epp.datalayer.sources.metrics_http import ModelServerMetricsFlags
from epp.errors import ConfigError
from epp.plugin.assembly import PluginSet, label
from epp.plugin.base import Plugin

METRICS_DATA_SOURCE: Final = "metrics-data-source"
CORE_METRICS_EXTRACTOR: Final = "core-metrics-extractor"


@dataclass(frozen=True, slots=True)
class DataLayer:
    """The bound sources and the datastore observers; ``runtime`` makes what polls them."""

    bindings: tuple[SourceBinding, ...]
    observers: tuple[EndpointObserver, ...] = ()

    def runtime(self, datastore: ObservableEndpoints, *, refresh_interval: float) -> DataLayerRuntime:
        return DataLayerRuntime(datastore, self.bindings, refresh_interval=refresh_interval)

    def owns(self, plugin: object) -> bool:
        """Whether the runtime starts and stops ``plugin`` (a bound source)."""
        return any(binding.source is plugin for binding in self.bindings)


def observers(plugins: PluginSet) -> tuple[EndpointObserver, ...]:
    return tuple(p for p in plugins.values() if isinstance(p, EndpointObserver))


def legacy(metrics: ModelServerMetricsFlags) -> tuple[SourceBinding, ...]:
    """The legacy poller of the ``enableLegacyMetrics`` gate, set from the deprecated flags."""
    try:
        return (legacy_binding(metrics),)
    except ConfigError:
        raise
    except Exception as e:  # why: all-or-nothing; surface any failure as a config error
        raise ConfigError(f"featureGates: failed to set up the legacy metrics poller: {e!r}") from e


def bindings(section: DataLayerConfig | None, plugins: PluginSet) -> tuple[SourceBinding, ...]:
    """Steps 6 and 9: the default metrics source and extractor, or the ``dataLayer`` wiring."""
    # (path, source ref, [(path, extractor ref)])
    wiring: list[tuple[str, str, list[tuple[str, str]]]]
    if section is None:
        plugins.ensure(METRICS_DATA_SOURCE, "dataLayer")
        plugins.ensure(CORE_METRICS_EXTRACTOR, "dataLayer")
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
            for i, src in enumerate(section.sources)
        ]

    out: list[SourceBinding] = []
    seen: set[str] = set()
    for path, ref, extractor_refs in wiring:
        if ref in seen:
            raise ConfigError(f"{path}: data source '{ref}' is listed twice")
        seen.add(ref)
        source = _referenced(plugins, path, ref, "data source")
        extractors: list[Any]
        if isinstance(source, DataSource):
            extractors = [_extractor(plugins, p, r, source) for p, r in extractor_refs]
        elif isinstance(source, NotificationSource):
            # A push source vets its own extractors (event types, GVKs) when it is bound.
            extractors = [_referenced(plugins, p, r, "extractor") for p, r in extractor_refs]
        else:
            raise ConfigError(f"{path}: the plugin {ref} is not a fwkdl.DataSource")
        # SourceBinding is typed for polling sources; the data-layer runtime also takes push
        # sources there and tells them apart with NotificationSource.
        out.append(SourceBinding(source, tuple(extractors)))  # type: ignore[arg-type]
    if section is not None and section.discovery is not None:
        # The runtime starts the discovery plugin with the datastore (it finds the endpoints).
        ref = section.discovery.plugin_ref
        discovery = _referenced(plugins, "dataLayer.discovery.pluginRef", ref, "discovery")
        if not isinstance(discovery, EndpointDiscovery):
            raise ConfigError(
                f"dataLayer.discovery.pluginRef: the plugin {ref} is not an endpoint discovery plugin"
            )
        out.append(SourceBinding(discovery, ()))  # type: ignore[arg-type]
    return tuple(out)


def _accepts(input_type: Any, output_type: Any) -> bool:
    if input_type is Any or input_type is object:
        return True
    try:
        return issubclass(output_type, input_type)
    except TypeError:  # typing constructs (unions, generics): only equality is decidable
        return bool(input_type == output_type)


def _type_name(t: Any) -> str:
    return getattr(t, "__name__", None) or repr(t)


def _extractor(plugins: PluginSet, path: str, ref: str, source: DataSource) -> Extractor:
    extractor = _referenced(plugins, path, ref, "extractor")
    if not isinstance(extractor, Extractor):
        raise ConfigError(f"{path}: the plugin {ref} is not a fwkdl.Extractor")
    if not _accepts(extractor.INPUT, source.OUTPUT):
        raise ConfigError(
            f"{path}: extractor '{label(extractor)}' expects {_type_name(extractor.INPUT)} "
            f"but source '{label(source)}' produces {_type_name(source.OUTPUT)}"
        )
    return extractor


def _referenced(plugins: PluginSet, path: str, ref: str, what: str) -> Plugin:
    plugin = plugins.get(ref)
    if plugin is None:
        raise ConfigError(f"{path}: {what} references undefined plugin '{ref}'")
    return plugin
