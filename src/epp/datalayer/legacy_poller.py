"""The legacy per-pod metrics poller behind the ``enableLegacyMetrics`` gate (gie-inventory §6.6)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, ClassVar, Final

from epp.datalayer.api import Endpoint, SourceBinding
from epp.datalayer.engines import (
    EngineMapping,
    ExtractionError,
    Spec,
    atoi,
    build_metrics,
    builtin_engine,
    finite_value,
)
from epp.datalayer.exposition import MetricFamilies, with_total_aliases
from epp.datalayer.sources.metrics_http import (
    MetricsDataSource,
    MetricsDataSourceParams,
    ModelServerMetricsFlags,
)
from epp.plugin.base import NoParams, PluginBase, PluginParams

LEGACY_FETCH_TIMEOUT: Final = 5.0
# The legacy poller reads vLLM's metrics: the built-in ``vllm`` engine table, parsed once.
_VLLM: Final = EngineMapping.from_table(builtin_engine("vllm"))


def _enabled(spec: Spec | None) -> Spec:
    if spec is None:  # pragma: no cover - the built-in vllm table sets every spec used here
        raise RuntimeError("the built-in vllm engine table lacks a spec the legacy poller reads")
    return spec


QUEUED: Final = _enabled(_VLLM.queued)
RUNNING: Final = _enabled(_VLLM.running)
KV_USAGE: Final = _enabled(_VLLM.kv_usage)
LORA_INFO: Final = _enabled(_VLLM.lora)
CACHE_INFO: Final = _enabled(_VLLM.cache_info)


class _NoHandle:
    """Built outside the config, the legacy plugins have no other plugins to look up."""

    def plugin(self, name: str) -> Any:
        raise KeyError(name)

    def plugins(self) -> Sequence[Any]:
        return ()


def _split(csv: str) -> frozenset[str]:
    return frozenset(csv.split(",")) if csv else frozenset()


class LegacyMetricsExtractor(PluginBase):
    """The legacy poller's fixed vLLM mapping; not configurable, so not registered.

    Differences from ``core-metrics-extractor``, kept from GIE: ``update_time`` is
    refreshed on every successful fetch even when some metrics are missing; LoRA ignores
    series whose two adapter labels are both empty, takes the largest positive value and
    splits the adapter lists without trimming; a missing LoRA series is not an error.
    """

    TYPE: ClassVar[str] = "legacy-metrics-extractor"
    PARAMS: ClassVar[type[PluginParams]] = NoParams
    INPUT: ClassVar[type[MetricFamilies]] = MetricFamilies

    def wanted_families(self) -> frozenset[str]:
        return with_total_aliases(s.name for s in (QUEUED, RUNNING, KV_USAGE, LORA_INFO, CACHE_INFO))

    def extract(self, data: MetricFamilies, endpoint: Endpoint) -> None:
        cur = endpoint.metrics
        waiting, running, kv = cur.waiting_queue_size, cur.running_requests_size, cur.kv_cache_usage_percent
        active, waiting_models, max_active = cur.active_models, cur.waiting_models, cur.max_active_models
        block_size, num_blocks = cur.cache_block_size, cur.cache_num_blocks
        errors: list[str] = []
        try:
            waiting = int(finite_value(QUEUED, QUEUED.latest(data)))
        except ExtractionError as e:
            errors.append(str(e))
        try:
            running = int(finite_value(RUNNING, RUNNING.latest(data)))
        except ExtractionError as e:
            errors.append(str(e))
        try:
            kv = finite_value(KV_USAGE, KV_USAGE.latest(data))
        except ExtractionError as e:
            errors.append(str(e))
        lora_series = data.family(LORA_INFO.name)
        if lora_series is None:
            errors.append(f"metric family {LORA_INFO.name!r} not found")
        else:
            best, latest = None, 0.0
            for s in lora_series:
                running_csv = s.labels.get("running_lora_adapters", "")
                waiting_csv = s.labels.get("waiting_lora_adapters", "")
                if (running_csv or waiting_csv) and s.value > latest:
                    best, latest = s, s.value
            if best is not None:
                active = _split(best.labels.get("running_lora_adapters", ""))
                waiting_models = _split(best.labels.get("waiting_lora_adapters", ""))
                if max_lora := best.labels.get("max_lora", ""):
                    try:
                        max_active = atoi(max_lora)
                    except ExtractionError as e:
                        errors.append(str(e))
        if data.family(CACHE_INFO.name) is not None:
            try:
                labels = CACHE_INFO.latest(data).labels
                if text := labels.get("block_size", ""):
                    block_size = atoi(text)
                if text := labels.get("num_gpu_blocks", ""):
                    num_blocks = atoi(text)
            except ExtractionError as e:
                errors.append(str(e))
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


def legacy_binding(metrics_flags: ModelServerMetricsFlags) -> SourceBinding:
    """The source and extractor the legacy poller uses, configured from the deprecated flags.

    The scrape port is the endpoint's ``metrics_port`` (set from ``--model-server-metrics-port``
    by whoever builds endpoints), so ``metrics_flags.port`` is not read here.
    """
    params = MetricsDataSourceParams(
        scheme=metrics_flags.scheme,
        path=metrics_flags.path,
        insecure_skip_verify=metrics_flags.insecure_skip_verify,
        timeout=LEGACY_FETCH_TIMEOUT,
    )
    handle = _NoHandle()
    source = MetricsDataSource("legacy-metrics", params, handle)
    extractor = LegacyMetricsExtractor("legacy-metrics-extractor", NoParams(), handle)
    return SourceBinding(source, (extractor,))
