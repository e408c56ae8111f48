"""``core-metrics-extractor``: engine metrics (queue, running, KV cache, LoRA, cache geometry) → Metrics."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import ClassVar, Final

from pydantic import Field

from epp.datalayer.api import Endpoint
from epp.datalayer.engines import (
    BUILTIN_ENGINES,
    DEFAULT_ENGINE,
    DEFAULT_ENGINE_LABEL_KEY,
    LLMD_ENGINE_LABEL_KEY,
    RESERVED_ENGINE,
    EngineMapping,
    EngineTable,
    ExtractionError,
    SpecError,
    atoi,
    build_metrics,
    finite_value,
)
from epp.datalayer.exposition import MetricFamilies, with_total_aliases
from epp.datalayer.scalar_attributes import data_key
from epp.errors import ConfigError
from epp.plugin.base import Handle, PluginBase, PluginParams

LORA_RUNNING_LABEL: Final = "running_lora_adapters"
LORA_WAITING_LABEL: Final = "waiting_lora_adapters"
LORA_MAX_LABEL: Final = "max_lora"
_ADAPTER_CACHE_SIZE: Final = 1024
_ADAPTER_CACHE_MAX_KEY: Final = 4096  # longer lists are split every time rather than remembered
EXTRACTOR_TYPE: Final = "core-metrics-extractor"


# One ``engineConfigs`` entry is an engine table; an empty spec string disables that metric.
EngineConfigParams = EngineTable


class CoreMetricsExtractorParams(PluginParams):
    engine_label_key: str = DEFAULT_ENGINE_LABEL_KEY
    default_engine: str = DEFAULT_ENGINE
    engine_configs: tuple[EngineConfigParams, ...] = Field(default=())


class CoreMetricsExtractor(PluginBase):
    """Turns a scraped metrics page into the endpoint's ``Metrics``.  Type ``core-metrics-extractor``.

    The engine is the endpoint's ``engineLabelKey`` pod label (default
    ``inference.networking.k8s.io/engine-type``), else GIE's key, else llm-d-router's
    ``llm-d.ai/engine-type`` (as llm-d-router falls back to GIE's key); unlabeled or unknown
    engines use ``defaultEngine`` (``vllm``).  Built-in tables: ``vllm``, ``sglang``, ``trtllm-serve``,
    ``triton-tensorrt-llm`` (gie-inventory §6.5).  Each spec is a PromQL-style selector
    ``name{label=value}``; among matching series the one with the latest timestamp wins.
    LoRA info takes the series with the largest value (its creation time) and reads the
    ``running_lora_adapters`` / ``waiting_lora_adapters`` comma lists and ``max_lora``;
    cache info reads block size and block count from labels (or, for TRT-LLM, from gauges).

    A new ``Metrics`` replaces the endpoint's when at least one spec was read, with
    ``update_time = time.monotonic()``; fields whose spec failed keep their last value.
    Problems (missing family, no matching series, NaN/Inf value, unparsable label) are
    raised together after the update, so the runtime logs them once per state change.

    Consumes: ``MetricFamilies`` from ``metrics-data-source``; it asks the source to parse
    only the families named in its engine tables.
    Parameters: ``engineLabelKey``, ``defaultEngine``, ``engineConfigs[]`` (``name``,
    ``queuedRequestsSpec``, ``runningRequestsSpec``, ``kvUsageSpec``, ``loraSpec``,
    ``cacheInfoSpec``, ``cacheBlockSizeLabelName``, ``cacheNumBlocksLabelName``,
    ``cacheBlockSizeSpec``, ``cacheNumBlocksSpec``, ``customMetrics[]``).  An entry replaces the
    built-in of the same name entirely; the name ``default`` is reserved.

    ``customMetrics`` (``attributeKey``, ``metricSpec``) publish any scalar metric as a numeric
    endpoint attribute ``<attributeKey>/core-metrics-extractor`` (upstream's data key: the
    producer part is the type, whatever this instance is named), for ``endpoint-attribute-*``;
    the bare ``attributeKey`` names it too, as upstream's readers resolve an attribute given
    without a producer.  A value is the spec's latest matching series; it stays until the next
    successful read and goes when the endpoint leaves.  An empty or repeated ``attributeKey``,
    or an empty or bad ``metricSpec``, is refused at startup naming the engine and the key.
    """

    TYPE: ClassVar[str] = EXTRACTOR_TYPE
    PARAMS: ClassVar[type[PluginParams]] = CoreMetricsExtractorParams
    INPUT: ClassVar[type[MetricFamilies]] = MetricFamilies

    def __init__(self, name: str, params: PluginParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        assert isinstance(params, CoreMetricsExtractorParams)
        self._label_key = params.engine_label_key or DEFAULT_ENGINE_LABEL_KEY
        self._label_keys = tuple(
            dict.fromkeys((self._label_key, DEFAULT_ENGINE_LABEL_KEY, LLMD_ENGINE_LABEL_KEY))
        )
        default_engine = params.default_engine or DEFAULT_ENGINE
        tables = list(params.engine_configs)
        user_names = {t.name for t in tables}
        tables += [t for t in BUILTIN_ENGINES if t.name not in user_names]
        self._mappings: dict[str, EngineMapping] = {}
        for table in tables:
            if table.name == "":
                raise ConfigError("engine config name cannot be empty")
            if table.name == RESERVED_ENGINE:
                raise ConfigError(f'engine config name cannot be "{RESERVED_ENGINE}" (reserved)')
            try:
                mapping = EngineMapping.from_table(table)
            except SpecError as e:
                raise ConfigError(f'failed to create mapping for engine "{table.name}": {e}') from None
            if table.name in self._mappings:
                raise ConfigError(
                    f'failed to register engine mapping for "{table.name}": '
                    f'mapping for engine type "{table.name}" already exists'
                )
            self._mappings[table.name] = mapping
        default = self._mappings.get(default_engine)
        if default is None:
            raise ConfigError(f'defaultEngine "{default_engine}" not found in engineConfigs')
        self._default = default
        self._wanted = with_total_aliases(s.name for m in self._mappings.values() for s in m.specs())
        self._adapter_sets: dict[str, frozenset[str]] = {}  # LoRA label value -> adapter names
        # customMetrics: one live dict per attribute, shared by its full and bare keys.
        self._custom: dict[str, dict[Endpoint, float]] = {}
        self._custom_keys: dict[str, dict[Endpoint, float]] = {}
        for mapping in self._mappings.values():
            for attribute, _ in mapping.custom:
                values = self._custom.setdefault(attribute, {})
                self._custom_keys[data_key(attribute, EXTRACTOR_TYPE)] = values
                if "/" not in attribute:
                    self._custom_keys.setdefault(attribute, values)

    def scalar_values(self, key: str) -> Mapping[Endpoint, float] | None:
        """The ``customMetrics`` attribute ``key`` by endpoint (None: not one of ours)."""
        return self._custom_keys.get(key)

    def endpoint_added(self, endpoint: Endpoint) -> None:
        """Nothing to do: custom values appear with the endpoint's first successful scrape."""

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        for values in self._custom.values():
            values.pop(endpoint, None)

    def _adapters(self, csv: str) -> frozenset[str]:
        """Adapter names of a comma list, trimmed; memoised since the lists rarely change."""
        names = self._adapter_sets.get(csv)
        if names is None:
            names = frozenset(a for a in (p.strip() for p in csv.split(",")) if a)
            if len(csv) <= _ADAPTER_CACHE_MAX_KEY:
                if len(self._adapter_sets) >= _ADAPTER_CACHE_SIZE:
                    self._adapter_sets.clear()
                self._adapter_sets[csv] = names
        return names

    def wanted_families(self) -> frozenset[str]:
        return self._wanted

    def engines(self) -> tuple[str, ...]:
        return tuple(self._mappings)

    def mapping_for(self, endpoint: Endpoint) -> EngineMapping:
        labels = endpoint.metadata.labels
        for key in self._label_keys:
            engine = labels.get(key)
            if engine:
                return self._mappings.get(engine, self._default)
        return self._default

    def extract(self, data: MetricFamilies, endpoint: Endpoint) -> None:
        mapping = self.mapping_for(endpoint)
        cur = endpoint.metrics
        waiting, running, kv = cur.waiting_queue_size, cur.running_requests_size, cur.kv_cache_usage_percent
        active, waiting_models, max_active = cur.active_models, cur.waiting_models, cur.max_active_models
        block_size, num_blocks = cur.cache_block_size, cur.cache_num_blocks
        errors: list[str] = []
        updated = False

        if (spec := mapping.queued) is not None:
            try:
                waiting = int(finite_value(spec, spec.latest(data)))
                updated = True
            except ExtractionError as e:
                errors.append(str(e))
        if (spec := mapping.running) is not None:
            try:
                running = int(finite_value(spec, spec.latest(data)))
                updated = True
            except ExtractionError as e:
                errors.append(str(e))
        if (spec := mapping.kv_usage) is not None:
            try:
                kv = finite_value(spec, spec.latest(data))
                updated = True
            except ExtractionError as e:
                errors.append(str(e))
        if (spec := mapping.lora) is not None:
            try:
                labels = spec.largest_value(data).labels
            except ExtractionError as e:
                errors.append(str(e))
            else:
                active = self._adapters(labels.get(LORA_RUNNING_LABEL, ""))
                waiting_models = self._adapters(labels.get(LORA_WAITING_LABEL, ""))
                if max_lora := labels.get(LORA_MAX_LABEL, ""):
                    try:
                        max_active = atoi(max_lora)
                    except ExtractionError as e:
                        errors.append(str(e))
                updated = True
        if (spec := mapping.cache_info) is not None:
            try:
                labels = spec.latest(data).labels
            except ExtractionError as e:
                errors.append(str(e))
            else:
                block_size = 0  # GIE resets the block size, not the block count, before reading
                if text := labels.get(mapping.cache_block_size_label, ""):
                    try:
                        block_size = atoi(text)
                    except ExtractionError as e:
                        errors.append(str(e))
                if text := labels.get(mapping.cache_num_blocks_label, ""):
                    try:
                        num_blocks = atoi(text)
                    except ExtractionError as e:
                        errors.append(str(e))
                updated = True
        if (spec := mapping.cache_block_size) is not None:
            try:
                block_size = int(finite_value(spec, spec.latest(data)))
                updated = True
            except ExtractionError as e:
                errors.append(str(e))
        if (spec := mapping.cache_num_blocks) is not None:
            try:
                num_blocks = int(finite_value(spec, spec.latest(data)))
                updated = True
            except ExtractionError as e:
                errors.append(str(e))

        for attribute, spec in mapping.custom:
            try:
                self._custom[attribute][endpoint] = finite_value(spec, spec.latest(data))
                updated = True
            except ExtractionError as e:
                errors.append(f'custom metric "{attribute}": {e}')

        if updated:
            endpoint.metrics = build_metrics(
                waiting,
                running,
                kv,
                active,
                waiting_models,
                max_active,
                cur.kv_cache_max_token_capacity,
                block_size,
                num_blocks,
                time.monotonic(),
            )
        if errors:
            raise ExtractionError("; ".join(errors))
