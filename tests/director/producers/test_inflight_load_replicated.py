"""inflight-load-producer across replicas: A's drain applied on B under origin "A", no transport."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from epp.datalayer.api import Endpoint
from epp.director.producers.inflight_load import InFlightLoadProducer
from epp.flowcontrol.detectors.concurrency import ConcurrencyDetector
from epp.plugin.replicated import Replicated
from epp.plugin.state import CycleState
from epp.testing.plugins import FakeHandle, build
from tests.director.producers.test_inflight_load import load, req, response, result
from tests.scheduling.builders import endpoint

EPS = [endpoint(i) for i in range(3)]
EP0 = EPS[0].metadata.name


def replica() -> InFlightLoadProducer:
    p: InFlightLoadProducer = build(InFlightLoadProducer, name="load")
    for ep in EPS:
        p.endpoint_added(ep)
    p.drain()  # a hub is attached: from now on changes are recorded
    return p


def route(p: InFlightLoadProducer, ep: Endpoint, size: int = 40) -> CycleState:
    state = CycleState()
    p.pre_request(state, req(size=size), result(("default", [ep])))
    return state


def finish(p: InFlightLoadProducer, state: CycleState) -> None:
    p.response_complete(state, req(), response(), None)


def sync(src: InFlightLoadProducer, origin: str, *dsts: InFlightLoadProducer) -> None:
    """One hub tick: drain ``src`` once, through msgpack, into every ``dsts``."""
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(src.drain()))
    for d in dsts:
        d.apply(origin, wire)


def test_is_replicated_with_type_slash_name() -> None:
    p = replica()
    assert isinstance(p, Replicated)
    assert p.sync_key == "inflight-load-producer/load"
    assert p.replicated


def test_peer_load_adds_to_own_and_release_propagates() -> None:
    a, b = replica(), replica()
    s1, s2 = route(a, EPS[0], 40), route(a, EPS[0], 40)
    route(b, EPS[0], 40)
    tokens = load(b, EPS[0])[1]  # one request's estimate
    assert tokens > 0
    sync(a, "A", b)
    assert load(b, EPS[0]) == (3, 3 * tokens)
    assert b.inflight_load(EPS[0]) == b.load_of(EPS[0])
    assert load(a, EPS[0]) == (2, 2 * tokens)  # A has not heard from B
    finish(a, s1)
    sync(a, "A", b)
    assert load(b, EPS[0]) == (2, 2 * tokens)
    finish(a, s2)
    sync(a, "A", b)
    assert load(b, EPS[0]) == (1, tokens)
    assert load(b, EPS[1]) == (0, 0)


def test_drain_is_only_local_changes_and_no_echo() -> None:
    a, b = replica(), replica()
    route(a, EPS[1])
    sync(a, "A", b)
    assert b.drain() == []  # what B learned from A is not B's to send
    route(b, EPS[2])
    sync(b, "B", a)
    sync(a, "A", b)  # A→B→A: A sends nothing new, B's count stays single
    assert load(a, EPS[2]) == load(b, EPS[2]) == (1, load(b, EPS[2])[1])
    assert load(a, EPS[1]) == load(b, EPS[1]) and load(a, EPS[1])[0] == 1
    assert a.drain() == [] and b.drain() == []


def test_deltas_are_idempotent() -> None:
    a, b = replica(), replica()
    route(a, EPS[0])
    batch = msgspec.msgpack.decode(msgspec.msgpack.encode(a.drain()))
    b.apply("A", batch)
    b.apply("A", batch)  # a repeated batch does not double
    assert load(b, EPS[0])[0] == 1


def test_three_replicas_sum_and_forget_removes_one_origin() -> None:
    a, b, c = replica(), replica(), replica()
    route(a, EPS[0])
    route(b, EPS[0])
    route(b, EPS[0])
    sync(a, "A", b, c)
    sync(b, "B", a, c)
    assert load(c, EPS[0])[0] == 3 and load(a, EPS[0])[0] == 3
    c.forget("B")
    assert load(c, EPS[0])[0] == 1
    c.forget("A")
    assert load(c, EPS[0]) == (0, 0)
    c.forget("nobody")  # unknown origin: nothing to drop


def test_peer_counts_reach_an_endpoint_added_later() -> None:
    a, b = replica(), build(InFlightLoadProducer)
    b.endpoint_added(EPS[0])
    extra = endpoint(7)
    a.endpoint_added(extra)
    route(a, extra)
    sync(a, "A", b)
    assert b.inflight_load(extra) is None  # B's datastore does not have it yet
    b.endpoint_added(extra)
    assert load(b, extra)[0] == 1


def test_peer_in_flight_saturates_this_replicas_concurrency_detector() -> None:
    a, b = replica(), replica()
    detector = build(ConcurrencyDetector, handle=FakeHandle([b]), maxConcurrency=2)
    for _ in range(2):
        route(a, EPS[0])
    assert detector.saturation([EPS[0]]) == 0.0  # B has sent nothing there itself
    sync(a, "A", b)
    assert detector.saturation([EPS[0]]) == 1.0
    assert detector.filter(CycleState(), req(), [EPS[0], EPS[1]]) == [EPS[1]]
    b.forget("A")
    assert detector.saturation([EPS[0]]) == 0.0


def test_snapshot_restore_round_trip() -> None:
    a, b = replica(), replica()
    route(a, EPS[0])
    route(b, EPS[1])
    route(b, EPS[1])
    sync(b, "B", a)
    snap = msgspec.msgpack.decode(msgspec.msgpack.encode(a.snapshot()))
    n = replica()
    n.restore(snap)
    assert load(n, EPS[0]) == load(a, EPS[0]) and load(n, EPS[1]) == load(a, EPS[1])
    assert n.drain() == []  # restored counts are not this replica's own
    # A's own counts came under a placeholder: A's next delta for the endpoint replaces them
    route(a, EPS[0])
    sync(a, "A", n)
    assert load(n, EPS[0])[0] == 2
    n.forget("A")
    assert load(n, EPS[0]) == (0, 0)
    assert load(n, EPS[1])[0] == 2  # B's stay, under B
    n.forget("B")
    assert load(n, EPS[1]) == (0, 0)


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"ep": 1}, id="not-a-list"),
        pytest.param([[EP0, 1]], id="short"),
        pytest.param([[0, 1, 2]], id="name-not-str"),
        pytest.param([[EP0, "1", 2]], id="count-not-int"),
        pytest.param([[EP0, -1, 2]], id="negative"),
        pytest.param([[EP0, True, 2]], id="bool"),
        pytest.param([[EP0, 1, 2], ["other", 1.5, 2]], id="second-bad"),
    ],
)
def test_malformed_delta_raises_and_leaves_state(bad: Any) -> None:
    b = replica()
    b.apply("A", [[EP0, 2, 10]])
    with pytest.raises(ValueError, match="inflight delta"):
        b.apply("A", bad)  # the first row of "second-bad" is valid: nothing of it may land
    assert load(b, EPS[0]) == (2, 10)


def test_malformed_snapshot_raises() -> None:
    n = replica()
    with pytest.raises(ValueError, match="inflight snapshot"):
        n.restore([1, 2])
    with pytest.raises(ValueError, match="inflight"):
        n.restore({"own": {"x": [1, "a"]}, "peers": {}})
    assert n.snapshot() == {"own": {}, "peers": {}}


def test_sync_cross_replica_state_false_shares_nothing() -> None:
    p: InFlightLoadProducer = build(InFlightLoadProducer, syncCrossReplicaState=False)
    p.endpoint_added(EPS[0])
    p.drain()
    route(p, EPS[0])
    assert not p.replicated
    assert p.drain() == []


def test_no_bookkeeping_before_a_hub_drains() -> None:
    p = build(InFlightLoadProducer)
    p.endpoint_added(EPS[0])
    route(p, EPS[0])
    assert p._changed is None  # no hub: nothing accumulates
    assert p.drain() == []  # first drain starts recording
    route(p, EPS[0])
    assert [d[0] for d in p.drain()] == [EPS[0].metadata.name]


def test_without_datastore_wiring_a_peers_endpoint_is_counted() -> None:
    a, b = replica(), build(InFlightLoadProducer)  # b: no endpoint observer wiring
    route(a, EPS[2])
    sync(a, "A", b)
    assert load(b, EPS[2])[0] == 1
    b.forget("A")
    assert load(b, EPS[2]) == (0, 0)


def test_every_recorded_change_tells_the_hub() -> None:
    """The hub drains on these calls alone (no poll cadence), so a change that did not call
    ``sync_dirty`` would wait for the next heartbeat tick."""
    p = replica()
    calls: list[int] = []
    p.sync_dirty = lambda: calls.append(1)
    state = route(p, EPS[0])
    assert calls == [1]
    finish(p, state)
    assert calls == [1, 1]
    assert p.drain() == [[EP0, 0, 0]]


def test_resend_repairs_a_lost_drain_with_every_count_zeros_included() -> None:
    """A peer that lost a batch sees stale counts until each key changes again; ``resend``
    makes the next drain carry every own count, so one batch repairs it (the hub's resync)."""
    a, b = replica(), replica()
    s0 = route(a, EPS[0])
    sync(a, "A", b)
    route(a, EPS[1])
    finish(a, s0)
    a.drain()  # lost in transit: b still thinks A holds one request on EPS[0], none on EPS[1]
    assert load(b, EPS[0])[0] == 1 and load(b, EPS[1])[0] == 0
    assert a.drain() == []  # nothing changed since: without a resend, b would stay wrong
    a.resend()
    sync(a, "A", b)
    assert [load(b, ep)[0] for ep in EPS] == [load(a, ep)[0] for ep in EPS] == [0, 1, 0]
    assert a.drain() == []  # marked once, sent once
