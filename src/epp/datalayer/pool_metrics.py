"""The ``inference_pool_*`` gauges: pool averages over fresh endpoints, and the per-pod queue collector."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Final, Protocol

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

from epp.datalayer.api import Endpoint, is_stale
from epp.metrics import series

log = structlog.get_logger(__name__)

DEFAULT_REFRESH_INTERVAL: Final = 5.0  # --refresh-prometheus-metrics-interval
DEFAULT_STALENESS_THRESHOLD: Final = 2.0  # --metrics-staleness-threshold
PER_POD_QUEUE_NAME: Final = "inference_pool_per_pod_queue_size"
PER_POD_QUEUE_HELP: Final = (
    "[ALPHA] The total number of requests pending in the model server queue for each underlying pod."
)


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class PoolView(Protocol):
    """What the gauges need of the datastore (which sits above this layer): the pool and its endpoints."""

    @property
    def pool(self) -> _Named | None: ...

    def endpoints(self) -> Sequence[Endpoint]: ...


def pod_label(endpoint_name: str) -> str:
    """``<pod>-rank-<i>`` from ``<namespace>/<pod>-rank-<i>``: GIE labels by the name part only."""
    return endpoint_name.rpartition("/")[2]


class PerPodQueueCollector:
    """``inference_pool_per_pod_queue_size{name, model_server_pod}``, read from every endpoint at scrape time.

    Like GIE's custom collector it includes stale endpoints (their last known queue) and
    emits nothing while there is no pool or no endpoint.
    """

    def __init__(self, datastore: PoolView) -> None:
        self._datastore = datastore

    def describe(self) -> list[Metric]:
        return [
            GaugeMetricFamily(PER_POD_QUEUE_NAME, PER_POD_QUEUE_HELP, labels=("name", "model_server_pod"))
        ]

    def collect(self) -> Iterator[Metric]:
        pool = self._datastore.pool
        endpoints = self._datastore.endpoints()
        if pool is None or not endpoints:
            return
        family = GaugeMetricFamily(
            PER_POD_QUEUE_NAME, PER_POD_QUEUE_HELP, labels=("name", "model_server_pod")
        )
        for ep in endpoints:
            family.add_metric((pool.name, pod_label(ep.name)), float(ep.metrics.waiting_queue_size))
        yield family


class PoolMetrics:
    """Refreshes the pool gauges every ``interval`` and owns the per-pod queue collector.

    An async context manager: entering registers the collector on ``registry`` and starts
    the refresh task; exiting cancels the task and unregisters the collector, so tests can
    create and dispose one freely (one at a time per registry).

    Every refresh: endpoints whose metrics are at most ``staleness_threshold`` old are
    ready; ``inference_pool_ready_pods{name}`` = their count (0 included) and, when there
    is at least one, ``inference_pool_average_{kv_cache_utilization,queue_size,
    running_requests}{name}`` = their means.  No pool yet: nothing is recorded.  Given the
    scrape interval, a staleness threshold under two intervals is warned about at startup.
    """

    def __init__(
        self,
        datastore: PoolView,
        *,
        interval: float = DEFAULT_REFRESH_INTERVAL,
        staleness_threshold: float = DEFAULT_STALENESS_THRESHOLD,
        registry: CollectorRegistry = series.REGISTRY,
        clock: Callable[[], float] = time.monotonic,
        scrape_interval: float | None = None,
    ) -> None:
        self._datastore = datastore
        self._interval = interval if interval > 0 else DEFAULT_REFRESH_INTERVAL
        self._threshold = staleness_threshold
        self._registry = registry
        self._clock = clock
        self._collector = PerPodQueueCollector(datastore)
        self._task: asyncio.Task[None] | None = None
        if scrape_interval and staleness_threshold < 2 * scrape_interval:
            # The mismatch behind 11-13 s latencies in the field (users §1 #10): say so at startup.
            log.warning(
                "staleness_threshold_below_scrape_interval",
                staleness_threshold=staleness_threshold,
                scrape_interval=scrape_interval,
                effect="endpoints will flap between fresh and stale; raise --metrics-staleness-threshold",
            )

    def refresh(self) -> None:
        """Recompute the pool gauges once (the loop calls this every interval)."""
        pool = self._datastore.pool
        if pool is None:
            log.debug("pool_metrics_skipped", reason="pool is not initialized")
            return
        now = self._clock()
        threshold = self._threshold
        count = 0
        kv = 0.0
        queue = 0
        running = 0
        for ep in self._datastore.endpoints():
            m = ep.metrics
            if is_stale(m, now, threshold):
                continue
            count += 1
            kv += m.kv_cache_usage_percent
            queue += m.waiting_queue_size
            running += m.running_requests_size
        name = pool.name
        series.POOL_READY_PODS.labels(name).set(count)
        if count:
            series.POOL_AVG_KV_CACHE.labels(name).set(kv / count)
            series.POOL_AVG_QUEUE.labels(name).set(queue / count)
            series.POOL_AVG_RUNNING.labels(name).set(running / count)

    async def __aenter__(self) -> PoolMetrics:
        self._registry.register(self._collector)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="datalayer:pool-metrics")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._registry.unregister(self._collector)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                self.refresh()
            except Exception as e:  # a gauge bug must not end the loop
                log.exception("pool_metrics_refresh_failed", error=str(e))
