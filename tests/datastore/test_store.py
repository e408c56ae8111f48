"""Datastore: membership, cached snapshot, observers."""

from __future__ import annotations

from epp.datalayer.api import Endpoint, EndpointMetadata, Metrics
from epp.datastore.store import Datastore, Objective


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def endpoint_added(self, endpoint: Endpoint) -> None:
        self.events.append(("add", endpoint.name))

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        self.events.append(("remove", endpoint.name))


def md(name: str, port: int = 8000, address: str = "10.0.0.1") -> EndpointMetadata:
    return EndpointMetadata(name=name, address=address, port=port)


def test_snapshot_is_cached_until_membership_changes() -> None:
    """Taking the snapshot twice allocates nothing new; adding an endpoint replaces it."""
    ds = Datastore()
    ds.upsert(md("a"))
    first = ds.endpoints()
    assert ds.endpoints() is first
    ds.upsert(md("b", 8001))
    assert ds.endpoints() is not first
    assert [e.name for e in ds.endpoints()] == ["a", "b"]


def test_upsert_same_address_keeps_endpoint_and_metrics() -> None:
    """A label change keeps the Endpoint object (and its metrics); a move replaces it."""
    ds = Datastore()
    ep = ds.upsert(md("a"))
    ep.metrics = Metrics(waiting_queue_size=3)
    relabeled = EndpointMetadata(name="a", address="10.0.0.1", port=8000, labels={"x": "y"})
    assert ds.upsert(relabeled) is ep
    assert ep.metrics.waiting_queue_size == 3
    moved = ds.upsert(md("a", address="10.0.0.2"))
    assert moved is not ep
    assert moved.metrics.waiting_queue_size == 0


def test_observers_hear_adds_and_removes_in_order() -> None:
    """An observer registered late first hears about the endpoints already present."""
    ds = Datastore()
    ds.upsert(md("a"))
    rec = Recorder()
    ds.add_observer(rec)
    ds.replace_all([md("b", 8001)])
    assert rec.events == [("add", "a"), ("remove", "a"), ("add", "b")]


def test_clear_removes_endpoints_and_objectives() -> None:
    """Clearing the pool (pool deleted) drops endpoints, objectives and rewrites."""
    ds = Datastore()
    ds.upsert(md("a"))
    ds.set_objectives([Objective(name="o", priority=2)])
    ds.clear()
    assert ds.endpoints() == ()
    assert ds.objective("o") is None
