"""Merging the workers' /metrics (epp.workers.aggregate): counters and histograms summed, gauges by policy."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epp.workers.aggregate import aggregate, gauge_policy


def _values(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(body.decode())
        for s in fam.samples
    }


def _worker(requests: dict[str, int], latencies: list[float], running: int, kv: float) -> bytes:
    """One worker's exposition, made by prometheus_client as the EPP makes it."""
    reg = CollectorRegistry()
    total = Counter("inference_objective_request", "requests", ["model_name"], registry=reg)
    for model, n in requests.items():
        total.labels(model).inc(n)
    hist = Histogram("request_duration_seconds", "latency", buckets=(0.1, 1.0), registry=reg)
    for v in latencies:
        hist.observe(v)
    Gauge("inference_objective_running_requests", "running", registry=reg).set(running)
    Gauge("inference_pool_average_kv_cache_utilization", "kv", registry=reg).set(kv)
    return generate_latest(reg)


def test_counters_sum_and_label_sets_that_differ_are_kept() -> None:
    merged = _values(aggregate([_worker({"a": 2, "b": 1}, [], 0, 0), _worker({"a": 3, "c": 5}, [], 0, 0)]))
    assert merged[("inference_objective_request_total", (("model_name", "a"),))] == 5
    assert merged[("inference_objective_request_total", (("model_name", "b"),))] == 1  # only worker 0 saw b
    assert merged[("inference_objective_request_total", (("model_name", "c"),))] == 5  # only worker 1 saw c


def test_histograms_sum_bucket_by_bucket() -> None:
    merged = _values(aggregate([_worker({}, [0.05, 0.5], 0, 0), _worker({}, [0.5, 5.0, 0.01], 0, 0)]))
    assert merged[("request_duration_seconds_bucket", (("le", "0.1"),))] == 2
    assert merged[("request_duration_seconds_bucket", (("le", "1.0"),))] == 4
    assert merged[("request_duration_seconds_bucket", (("le", "+Inf"),))] == 5
    assert merged[("request_duration_seconds_count", ())] == 5
    assert abs(merged[("request_duration_seconds_sum", ())] - 6.06) < 1e-9


def test_gauges_sum_shares_and_take_the_max_of_copies() -> None:
    merged = _values(aggregate([_worker({}, [], 3, 0.4), _worker({}, [], 4, 0.5)]))
    assert merged[("inference_objective_running_requests", ())] == 7  # each worker's own in-flight
    # every worker scrapes the same pool: a copy of one value, not a share of it
    assert merged[("inference_pool_average_kv_cache_utilization", ())] == 0.5


def test_gauge_policy_per_family() -> None:
    assert gauge_policy("inference_objective_running_requests") == "sum"
    assert gauge_policy("inference_extension_flow_control_queue_size") == "sum"
    assert gauge_policy("inference_extension_prefix_indexer_size") == "sum"
    assert gauge_policy("llm_d_epp_prefix_indexer_size") == "sum"  # the twin merges as GIE's name
    assert gauge_policy("inference_pool_ready_pods") == "max"
    assert gauge_policy("llm_d_epp_per_endpoint_queue_size") == "max"  # a model server's queue: a copy
    assert gauge_policy("inference_extension_info") == "max"


def test_series_labelled_by_worker_pass_through() -> None:
    w0 = b'# TYPE s_total counter\ns_total{worker="0"} 3.0\n'
    w1 = b'# TYPE s_total counter\ns_total{worker="1"} 4.0\n'
    merged = _values(aggregate([w0, w1]))
    assert merged[("s_total", (("worker", "0"),))] == 3
    assert merged[("s_total", (("worker", "1"),))] == 4


def test_what_every_worker_observes_of_one_engine_is_counted_once() -> None:
    w0 = b'# TYPE epp_kv_events_gaps_total counter\nepp_kv_events_gaps_total{endpoint="e"} 1.0\n'
    w1 = b'# TYPE epp_kv_events_gaps_total counter\nepp_kv_events_gaps_total{endpoint="e"} 1.0\n'
    assert _values(aggregate([w0, w1]))[("epp_kv_events_gaps_total", (("endpoint", "e"),))] == 1


def test_created_takes_the_earliest() -> None:
    w0 = b"# TYPE c_total counter\nc_total 1.0\nc_created 200.0\n"
    w1 = b"# TYPE c_total counter\nc_total 1.0\nc_created 100.0\n"
    assert _values(aggregate([w0, w1]))[("c_created", ())] == 100


def test_one_worker_is_its_own_aggregate() -> None:
    body = _worker({"a": 2}, [0.5], 1, 0.3)
    assert _values(aggregate([body])) == _values(body)


def _index(size: int) -> bytes:
    reg = CollectorRegistry()
    Gauge("inference_extension_prefix_indexer_size", "size", registry=reg).set(size)
    Gauge("llm_d_epp_prefix_indexer_size", "size", registry=reg).set(size)
    Gauge("inference_objective_running_requests", "running", registry=reg).set(size // 100)
    return generate_latest(reg)


def test_synced_workers_prefix_indexes_are_copies_and_unsynced_ones_shares() -> None:
    bodies = [_index(1200), _index(1180)]
    shares = _values(aggregate(bodies))
    assert shares[("inference_extension_prefix_indexer_size", ())] == 2380  # each built its own
    assert shares[("llm_d_epp_prefix_indexer_size", ())] == 2380
    copies = _values(aggregate(bodies, synced=True))
    # each worker also inserted its sibling's chains: one index, held twice
    assert copies[("inference_extension_prefix_indexer_size", ())] == 1200
    assert copies[("llm_d_epp_prefix_indexer_size", ())] == 1200
    # in-flight work stays each worker's own, synced or not
    assert copies[("inference_objective_running_requests", ())] == 23
    assert gauge_policy("inference_extension_prefix_indexer_size", synced=True) == "max"
    assert gauge_policy("inference_objective_running_requests", synced=True) == "sum"
