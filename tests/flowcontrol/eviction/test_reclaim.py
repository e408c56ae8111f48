"""In-flight eviction: the victim policies, the evictor and the reclamation controller
(upstream's reclamation_test.go sizing and gate vectors), and the flow controller triggering it
on a head-of-line block."""

from __future__ import annotations

import asyncio
import pathlib
from typing import cast

import pytest

from epp.admission.flow_control import FlowControlAdmission
from epp.app.build import build
from epp.app.registry import default_registry
from epp.config.load import load_config_file
from epp.datastore.store import Datastore
from epp.flowcontrol.api import Outcome
from epp.flowcontrol.eviction.policies import (
    EvictionItem,
    PriorityThenTimeEvictionOrder,
    SheddableEvictionFilter,
)
from epp.flowcontrol.eviction.reclaim import InFlightEviction, ReclamationController, RequestEvictor
from epp.plugin.base import Handle, NoParams
from epp.request import InferenceRequest
from epp.testing.flowcontrol import CeilingsByPriority
from tests.flowcontrol.helpers import make_controller, req

CORPUS = pathlib.Path(__file__).resolve().parents[2] / "config" / "corpus"
ORDER = PriorityThenTimeEvictionOrder(PriorityThenTimeEvictionOrder.TYPE, NoParams(), cast(Handle, None))
SHEDDABLE = SheddableEvictionFilter(SheddableEvictionFilter.TYPE, NoParams(), cast(Handle, None))


class Edge:
    """An ext_proc session as flow control sees it: records the eviction."""

    def __init__(self) -> None:
        self.evicted = False
        self.signalled = asyncio.Event()

    def evict(self) -> None:
        self.evicted = True
        self.signalled.set()


def running(request_id: str, priority: int) -> InferenceRequest:
    r = req(request_id, priority=priority)
    r.edge = Edge()
    return r


def edge(r: InferenceRequest) -> Edge:
    assert isinstance(r.edge, Edge)
    return r.edge


def test_sheddable_filter_and_priority_then_newest_order() -> None:
    items = [EvictionItem(req("a", priority=p), t) for p, t in ((-1, 1.0), (-5, 1.0), (-5, 2.0), (0, 3.0))]
    assert [SHEDDABLE.accept(i) for i in items] == [True, True, True, False]
    # lowest priority first; among equals the newest dispatch (least KV investment) first
    assert sorted(items, key=ORDER.key) == [items[2], items[1], items[0], items[3]]


def test_evictor_tracks_what_its_edge_can_end_and_evicts_in_order_below_the_bound() -> None:
    ev = RequestEvictor(ORDER, SHEDDABLE)
    old, new, keep = running("old", -10), running("new", -10), running("keep", 5)
    for t, r in enumerate((old, new, keep)):
        ev.track(r, float(t))
    assert ev.track(req("no-edge", priority=-10), 9.0) is None  # BUFFERED response: cannot be ended
    assert ev.stats() == (3, 2) and ev.peek_victim_priority() == -10
    assert [i.request for i in ev.evict_n(5, priority_bound=0)] == [new, old]
    assert edge(new).evicted and edge(old).evicted and not edge(keep).evicted
    assert ev.stats() == (3, 0) and ev.peek_victim_priority() is None
    confirmed: list[str] = []
    ev.set_listener(lambda item: confirmed.append(item.request.request_id))
    for r in (old, keep, old):  # the stream ends (twice: idempotent)
        assert r.on_closed is not None
        r.on_closed()
    assert confirmed == ["old"] and ev.stats() == (1, 0)


def test_victims_at_or_above_the_demand_priority_are_spared() -> None:
    ev = RequestEvictor(ORDER, SHEDDABLE)
    r = running("r", -1)
    ev.track(r, 0.0)
    assert ev.evict_n(1, priority_bound=-1) == [] and not edge(r).evicted
    assert len(ev.evict_n(1, priority_bound=0)) == 1


def test_a_closed_victim_leaves_the_queue() -> None:
    ev = RequestEvictor(ORDER, SHEDDABLE)
    r = running("r", -1)
    ev.track(r, 0.0)
    assert r.on_closed is not None
    r.on_closed()
    assert ev.stats() == (0, 0) and ev.peek_victim_priority() is None and ev.evict_n(1, 0) == []


def controller(in_flight: int, evictable: int) -> tuple[ReclamationController, list[InferenceRequest]]:
    ev = RequestEvictor(ORDER, SHEDDABLE)
    rs = [running(f"r{i}", -1 if i < evictable else 1) for i in range(in_flight)]
    for i, r in enumerate(rs):
        ev.track(r, float(i))
    return ReclamationController(ev, grace=0.5), rs


@pytest.mark.parametrize(
    ("in_flight", "evictable", "saturation", "ceiling", "evicted"),
    [
        (6, 6, 1.2, 1.0, 1),  # credit 0.2, deficit 0.2
        (4, 4, 2.0, 1.0, 2),  # credit 0.5, deficit 1.0: capped by 2 a decision
        (4, 1, 2.0, 1.0, 1),  # capped by what is evictable
        (6, 6, 0.9, 1.0, 0),  # no deficit
        (10, 10, 1.0, 1.0, 1),  # the exact boundary still evicts one (or the band deadlocks)
        (0, 0, 1.5, 1.0, 0),  # nothing in flight
    ],
)
def test_sizing(in_flight: int, evictable: int, saturation: float, ceiling: float, evicted: int) -> None:
    rc, rs = controller(in_flight, evictable)
    assert rc.reclaim(saturation, ceiling, demand_priority=10, now=0.0) == evicted
    assert sum(edge(r).evicted for r in rs) == evicted


def test_gate_waits_for_every_confirmation_then_the_grace() -> None:
    rc, rs = controller(4, 4)
    assert rc.gate_open(0.0)
    assert rc.reclaim(2.0, 1.0, 10, now=0.0) == 2
    assert not rc.gate_open(0.0)
    victims = [r for r in rs if edge(r).evicted]
    victim_items = list(rc._outstanding)
    rc.confirm(victim_items[0], 0.1)
    assert not rc.gate_open(0.1)
    rc.confirm(victim_items[1], 0.2)
    assert not rc.gate_open(0.2 + 0.4)  # within the grace
    assert rc.gate_open(0.2 + 0.5 + 0.001)
    assert len(victims) == 2
    # a repeat decision on the same stale signal, had it bypassed the gate, is covered by the debit
    rc2, _ = controller(4, 4)
    rc2.reclaim(2.0, 1.0, 10, 0.0)
    assert rc2.reclaim(2.0, 1.0, 10, 0.0) == 0


def test_an_unconfirmed_revocation_times_out_then_cools() -> None:
    rc, _ = controller(1, 1)
    rc.reclaim(1.0, 1.0, 10, now=0.0)
    assert not rc.gate_open(10.001)  # retired by the 10 s timeout, now cooling
    assert rc.gate_open(10.001 + 0.5)


async def test_a_blocked_high_priority_request_evicts_a_sheddable_one_in_flight() -> None:
    """The flow controller end to end: a sheddable request in flight holds the pool at its
    ceiling; a priority-10 request arrives and waits; the dispatch cycle's head-of-line block
    evicts the sheddable one; when its stream ends the pool frees and the waiting one goes."""
    in_flight: list[InferenceRequest] = []
    eviction = InFlightEviction(ORDER, SHEDDABLE, grace=0.0, clock=asyncio.get_running_loop().time)
    fc, detector = make_controller(
        usage=CeilingsByPriority({10: 1.0, -10: 1.0}), eviction=eviction, tick=0.001
    )
    detector.fn = lambda: float(len(in_flight))  # one request fills the pool (maxConcurrency 1)
    async with fc:
        batch = running("batch", -10)
        assert await fc.enqueue_and_wait(batch, 1) is Outcome.DISPATCHED
        fc.placed(batch, scheduled=True)
        in_flight.append(batch)
        realtime = running("realtime", 10)
        waiting = asyncio.create_task(fc.enqueue_and_wait(realtime, 1))
        await asyncio.wait_for(edge(batch).signalled.wait(), 5)  # the dispatcher runs on its own task
        assert not waiting.done()  # the evicted request still holds the pool until its stream ends
        in_flight.remove(batch)
        assert batch.on_closed is not None
        batch.on_closed()
        fc.notify()
        assert await asyncio.wait_for(waiting, 5) is Outcome.DISPATCHED
        assert fc.debug_state()["eviction"] == {"inFlight": 0, "evictable": 0, "evicted": 1}


async def test_no_eviction_for_same_priority_demand_or_without_queued_demand() -> None:
    eviction = InFlightEviction(ORDER, SHEDDABLE, grace=0.0, clock=asyncio.get_running_loop().time)
    fc, detector = make_controller(usage=CeilingsByPriority({-1: 1.0}), eviction=eviction)
    detector.value = 1.0
    batch = running("batch", -1)
    fc.placed(batch, scheduled=True)
    async with fc:
        other = asyncio.create_task(fc.enqueue_and_wait(running("peer", -1), 1))
        for _ in range(20):
            fc.dispatch_cycle()
        assert not edge(batch).evicted  # same band: no churn
        other.cancel()


def test_the_guide_config_with_enable_eviction_builds_a_controller_that_evicts() -> None:
    """llm-d's batch flow-control guide (enableEviction: true, concurrency detector) loads; its
    controller carries the evictor, and one without the flag does not."""
    guide = CORPUS / "llmd-guides--batch-flow-control.yaml"
    holdback = CORPUS / "llmd-guides--batch-flow-control-holdback.yaml"
    states = []
    for path in (guide, holdback):
        components = build(load_config_file(path), default_registry())
        admission = components.admission.controller(Datastore())
        assert isinstance(admission, FlowControlAdmission)
        states.append(admission.debug_state())
    assert states[0]["eviction"] == {"inFlight": 0, "evictable": 0, "evicted": 0}
    assert "eviction" not in states[1]


def test_a_stream_ended_inside_the_eviction_confirms_it() -> None:
    """The h2 transport writes the eviction reply at once, so the stream may end (and confirm)
    before the decision returns: the revocation must already be outstanding then."""
    ev = RequestEvictor(ORDER, SHEDDABLE)
    rc = ReclamationController(ev, grace=0.5)
    ev.set_listener(lambda item: rc.confirm(item, 0.0))

    class ClosingEdge(Edge):
        def __init__(self, request: InferenceRequest) -> None:
            super().__init__()
            self.request = request

        def evict(self) -> None:
            super().evict()
            assert self.request.on_closed is not None
            self.request.on_closed()  # the session closed within the write

    r = req("r", priority=-1)
    r.edge = ClosingEdge(r)
    ev.track(r, 0.0)
    assert rc.reclaim(1.0, 1.0, 10, now=0.0) == 1
    assert not rc.gate_open(0.4) and rc.gate_open(0.5)  # confirmed: the grace, not the 10 s timeout
