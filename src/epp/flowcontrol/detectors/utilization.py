"""``utilization-detector``: pool saturation from queue depth and KV-cache use (roofline model)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import ClassVar, Final

import structlog

from epp.datalayer.api import Endpoint
from epp.errors import ConfigError
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.units import parse_go_duration

log = structlog.get_logger(__name__)

STALE_WARNING_INTERVAL: Final = 30.0  # seconds between "all metrics stale" warnings
DEFAULT_QUEUE_DEPTH_THRESHOLD: Final = 5
DEFAULT_KV_CACHE_UTIL_THRESHOLD: Final = 0.8
DEFAULT_METRICS_STALENESS_THRESHOLD: Final = "200ms"


class UtilizationDetectorParams(PluginParams):
    """GIE's names and defaults; ``metricsStalenessThreshold`` is a Go duration string."""

    queue_depth_threshold: int = DEFAULT_QUEUE_DEPTH_THRESHOLD
    kv_cache_util_threshold: float = DEFAULT_KV_CACHE_UTIL_THRESHOLD
    metrics_staleness_threshold: str = DEFAULT_METRICS_STALENESS_THRESHOLD
    headroom: float = 0.0


class UtilizationDetector(PluginBase):
    """Saturation from endpoint telemetry; also a scheduling filter.  Type ``utilization-detector``.

    Saturation (pool backpressure) is the mean over endpoints of
    ``max(waiting_queue / queueDepthThreshold, kv_cache_usage / kvCacheUtilThreshold)``,
    where an endpoint whose metrics are stale (older than ``metricsStalenessThreshold``,
    by ``Metrics.update_time`` against ``time.monotonic()``) is left out of the mean as
    unknown (GIE counts it as 1.0); when every endpoint is stale the pool is treated as not
    saturated (fail open, logged); no endpoints → 1.0.  As a filter it drops stale endpoints
    and those with ``queue >= Qt * (1 + headroom)`` or ``kv >= KVt * (1 + headroom)``; if
    that drops every endpoint it returns the input unchanged (fail-open).
    Consumes: endpoint metrics.  Parameters: ``queueDepthThreshold`` (5, > 0),
    ``kvCacheUtilThreshold`` (0.8, in (0, 1]), ``metricsStalenessThreshold`` ("200ms",
    > 0), ``headroom`` (0.0, >= 0).  ``clock`` is a plain attribute tests may replace.
    Nothing to share between active-active replicas: every replica scrapes the engines, whose
    queues and KV caches already hold every replica's requests.
    """

    TYPE: ClassVar[str] = "utilization-detector"
    PARAMS: ClassVar[type[PluginParams]] = UtilizationDetectorParams

    def __init__(self, name: str, params: UtilizationDetectorParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        errs: list[str] = []
        if params.queue_depth_threshold <= 0:
            errs.append(f"queueDepthThreshold must be strictly positive, got {params.queue_depth_threshold}")
        kv = params.kv_cache_util_threshold
        if not 0.0 < kv <= 1.0:
            errs.append(f"kvCacheUtilThreshold must be in (0.0, 1.0], got {kv:f}")
        staleness = 0.0
        try:
            staleness = parse_go_duration(params.metrics_staleness_threshold)
        except ValueError as e:
            errs.append(f"metricsStalenessThreshold: {e}")
        else:
            if staleness <= 0:
                got = params.metrics_staleness_threshold
                errs.append(f"metricsStalenessThreshold must be strictly positive, got {got}")
        if params.headroom < 0.0:
            errs.append(f"headroom must be a non-negative value, got {params.headroom:f}")
        if errs:
            raise ConfigError("invalid utilization detector configuration: " + "; ".join(errs))
        self.queue_depth_threshold = params.queue_depth_threshold
        self.kv_cache_util_threshold = kv
        self.metrics_staleness_threshold = staleness
        self.headroom = params.headroom
        self.clock: Callable[[], float] = time.monotonic
        self._warned_at = float("-inf")

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        if not endpoints:
            return 1.0  # nothing to serve with: wait (flow control) or shed (legacy)
        now = self.clock()
        oldest = now - self.metrics_staleness_threshold
        qt = float(self.queue_depth_threshold)
        kvt = self.kv_cache_util_threshold
        total = 0.0
        fresh = 0
        for ep in endpoints:
            m = ep.metrics
            if m.update_time >= oldest:
                fresh += 1
                total += max(m.waiting_queue_size / qt, m.kv_cache_usage_percent / kvt)
        if not fresh:
            # Stale means unknown, not saturated (GIE counts it as 1.0, which turned a slow
            # scrape into 11-13 s of queueing in the field): admit, and say so.
            if now - self._warned_at > STALE_WARNING_INTERVAL:
                self._warned_at = now
                log.warning(
                    "saturation_unknown_all_metrics_stale",
                    detector=str(self.typed_name),
                    endpoints=len(endpoints),
                    staleness_threshold=self.metrics_staleness_threshold,
                )
            return 0.0
        return total / fresh

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        oldest = self.clock() - self.metrics_staleness_threshold
        q_limit = self.queue_depth_threshold * (1.0 + self.headroom)
        kv_limit = self.kv_cache_util_threshold * (1.0 + self.headroom)
        kept = [
            ep
            for ep in endpoints
            if (m := ep.metrics).update_time >= oldest
            and m.waiting_queue_size < q_limit
            and m.kv_cache_usage_percent < kv_limit
        ]
        return kept if kept else endpoints
