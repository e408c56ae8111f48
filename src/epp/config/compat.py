"""Older upstream config forms rewritten to today's before the builder sees them.

Real deployments carry configs written for GIE <= 1.4 and llm-d-router <= 0.5.  Where upstream
moved a parameter to another plugin, the config is rewritten here (with a warning naming the
replacement) instead of refused, so a config written for the Go EPP loads unchanged:

* ``prefix-cache-scorer`` with GIE <= 1.4's index parameters (``blockSize``, ``hashBlockSize``,
  ``maxPrefixBlocksToMatch``, ``lruCapacityPerServer``, ``autoTune``, ``blockSizeTokens``,
  ``maxPrefixTokensToMatch``): GIE 1.5 moved the index into ``approx-prefix-cache-producer`` and
  ignores them on the scorer.  They are moved onto an added producer (when the config declares
  none), so their meaning is kept: ``blockSize`` was tokens up to GIE 1.3 and becomes
  ``blockSizeTokens`` when that is absent; GIE 1.0's ``hashBlockSize`` was characters (4 a token).
* ``pd-profile-handler`` with llm-d <= 0.5's ``threshold`` / ``hashBlockSize`` and no decider:
  that handler decided itself (prefill when the uncached part of the prompt, in characters, is
  at least ``threshold``; always when ``threshold`` is 0).  A ``prefix-based-pd-decider`` with
  ``nonCachedTokens = ceil(threshold / 4)`` (or an ``always-disagg-pd-decider``) is added and named.

* llm-d <= v0.2's ``prefix-cache-scorer`` with ``mode`` (``cache_tracking`` is today's
  ``precise-prefix-cache-scorer``): ``config/compat_modes.py``.
* ``disagg-profile-handler``'s deprecated flat parameters (``decodeProfile``, ``prefillProfile``,
  ``encodeProfile``, ``prefillDeciderPluginName``, ``encodeDeciderPluginName``,
  ``deciderPluginName``), which llm-d-router still reads: nested into ``profiles`` / ``deciders``.
* llm-d-router v0.10's ``inFlightLoadProducerName``, ``latencyPredictionInfoProducerName`` and
  ``prefixMatchInfoProducerName`` on the plugins that read those keys: they pick which producer
  instance's output to read, and this EPP runs one producer per key, so a name that names a
  declared plugin or the key's default producer is accepted and dropped; any other name is an
  error naming the field.

Before validation (``upgrade_raw``, on the parsed file):

* GIE <= 1.4's ``data:`` section is today's ``dataLayer:``.
* GIE <= 1.4's ``saturationDetector: {queueDepthThreshold, kvCacheUtilThreshold,
  metricsStalenessThreshold}`` configured the built-in detector; GIE 1.5 made it a plugin
  reference.  The thresholds become a ``utilization-detector`` plugin it references.
* ``flowControl.saturationDetector`` (llm-d-router's place for it) in a GIE-apiVersion file is
  moved to the top-level ``saturationDetector`` (``config/llmd.py`` does the same for llm-d's).

Everything here is a pure function of the parsed file or validated model: a config never
half-loads.
"""

from __future__ import annotations

import math
from typing import Any, Final

import structlog

from epp.config.compat_modes import prefix_scorer_modes
from epp.config.schema import EndpointPickerConfig, PluginSpec
from epp.errors import ConfigError

log = structlog.get_logger(__name__)

PREFIX_SCORER: Final = "prefix-cache-scorer"
APPROX_PRODUCER: Final = "approx-prefix-cache-producer"
PD_HANDLER: Final = "pd-profile-handler"
CHARS_PER_TOKEN: Final = 4  # GIE's estimate, used by the approximate prefix index too

# GIE <= 1.4 prefix-cache-scorer parameters that now belong to the producer.
LEGACY_PREFIX_PARAMS: Final = frozenset(
    {
        "autoTune",
        "blockSize",
        "blockSizeTokens",
        "hashBlockSize",
        "maxPrefixBlocksToMatch",
        "maxPrefixTokensToMatch",
        "lruCapacityPerServer",
    }
)


def _producer_params(legacy: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in legacy.items() if k not in ("blockSize", "hashBlockSize")}
    if "blockSizeTokens" not in out:
        if isinstance(legacy.get("blockSize"), int) and legacy["blockSize"] > 0:
            out["blockSizeTokens"] = legacy["blockSize"]  # GIE <= 1.3: tokens
        elif isinstance(legacy.get("hashBlockSize"), int) and legacy["hashBlockSize"] > 0:
            out["blockSizeTokens"] = max(1, legacy["hashBlockSize"] // CHARS_PER_TOKEN)  # GIE 1.0: chars
    return out


def _prefix_scorers(plugins: list[PluginSpec]) -> None:
    has_producer = any(p.type == APPROX_PRODUCER for p in plugins)
    added: list[PluginSpec] = []
    for i, spec in enumerate(plugins):
        params = spec.parameters
        if spec.type != PREFIX_SCORER or not isinstance(params, dict):
            continue
        legacy = {k: v for k, v in params.items() if k in LEGACY_PREFIX_PARAMS}
        if not legacy:
            continue
        plugins[i] = spec.model_copy(
            update={"parameters": {k: v for k, v in params.items() if k not in LEGACY_PREFIX_PARAMS}}
        )
        if has_producer or added:
            log.warning(
                "deprecated_plugin_parameters_ignored",
                path=f"plugins[{i}].parameters",
                plugin=spec.name,
                parameters=sorted(legacy),
                reason=f"GIE 1.5 moved them to {APPROX_PRODUCER}, which this config declares itself",
            )
            continue
        mapped = _producer_params(legacy)
        log.warning(
            "deprecated_plugin_parameters_moved",
            path=f"plugins[{i}].parameters",
            plugin=spec.name,
            parameters=sorted(legacy),
            replacement=f"{APPROX_PRODUCER} parameters {sorted(mapped)}",
        )
        name = APPROX_PRODUCER if all(p.name != APPROX_PRODUCER for p in plugins) else f"{spec.name}-producer"
        added.append(PluginSpec(name=name, type=APPROX_PRODUCER, parameters=mapped))
    plugins.extend(added)


def _pd_handlers(plugins: list[PluginSpec]) -> None:
    names = {p.name for p in plugins}
    added: list[PluginSpec] = []
    for i, spec in enumerate(plugins):
        params = spec.parameters if isinstance(spec.parameters, dict) else {}
        if spec.type != PD_HANDLER:
            continue
        old = {k: params[k] for k in ("threshold", "hashBlockSize") if k in params}
        named = params.get("deciderPluginName")
        if named or (not old and "prefix-based-pd-decider" in names):
            if old:
                log.warning(
                    "deprecated_plugin_parameters_ignored",
                    path=f"plugins[{i}].parameters",
                    plugin=spec.name,
                    parameters=sorted(old),
                    reason="the handler names a decider (deciderPluginName), which decides instead",
                )
                plugins[i] = spec.model_copy(
                    update={"parameters": {k: v for k, v in params.items() if k not in old}}
                )
            continue
        threshold = old.get("threshold", 0)
        if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 0:
            raise ConfigError(
                f"plugins[{i}].parameters.threshold: invalid threshold: must be >= 0, got {threshold!r}"
            )
        decider = f"{spec.name}-decider"
        while decider in names:
            decider += "-"
        names.add(decider)
        if threshold > 0:
            tokens = math.ceil(threshold / CHARS_PER_TOKEN)
            added.append(
                PluginSpec(
                    name=decider, type="prefix-based-pd-decider", parameters={"nonCachedTokens": tokens}
                )
            )
            what = (
                f"prefix-based-pd-decider '{decider}' with nonCachedTokens {tokens} "
                f"(threshold {threshold} characters / 4)"
            )
        else:
            added.append(PluginSpec(name=decider, type="always-disagg-pd-decider"))
            what = f"always-disagg-pd-decider '{decider}' (threshold 0 always disaggregated)"
        log.warning(
            "deprecated_pd_profile_handler_decider_added",
            path=f"plugins[{i}].parameters",
            plugin=spec.name,
            parameters=sorted(old),
            replacement=what,
        )
        kept = {k: v for k, v in params.items() if k not in old}
        plugins[i] = spec.model_copy(update={"parameters": {**kept, "deciderPluginName": decider}})
    plugins.extend(added)


DETECTOR_THRESHOLDS: Final = frozenset(
    {"queueDepthThreshold", "kvCacheUtilThreshold", "metricsStalenessThreshold"}
)
LEGACY_DETECTOR_NAME: Final = "utilization-detector"


def _saturation_detector(data: dict[str, Any]) -> dict[str, Any]:
    detector = data.get("saturationDetector")
    if not isinstance(detector, dict) or not DETECTOR_THRESHOLDS & detector.keys():
        return data
    if "pluginRef" in detector:
        raise ConfigError(
            "saturationDetector: set either pluginRef (GIE >= 1.5) or the thresholds of GIE <= 1.4 "
            f"({', '.join(sorted(DETECTOR_THRESHOLDS & detector.keys()))}), not both"
        )
    plugins = data.get("plugins") or []
    if not isinstance(plugins, list):
        return data  # the model reports the type error
    names = {p.get("name") or p.get("type") for p in plugins if isinstance(p, dict)}
    name = LEGACY_DETECTOR_NAME
    while name in names:
        name += "-legacy"
    log.warning(
        "deprecated_config_field_moved",
        path="saturationDetector",
        fields=sorted(detector),
        replacement=f"utilization-detector plugin '{name}', named by saturationDetector.pluginRef",
    )
    plugin = {"name": name, "type": "utilization-detector", "parameters": dict(detector)}
    return {**data, "plugins": [*plugins, plugin], "saturationDetector": {"pluginRef": name}}


def upgrade_raw(data: dict[str, Any]) -> dict[str, Any]:
    """The parsed file with older section layouts rewritten (module doc); ``data`` when none apply."""
    if "data" in data:
        if "dataLayer" in data:
            raise ConfigError("data: GIE <= 1.4's name of dataLayer; set only dataLayer")
        log.warning("deprecated_config_field_moved", path="data", replacement="dataLayer")
        data = {("dataLayer" if k == "data" else k): v for k, v in data.items()}
    flow = data.get("flowControl")
    if (
        data.get("apiVersion") not in ("llm-d.ai/v1alpha1", "llm-d.ai/v1")
        and isinstance(flow, dict)
        and "saturationDetector" in flow
    ):
        if data.get("saturationDetector") is not None:
            raise ConfigError(
                "flowControl.saturationDetector: set only one of it and the top-level saturationDetector"
            )
        log.warning(
            "config_field_moved", path="flowControl.saturationDetector", replacement="saturationDetector"
        )
        rest = {k: v for k, v in flow.items() if k != "saturationDetector"}
        data = {**data, "flowControl": rest, "saturationDetector": flow["saturationDetector"]}
    return _saturation_detector(data)


# parameter -> the key's default producer; on the types that do not take it themselves.
PRODUCER_NAME_PARAMS: Final = {
    "inFlightLoadProducerName": "inflight-load-producer",
    "latencyPredictionInfoProducerName": "predicted-latency-producer",
    "prefixMatchInfoProducerName": "approx-prefix-cache-producer",
}
PRODUCER_NAME_READERS: Final = frozenset(
    {
        "active-request-scorer",
        "token-load-scorer",
        "concurrency-detector",
        "prefix-cache-affinity-filter",
        "latency-scorer",
        "latency-slo-admitter",
        "slo-headroom-tier-filter",
    }
)


def _producer_names(plugins: list[PluginSpec]) -> None:
    names = {p.name for p in plugins}
    for i, spec in enumerate(plugins):
        params = spec.parameters
        if spec.type not in PRODUCER_NAME_READERS or not isinstance(params, dict):
            continue
        given = {k: v for k, v in params.items() if k in PRODUCER_NAME_PARAMS}
        if not given:
            continue
        for key, value in given.items():
            if value and value not in names and value != PRODUCER_NAME_PARAMS[key]:
                raise ConfigError(
                    f"plugins[{i}].parameters.{key}: '{value}' names no plugin in this config "
                    f"(the default producer is '{PRODUCER_NAME_PARAMS[key]}')"
                )
        kept = {k: v for k, v in params.items() if k not in PRODUCER_NAME_PARAMS}
        plugins[i] = spec.model_copy(update={"parameters": kept or None})


# Types upstream removed (and now refuses): the error names what replaced them.
REMOVED_TYPES: Final = {
    "predicted-latency-scorer": "removed in GIE 1.5: declare predicted-latency-producer and put "
    "latency-scorer (with slo-headroom-tier-filter / prefix-cache-affinity-filter as needed) in the "
    "profile; docs/latency-prediction.md",
}


def _removed_types(plugins: list[PluginSpec]) -> None:
    for i, spec in enumerate(plugins):
        if spec.type in REMOVED_TYPES:
            raise ConfigError(f"plugins[{i}].type: plugin type '{spec.type}' was {REMOVED_TYPES[spec.type]}")


# disagg-profile-handler's deprecated flat form (llm-d-router keeps reading it): flat key -> nested.
DISAGG_FLAT: Final = {
    "decodeProfile": ("profiles", "decode"),
    "prefillProfile": ("profiles", "prefill"),
    "encodeProfile": ("profiles", "encode"),
    "prefillDeciderPluginName": ("deciders", "prefill"),
    "encodeDeciderPluginName": ("deciders", "encode"),
    "deciderPluginName": ("deciders", "prefill"),  # lower priority than prefillDeciderPluginName
}


def _disagg_flat(plugins: list[PluginSpec]) -> None:
    for i, spec in enumerate(plugins):
        params = spec.parameters
        if spec.type != "disagg-profile-handler" or not isinstance(params, dict):
            continue
        flat = [k for k in params if k in DISAGG_FLAT]
        if not flat or not set(params) <= {*DISAGG_FLAT, "stageOrder"}:
            continue  # nested (or mixed: the handler's model names the stray field)
        nested: dict[str, Any] = {"profiles": {}, "deciders": {}}
        if "stageOrder" in params:
            nested["stageOrder"] = params["stageOrder"]
        for key in sorted(flat, key=lambda k: k == "deciderPluginName"):  # the alias last
            section, name = DISAGG_FLAT[key]
            if params[key] and name not in nested[section]:
                nested[section][name] = params[key]
        log.warning(
            "deprecated_plugin_parameters_moved",
            path=f"plugins[{i}].parameters",
            plugin=spec.name,
            parameters=sorted(flat),
            replacement="profiles.{decode,prefill,encode} and deciders.{prefill,encode}",
        )
        plugins[i] = spec.model_copy(update={"parameters": nested})


def upgrade(cfg: EndpointPickerConfig) -> EndpointPickerConfig:
    """``cfg`` with older upstream forms rewritten (module doc); the same object when none apply."""
    plugins = list(cfg.plugins)
    _removed_types(plugins)
    prefix_scorer_modes(plugins)
    _prefix_scorers(plugins)
    _pd_handlers(plugins)
    _disagg_flat(plugins)
    _producer_names(plugins)
    if plugins == list(cfg.plugins):
        return cfg
    return cfg.model_copy(update={"plugins": tuple(plugins)})
