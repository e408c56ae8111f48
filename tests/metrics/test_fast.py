"""The lock-free metric classes export exactly what prometheus_client's would."""

from __future__ import annotations

import prometheus_client as pc
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from epp.metrics import fast


def test_histogram_buckets_are_le_and_cumulative() -> None:
    """A value on a bound counts in that bucket (le); buckets are cumulative; sum and count add up."""
    reg = CollectorRegistry()
    h = fast.Histogram("h_seconds", "help", ("a",), buckets=(0.1, 1.0), registry=reg)
    for v in (0.05, 0.1, 0.5, 1.0, 7.0):
        h.labels("x").observe(v)
    get = reg.get_sample_value
    assert get("h_seconds_bucket", {"a": "x", "le": "0.1"}) == 2
    assert get("h_seconds_bucket", {"a": "x", "le": "1.0"}) == 4
    assert get("h_seconds_bucket", {"a": "x", "le": "+Inf"}) == 5
    assert get("h_seconds_count", {"a": "x"}) == 5
    assert get("h_seconds_sum", {"a": "x"}) == pytest.approx(8.65)


def test_exposition_matches_prometheus_client() -> None:
    """Same observations, same text (prometheus_client's _created samples aside)."""
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    a = fast.Histogram("lat_seconds", "Latency.", ("m",), buckets=(0.005, 0.5, 2), registry=ours)
    b = pc.Histogram("lat_seconds", "Latency.", ("m",), buckets=(0.005, 0.5, 2), registry=theirs)
    c1 = fast.Counter("reqs", "Requests.", ("m", "p"), registry=ours)
    c2 = pc.Counter("reqs", "Requests.", ("m", "p"), registry=theirs)
    g1 = fast.Gauge("running", "Running.", ("m",), registry=ours)
    g2 = pc.Gauge("running", "Running.", ("m",), registry=theirs)
    for v in (0.001, 0.3, 0.3, 9.0):
        a.labels("m1").observe(v)
        b.labels("m1").observe(v)
    c1.labels("m1", 2).inc(3)  # non-string label values are exported as strings, as upstream does
    c2.labels("m1", 2).inc(3)
    g1.labels("m1").inc()
    g1.labels("m1").dec(3)
    g2.labels("m1").inc()
    g2.labels("m1").dec(3)
    strip = lambda text: sorted(ln for ln in text.decode().splitlines() if "_created" not in ln)  # noqa: E731
    assert strip(generate_latest(ours)) == strip(generate_latest(theirs))


def test_labels_by_name_remove_and_errors() -> None:
    """Keyword labels equal positional ones; remove drops a series and its aliases; misuse raises."""
    reg = CollectorRegistry()
    c = fast.Counter("c", "h", ("x", "y"), registry=reg)
    c.labels(x=1, y="b").inc()
    c.labels("1", "b").inc()
    assert reg.get_sample_value("c_total", {"x": "1", "y": "b"}) == 2
    c.remove(1, "b")
    assert reg.get_sample_value("c_total", {"x": "1", "y": "b"}) is None
    c.labels(1, "b").inc()  # a fresh child after removal, not the stale alias
    assert reg.get_sample_value("c_total", {"x": "1", "y": "b"}) == 1
    with pytest.raises(ValueError, match="expected 2 label values"):
        c.labels("only-one")
    with pytest.raises(ValueError, match="non-negative"):
        c.labels("1", "b").inc(-1)


def test_unlabelled_metrics() -> None:
    """Metrics without labels take updates directly."""
    reg = CollectorRegistry()
    g = fast.Gauge("size", "h", registry=reg)
    g.set(42)
    h = fast.Histogram("d", "h", buckets=(1,), registry=reg)
    h.observe(0.5)
    assert reg.get_sample_value("size") == 42
    assert reg.get_sample_value("d_count") == 1
