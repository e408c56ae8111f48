"""Session bindings across replicas: a turn routed by A pins the next turn on B too."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from epp.plugin.replicated import Replicated
from epp.scheduling.filters.session_affinity import SessionAffinityFilter
from epp.scheduling.scorers.session_affinity import SessionAffinityScorer
from epp.scheduling.sessions import SessionBindings
from epp.testing.builders import make_endpoint
from epp.testing.clock import ManualClock
from epp.testing.plugins import build
from tests.scheduling.filters.test_session_affinity import req, session_filter, turn

EPS = [make_endpoint(i) for i in range(4)]


def wire(value: Any) -> Any:
    return msgspec.msgpack.decode(msgspec.msgpack.encode(value))


def replica() -> SessionAffinityFilter:
    f = session_filter()
    f.drain()  # a hub is attached
    return f


def test_filter_and_scorer_are_replicated_with_type_slash_name() -> None:
    f = build(SessionAffinityFilter, name="pin", strategy="session_id")
    s = build(SessionAffinityScorer, name="aff", algorithm="session_id_header")
    assert isinstance(f, Replicated) and isinstance(s, Replicated)
    assert (f.sync_key, s.sync_key) == ("session-affinity-filter/pin", "session-affinity-scorer/aff")
    assert f.replicated and s.replicated


def test_encoded_header_strategy_has_nothing_to_share() -> None:
    f = build(SessionAffinityFilter)  # encoded_endpoint_header: the client carries the binding
    f.drain()
    turn(f, req("token"), EPS, fallback=EPS[1])
    assert not f.replicated
    assert f.drain() == []


def test_a_turn_routed_on_a_pins_the_next_turn_on_b() -> None:
    a, b = replica(), replica()
    turn(a, req("conv-1"), EPS, fallback=EPS[2])
    assert turn(b, req("conv-1"), EPS, fallback=EPS[0])[0] == EPS  # B has not heard yet
    b2 = replica()
    b2.apply("A", wire(a.drain()))
    assert turn(b2, req("conv-1"), EPS, fallback=EPS[0])[0] == [EPS[2]]


def test_drain_has_only_local_bindings_and_no_echo() -> None:
    a, b = replica(), replica()
    turn(a, req("conv-1"), EPS, fallback=EPS[2])
    b.apply("A", wire(a.drain()))
    assert b.drain() == []
    turn(b, req("conv-2"), EPS, fallback=EPS[3])
    a.apply("B", wire(b.drain()))
    b.apply("A", wire(a.drain()))  # A→B→A
    assert a.affinity.bindings.sessions_on(EPS[2].name) == b.affinity.bindings.sessions_on(EPS[2].name) == 1
    assert len(a.affinity.bindings) == len(b.affinity.bindings) == 2


def test_age_carries_expiry_and_the_newer_binding_wins() -> None:
    ca, cb = ManualClock(100.0), ManualClock(100.0)
    cb.now = 5000.0  # another process's monotonic clock
    a = SessionBindings(max_sessions=10, ttl=60, clock=ca)
    b = SessionBindings(max_sessions=10, ttl=60, clock=cb)
    a.drain()
    a.bind("s", "ep-a")
    ca.now += 50
    for session, name, age in wire(a.drain()):
        b.learn(session, name, age)
    assert b.get("s") == "ep-a"
    cb.now += 11  # 61 s since A's turn: expired on B as on A
    assert b.get("s") is None
    b.bind("s", "ep-b")  # B's newer turn
    b.learn("s", "ep-a", 30.0)  # an older binding from a peer does not replace it
    assert b.get("s") == "ep-b"
    b.learn("s", "ep-c", 0.0)  # a tie keeps ours
    assert b.get("s") == "ep-b"
    cb.now += 1
    b.learn("s", "ep-c", 0.5)  # a peer's turn after ours wins
    assert b.get("s") == "ep-c"
    b.learn("t", "ep-a", 61.0)  # already expired: not kept
    assert b.get("t") is None


def test_bookkeeping_starts_with_the_hub_and_is_bounded() -> None:
    b = SessionBindings(max_sessions=3, ttl=0)
    b.bind("early", "e")
    assert b.drain() == []  # nothing kept before the first drain
    for i in range(10):
        b.bind(f"s{i}", "e")
    out = b.drain()
    assert len(out) <= 3 and {s for s, _, _ in out} <= {"s7", "s8", "s9"}


def test_forget_is_a_no_op() -> None:
    a, b = replica(), replica()
    turn(a, req("conv-1"), EPS, fallback=EPS[2])
    b.apply("A", wire(a.drain()))
    b.forget("A")
    assert turn(b, req("conv-1"), EPS, fallback=EPS[0])[0] == [EPS[2]]


def test_snapshot_restore_round_trip() -> None:
    a, b = replica(), replica()
    turn(a, req("conv-1"), EPS, fallback=EPS[2])
    turn(b, req("conv-2"), EPS, fallback=EPS[1])
    a.apply("B", wire(b.drain()))
    n = replica()
    n.restore(wire(a.snapshot()))
    assert [(s, e) for s, e, _ in n.snapshot()] == [("conv-1", EPS[2].name), ("conv-2", EPS[1].name)]
    assert n.drain() == []
    assert turn(n, req("conv-2"), EPS, fallback=EPS[0])[0] == [EPS[1]]


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"s": "e"}, id="not-a-list"),
        pytest.param([["s", "e"]], id="short"),
        pytest.param([["s", 3, 1.0]], id="name-not-str"),
        pytest.param([["s", "e", "1"]], id="age-not-number"),
        pytest.param([["s", "e", -1.0]], id="negative-age"),
        pytest.param([["s", "e", float("nan")]], id="nan-age"),
    ],
)
def test_malformed_delta_raises_and_leaves_bindings(bad: Any) -> None:
    b = replica()
    with pytest.raises(ValueError, match="session-affinity delta"):
        b.apply("A", [["ok", EPS[0].name, 0.0], *bad] if isinstance(bad, list) else bad)
    assert len(b.affinity.bindings) == 0
    with pytest.raises(ValueError, match="session-affinity snapshot"):
        b.restore("x")


def test_a_binding_tells_the_hub() -> None:
    """``sync_dirty`` (set by the hub) reaches the bindings store: each bind asks for a drain."""
    f = replica()
    calls: list[int] = []
    f.sync_dirty = lambda: calls.append(1)
    assert f.affinity.bindings.on_change is f.sync_dirty
    turn(f, req("conv-1"), EPS, fallback=EPS[2])
    assert calls == [1]
    assert [s for s, _, _ in f.drain()] == ["conv-1"]
