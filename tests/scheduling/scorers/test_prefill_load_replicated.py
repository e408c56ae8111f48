"""prefill-load-scorer across replicas: A's drain applied on B under origin "A", no transport."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from epp.plugin.replicated import Replicated
from epp.plugin.state import CycleState
from epp.request import ResponseInfo
from epp.scheduling.scorers.prefill_load import PrefillLoadScorer
from epp.testing.plugins import build
from tests.scheduling.scorers.test_prefill_load import EPS, request, routed, state_with

EP0 = EPS[0].name


def replica() -> PrefillLoadScorer:
    s: PrefillLoadScorer = build(PrefillLoadScorer, name="prefill")
    s.drain()  # a hub is attached: from now on changes are recorded
    return s


def route(s: PrefillLoadScorer, target: int, prompt: int = 1000) -> CycleState:
    return routed(s, CycleState(), prompt, target)


def first_byte(s: PrefillLoadScorer, st: CycleState) -> None:
    s.response_body(st, request(1), ResponseInfo(request_id="r"), b"data: x", EPS[0])


def sync(src: PrefillLoadScorer, origin: str, *dsts: PrefillLoadScorer) -> None:
    """One hub tick: drain ``src`` once, through msgpack, into every ``dsts``."""
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(src.drain()))
    for d in dsts:
        d.apply(origin, wire)


def test_is_replicated_with_type_slash_name() -> None:
    s = replica()
    assert isinstance(s, Replicated)
    assert s.sync_key == "prefill-load-scorer/prefill"


def test_a_peers_backlog_steers_this_replicas_score() -> None:
    """Without sharing, B sees endpoint 0 idle and sends it the next prompt too: the herd the
    4-replica bench measured.  With A's backlog applied, B prefers an idle endpoint."""
    a, b = replica(), replica()
    busy = route(a, 0, 3000)
    assert b.score(state_with({}), request(1000), EPS) == pytest.approx([1.0, 1.0, 1.0])
    sync(a, "A", b)
    assert b.backlog(EPS[0]) == 3000
    assert b.score(state_with({}), request(1000), EPS) == pytest.approx([0.0, 1.0, 1.0])
    assert b.debug_state() == {"backlog": {EP0: 3000}, "own": {}, "peers": {"A": {EP0: 3000}}}
    first_byte(a, busy)  # A's prefill is done: B hears the release
    sync(a, "A", b)
    assert b.backlog(EPS[0]) == 0


def test_drain_is_only_local_changes_and_no_echo() -> None:
    a, b = replica(), replica()
    route(a, 1, 500)
    sync(a, "A", b)
    assert b.drain() == []  # what B learned from A is not B's to send
    route(b, 1, 700)
    sync(b, "B", a)
    sync(a, "A", b)
    assert a.backlog(EPS[1]) == b.backlog(EPS[1]) == 1200
    assert a.drain() == [] and b.drain() == []


def test_deltas_are_absolute_so_repeats_do_not_double() -> None:
    a, b = replica(), replica()
    route(a, 0, 400)
    batch = msgspec.msgpack.decode(msgspec.msgpack.encode(a.drain()))
    b.apply("A", batch)
    b.apply("A", batch)
    assert b.backlog(EPS[0]) == 400


def test_forget_drops_only_that_origin() -> None:
    a, b, c = replica(), replica(), replica()
    route(a, 0, 100)
    route(b, 0, 200)
    route(c, 0, 400)
    sync(a, "A", c)
    sync(b, "B", c)
    assert c.backlog(EPS[0]) == 700
    c.forget("B")
    assert c.backlog(EPS[0]) == 500
    c.forget("A")
    assert c.backlog(EPS[0]) == 400  # its own stays
    c.forget("nobody")


def test_removed_endpoint_drops_peer_backlog_too() -> None:
    a, b = replica(), replica()
    route(a, 2, 300)
    sync(a, "A", b)
    b.endpoint_removed(EPS[2])
    assert b.backlog(EPS[2]) == 0
    b.forget("A")  # nothing left to subtract: never negative
    assert b.backlog(EPS[2]) == 0


def test_snapshot_restore_round_trip() -> None:
    a, b = replica(), replica()
    route(a, 0, 100)
    route(b, 1, 200)
    sync(b, "B", a)
    snap = msgspec.msgpack.decode(msgspec.msgpack.encode(a.snapshot()))
    n = replica()
    n.restore(snap)
    assert [n.backlog(e) for e in EPS] == [100, 200, 0]
    assert n.drain() == []  # restored backlog is not this replica's own
    route(a, 0, 50)  # A's own came under a placeholder: A's next delta replaces it
    sync(a, "A", n)
    assert n.backlog(EPS[0]) == 150
    n.forget("A")
    assert n.backlog(EPS[0]) == 0
    assert n.backlog(EPS[1]) == 200  # B's stays, under B


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"ep": 1}, id="not-a-list"),
        pytest.param([[EP0]], id="short"),
        pytest.param([[0, 1]], id="name-not-str"),
        pytest.param([[EP0, "1"]], id="tokens-not-int"),
        pytest.param([[EP0, -1]], id="negative"),
        pytest.param([[EP0, True]], id="bool"),
        pytest.param([[EP0, 5], ["other", 1.5]], id="second-bad"),
    ],
)
def test_malformed_delta_raises_and_leaves_state(bad: Any) -> None:
    b = replica()
    b.apply("A", [[EP0, 10]])
    with pytest.raises(ValueError, match="prefill-load deltas"):
        b.apply("A", bad)  # the first row of "second-bad" is valid: nothing of it may land
    assert b.backlog(EPS[0]) == 10


def test_malformed_snapshot_raises_and_leaves_state() -> None:
    n = replica()
    with pytest.raises(ValueError, match="prefill-load snapshot"):
        n.restore([1, 2])
    with pytest.raises(ValueError, match="prefill-load snapshot"):
        n.restore({"own": {EP0: 5}, "peers": {"A": {EP0: "x"}}})
    assert n.snapshot() == {"own": {}, "peers": {}}
    assert n.backlog(EPS[0]) == 0


def test_no_bookkeeping_before_a_hub_drains() -> None:
    s: PrefillLoadScorer = build(PrefillLoadScorer)
    route(s, 0)
    assert s._changed is None  # no hub: nothing accumulates


def test_says_when_it_changed_so_the_hub_need_not_poll() -> None:
    """The hub drains plugins that call ``sync_dirty`` only when they do; one that never did
    would be left on the 5 ms poll (or, with every other plugin saying, lag its peers)."""
    s = replica()
    calls: list[int] = []
    s.sync_dirty = lambda: calls.append(1)
    st = route(s, 0, 2000)
    assert len(calls) == 1  # the PreRequest's new backlog
    first_byte(s, st)
    assert len(calls) == 2  # the release
    s.response_complete(st, request(1), ResponseInfo(request_id="r"), EPS[0])
    assert len(calls) == 2  # already released: nothing changed, nothing to say


def test_resend_repairs_a_lost_release_and_carries_zeros() -> None:
    """A lost release leaves a peer counting a finished prefill until that endpoint changes
    again; ``resend`` makes the next drain carry every endpoint's own backlog, zeros included."""
    a, b = replica(), replica()
    busy = route(a, 0, 3000)
    route(b, 1, 700)  # b's own: a's resend must not echo it back as a's
    sync(b, "B", a)
    sync(a, "A", b)
    first_byte(a, busy)
    a.drain()  # the release, lost in transit
    assert b.backlog(EPS[0]) == 3000 and a.drain() == []
    a.resend()
    sync(a, "A", b)
    assert b.backlog(EPS[0]) == 0 and b.backlog(EPS[1]) == 700
    assert b.debug_state()["peers"].get("A", {}) == {}  # every A share is zero now
    assert a.drain() == []
