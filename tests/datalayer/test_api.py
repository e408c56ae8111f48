"""The data layer's additions to its api module: staleness helpers and event types."""

from __future__ import annotations

import gc

import pytest

from epp.datalayer.api import Endpoint, EndpointMetadata, GroupVersionKind, Metrics, is_stale


@pytest.mark.parametrize(
    ("update_time", "now", "threshold", "stale"),
    [
        pytest.param(0.0, 5.0, 10.0, True, id="never-updated"),
        pytest.param(100.0, 101.0, 2.0, False, id="fresh"),
        pytest.param(100.0, 102.0, 2.0, False, id="at-threshold-is-fresh"),
        pytest.param(100.0, 102.001, 2.0, True, id="past-threshold"),
    ],
)
def test_is_stale(update_time: float, now: float, threshold: float, stale: bool) -> None:
    """Stale = never extracted, or older than the threshold (GIE's ``now - UpdateTime > threshold``)."""
    assert is_stale(Metrics(update_time=update_time), now, threshold) is stale


def _ep(name: str, update_time: float) -> Endpoint:
    return Endpoint(EndpointMetadata(name=name, address="10.0.0.1", port=1), Metrics(update_time=update_time))


def test_gvk_string() -> None:
    """GVKs print like Go's GroupVersionKind.String()."""
    assert str(GroupVersionKind("apps", "v1", "Deployment")) == "apps/v1, Kind=Deployment"


class _Recorder:
    """A metrics listener that records the readings it was told of."""

    def __init__(self) -> None:
        self.heard: list[Metrics] = []

    def metrics_stored(self, endpoint: Endpoint) -> None:
        self.heard.append(endpoint.metrics)


def test_metrics_listeners_hear_every_stored_reading_once() -> None:
    """Every assignment to ``metrics`` (however it is written) reaches each listener once, in order."""
    ep = _ep("e0", 1.0)
    rec = _Recorder()
    ep.add_metrics_listener(rec)
    ep.add_metrics_listener(rec)  # idempotent
    first, second = Metrics(waiting_queue_size=1), Metrics(waiting_queue_size=2)
    ep.metrics = first
    setattr(ep, "metrics", second)  # noqa: B010  # the hook is the assignment, not a setter
    ep.health = ep.health  # other attributes tell nobody
    assert rec.heard == [first, second]
    assert rec.heard[0] is first
    ep.remove_metrics_listener(rec)
    ep.metrics = Metrics()
    assert len(rec.heard) == 2


def test_metrics_listeners_are_held_weakly() -> None:
    """A listener nobody else holds (a replaced scheduler profile) is dropped, not kept alive."""
    ep = _ep("e0", 1.0)
    kept, gone = _Recorder(), _Recorder()
    ep.add_metrics_listener(gone)
    ep.add_metrics_listener(kept)
    del gone
    gc.collect()
    ep.metrics = Metrics(waiting_queue_size=5)
    assert [m.waiting_queue_size for m in kept.heard] == [5]
    assert len(ep._listeners) == 1  # the dead reference was pruned
