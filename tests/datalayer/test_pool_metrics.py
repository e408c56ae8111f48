"""inference_pool_* gauges: fresh-only averages, ready count, per-pod queue collector, lifecycle."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from structlog.testing import capture_logs

from epp.datalayer.api import EndpointMetadata, Metrics
from epp.datalayer.pool_metrics import PoolMetrics, pod_label
from epp.datalayer.runtime import DataLayerRuntime
from epp.datastore.store import Datastore, PoolInfo
from epp.metrics import series
from epp.testing.waiting import until
from tests.datalayer.test_runtime import scraping

NOW = 1000.0
POOL = "pool-under-test"


def gauge(metric: Any, pool: str = POOL) -> float | None:
    return series.REGISTRY.get_sample_value(metric.name, {"name": pool})


@pytest.fixture
def pool_ds() -> Iterator[Datastore]:
    ds = Datastore()
    ds.pool = PoolInfo(name=POOL)
    yield ds
    for metric in (
        series.POOL_READY_PODS,
        series.POOL_AVG_KV_CACHE,
        series.POOL_AVG_QUEUE,
        series.POOL_AVG_RUNNING,
    ):
        if gauge(metric) is not None:
            metric.remove(POOL)


def add(ds: Datastore, name: str, age: float | None, queue: int, running: int = 0, kv: float = 0.0) -> None:
    ep = ds.upsert(EndpointMetadata(name=name, address="10.0.0.1", port=8000))
    update = 0.0 if age is None else NOW - age
    ep.metrics = Metrics(
        waiting_queue_size=queue, running_requests_size=running, kv_cache_usage_percent=kv, update_time=update
    )


@pytest.mark.parametrize(
    ("endpoints", "ready", "averages"),
    [
        pytest.param([("a", 0.5, 2, 4, 0.2), ("b", 1.0, 4, 8, 0.6)], 2, (0.4, 3.0, 6.0), id="all-fresh"),
        pytest.param(
            [("a", 0.5, 2, 4, 0.2), ("b", 2.5, 40, 80, 0.9)], 1, (0.2, 2.0, 4.0), id="stale-excluded"
        ),
        pytest.param([("a", 2.0, 1, 1, 0.1)], 1, (0.1, 1.0, 1.0), id="threshold-inclusive"),
        pytest.param([("a", None, 5, 5, 0.5)], 0, None, id="never-scraped-is-stale"),
        pytest.param([("a", 0.1, 1, 0, 0.0), ("b", 0.1, 2, 0, 0.0)], 2, (0.0, 1.5, 0.0), id="float-average"),
    ],
)
def test_refresh(
    pool_ds: Datastore,
    endpoints: list[tuple[str, float | None, int, int, float]],
    ready: int,
    averages: tuple[float, float, float] | None,
) -> None:
    """Ready = endpoints with metrics at most 2 s old; averages over those only (not set if none)."""
    for name, age, queue, running, kv in endpoints:
        add(pool_ds, name, age, queue, running, kv)
    PoolMetrics(pool_ds, staleness_threshold=2.0, clock=lambda: NOW).refresh()
    assert gauge(series.POOL_READY_PODS) == ready
    got = (gauge(series.POOL_AVG_KV_CACHE), gauge(series.POOL_AVG_QUEUE), gauge(series.POOL_AVG_RUNNING))
    if averages is None:
        assert got == (None, None, None)
    else:
        assert got == pytest.approx(averages)


def test_no_pool_records_nothing() -> None:
    """Before the pool is known nothing is recorded (GIE skips the refresh)."""
    ds = Datastore()
    add(ds, "a", 0.1, 3)
    PoolMetrics(ds, clock=lambda: NOW).refresh()
    assert series.REGISTRY.get_sample_value("inference_pool_ready_pods", {"name": ""}) is None


async def test_per_pod_collector_registers_and_unregisters(pool_ds: Datastore) -> None:
    """The per-pod queue gauge lists every endpoint (stale ones too) by pod-rank name, then goes away."""
    registry = CollectorRegistry()
    add(pool_ds, "ns/vllm-0-rank-0", 0.1, 3)
    add(pool_ds, "ns/vllm-1-rank-1", None, 7)
    for _ in range(2):  # can be created and disposed repeatedly
        async with PoolMetrics(pool_ds, registry=registry, interval=3600):
            text = generate_latest(registry).decode()
        assert "inference_pool_per_pod_queue_size" not in generate_latest(registry).decode()
    assert "# HELP inference_pool_per_pod_queue_size [ALPHA] The total number" in text
    assert f'inference_pool_per_pod_queue_size{{model_server_pod="vllm-0-rank-0",name="{POOL}"}} 3.0' in text
    assert f'inference_pool_per_pod_queue_size{{model_server_pod="vllm-1-rank-1",name="{POOL}"}} 7.0' in text


async def test_per_pod_collector_empty_without_pool_or_endpoints() -> None:
    """No pool or no endpoints: the per-pod family is absent."""
    registry = CollectorRegistry()
    ds = Datastore()
    async with PoolMetrics(ds, registry=registry, interval=3600):
        assert "inference_pool_per_pod_queue_size{" not in generate_latest(registry).decode()
        ds.pool = PoolInfo(name=POOL)
        assert "inference_pool_per_pod_queue_size{" not in generate_latest(registry).decode()


async def test_refresh_loop_and_staleness_end_to_end(
    pool_ds: Datastore, servers: Callable[[int], Any]
) -> None:
    """Live scraping feeds the gauges; a broken server's endpoint never counts as ready."""
    good, bad = await servers(2)
    bad.behaviour.status = 500
    async with DataLayerRuntime(pool_ds, scraping(), refresh_interval=0.02) as runtime:
        good_ep = pool_ds.upsert(EndpointMetadata(name="good", address="127.0.0.1", port=good.port))
        bad_ep = pool_ds.upsert(EndpointMetadata(name="bad", address="127.0.0.1", port=bad.port))
        await until(lambda: good_ep.metrics.update_time > 0)
        await until(lambda: (s := runtime.stats(bad_ep)) is not None and s.failures > 0)
        async with PoolMetrics(pool_ds, registry=CollectorRegistry(), interval=0.01, staleness_threshold=2.0):
            await until(lambda: gauge(series.POOL_READY_PODS) == 1)
            await until(lambda: gauge(series.POOL_AVG_QUEUE) == 3.0)
    assert gauge(series.POOL_AVG_RUNNING) == 7.0
    assert gauge(series.POOL_AVG_KV_CACHE) == pytest.approx(0.4217)


@pytest.mark.parametrize(
    ("name", "label"),
    [
        pytest.param("ns/pod-rank-0", "pod-rank-0", id="namespaced"),
        pytest.param("plain", "plain", id="plain"),
    ],
)
def test_pod_label(name: str, label: str) -> None:
    """model_server_pod is the endpoint's name without the namespace."""
    assert pod_label(name) == label


@pytest.mark.parametrize(
    ("threshold", "scrape", "warned"),
    [
        pytest.param(2.0, 0.05, False, id="default"),
        pytest.param(0.2, 15.0, True, id="threshold-below-scrape"),
        pytest.param(2.0, None, False, id="unknown-scrape"),
    ],
)
def test_threshold_sanity_warning(threshold: float, scrape: float | None, warned: bool) -> None:
    """A staleness threshold under two scrape intervals is called out at startup."""
    with capture_logs() as logs:
        PoolMetrics(Datastore(), staleness_threshold=threshold, scrape_interval=scrape)
    assert any(e["event"] == "staleness_threshold_below_scrape_interval" for e in logs) is warned
