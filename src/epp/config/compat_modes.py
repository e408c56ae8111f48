"""llm-d's ``prefix-cache-scorer`` with ``mode``: the form before the prefix scorers were split.

Up to llm-d-inference-scheduler v0.2 (August 2025, "split the prefix-cache scorers") llm-d
registered its own ``prefix-cache-scorer`` over GIE's: ``mode: estimate`` (the default) built
GIE's approximate scorer from the other parameters, ``mode: cache_tracking`` built the KV-cache
tracking scorer from ``tokenProcessorConfig``, ``kvEventsConfig`` and ``indexerConfig`` at the top
level of its parameters.  That scorer is today's ``precise-prefix-cache-scorer``, which takes
those three blocks in the same places.  Sample configs kept the old form (llm-d-router v0.5.0's
``deploy/config/sim-epp-kvcache-config.yaml``): the Go EPP of that release hands the block to
GIE's approximate scorer, whose lenient JSON decoding drops every field, so the KV-events
tracking the file asks for silently never happens.  Here the form is rewritten to the plugin it
names, with a warning naming the replacement:

* ``mode: cache_tracking`` -> type ``precise-prefix-cache-scorer`` (same instance name, so profile
  references stay), ``mode`` dropped.  ``indexerConfig.prefixStoreConfig`` (llm-d-kv-cache <= 0.5's
  cache of tokenised prompt prefixes, removed in 0.6) has no counterpart and is dropped.
* ``mode: estimate`` -> ``prefix-cache-scorer`` without ``mode``.
* any other mode is an error naming the field and the two types that replaced it.
"""

from __future__ import annotations

from typing import Any, Final

import structlog

from epp.config.schema import PluginSpec
from epp.errors import ConfigError

log = structlog.get_logger(__name__)

PREFIX_SCORER: Final = "prefix-cache-scorer"
PRECISE_SCORER: Final = "precise-prefix-cache-scorer"


def _without_prefix_store(params: dict[str, Any], path: str, name: str) -> dict[str, Any]:
    indexer = params.get("indexerConfig")
    if not isinstance(indexer, dict) or "prefixStoreConfig" not in indexer:
        return params
    log.warning(
        "deprecated_plugin_parameters_ignored",
        path=f"{path}.indexerConfig.prefixStoreConfig",
        plugin=name,
        reason="llm-d-kv-cache 0.6 removed its tokenisation prefix store; this EPP has none",
    )
    return {**params, "indexerConfig": {k: v for k, v in indexer.items() if k != "prefixStoreConfig"}}


def prefix_scorer_modes(plugins: list[PluginSpec]) -> None:
    """Rewrite llm-d <= v0.2's ``prefix-cache-scorer`` ``mode`` form in place (module doc)."""
    for i, spec in enumerate(plugins):
        params = spec.parameters
        if spec.type != PREFIX_SCORER or not isinstance(params, dict) or "mode" not in params:
            continue
        path = f"plugins[{i}].parameters"
        mode = params["mode"]
        rest = {k: v for k, v in params.items() if k != "mode"}
        if mode == "cache_tracking":
            log.warning(
                "deprecated_plugin_form",
                path=f"{path}.mode",
                plugin=spec.name,
                replacement=f"type {PRECISE_SCORER} with the same tokenProcessorConfig, kvEventsConfig "
                "and indexerConfig (llm-d split the prefix-cache scorers after v0.2)",
            )
            rest = _without_prefix_store(rest, path, spec.name)
            plugins[i] = spec.model_copy(update={"type": PRECISE_SCORER, "parameters": rest})
        elif mode in ("estimate", ""):
            log.warning(
                "deprecated_plugin_parameters_ignored",
                path=f"{path}.mode",
                plugin=spec.name,
                reason=f"'{mode}' was the approximate scorer, which is what {PREFIX_SCORER} is now",
            )
            plugins[i] = spec.model_copy(update={"parameters": rest or None})
        else:
            raise ConfigError(
                f"{path}.mode: unknown mode {mode!r}: llm-d <= v0.2 took 'estimate' (today's "
                f"{PREFIX_SCORER}) or 'cache_tracking' (today's {PRECISE_SCORER})"
            )
