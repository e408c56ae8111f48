"""approx-prefix-cache-producer across replicas: A's routed insertions applied on B under "A"."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from epp.datalayer.api import Endpoint
from epp.director.prefix.hashing import hash_request
from epp.director.producers import approx_prefix
from epp.director.producers.approx_prefix import ApproxPrefixCacheProducer
from epp.plugin.replicated import Replicated
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.testing.builders import completions_body
from epp.testing.clock import ManualClock
from epp.testing.plugins import build
from tests.director.producers.test_approx_prefix import BLOCK, _matches, _prepare, _schedule_to
from tests.scheduling.builders import endpoint, request

EPS = [endpoint(i) for i in range(3)]


def replica(**params: Any) -> ApproxPrefixCacheProducer:
    p: ApproxPrefixCacheProducer = build(ApproxPrefixCacheProducer, name="approx", **params)
    for ep in EPS:
        p.endpoint_added(ep)
    p.drain()  # a hub is attached
    p.clock = ManualClock()
    return p


def ticking(p: ApproxPrefixCacheProducer) -> ApproxPrefixCacheProducer:
    """Every read a refresh interval later: every insertion goes to the peers whole."""
    clock = ManualClock()

    def tick() -> float:
        return clock.advance(approx_prefix.REFRESH_HELD_S)

    p.clock = tick
    return p


def prompt(tag: str, blocks: int) -> InferenceRequest:
    return request(model="m", body=completions_body((tag * BLOCK * blocks)[: BLOCK * blocks]))


def route(p: ApproxPrefixCacheProducer, req: InferenceRequest, target: Endpoint) -> CycleState:
    state = _prepare(p, req, EPS)
    _schedule_to(p, state, req, target)
    return state


def wire(deltas: Any) -> Any:
    return msgspec.msgpack.decode(msgspec.msgpack.encode(deltas))


def test_is_replicated_with_type_slash_name() -> None:
    p = replica()
    assert isinstance(p, Replicated)
    assert p.sync_key == "approx-prefix-cache-producer/approx"


def test_peer_routing_makes_a_hit_here() -> None:
    a, b = replica(), replica()
    req = prompt("a", 4)
    route(a, req, EPS[1])
    assert _matches(_prepare(b, req, EPS), EPS) == [(0, 4)] * 3
    b.apply("A", wire(a.drain()))
    assert _matches(_prepare(b, req, EPS), EPS) == [(0, 4), (4, 4), (0, 4)]
    assert b.index.server_size(EPS[1].metadata.name) == 4


def test_drain_has_only_local_insertions_and_no_echo() -> None:
    a, b = replica(), replica()
    route(a, prompt("a", 2), EPS[0])
    b.apply("A", wire(a.drain()))
    assert b.drain() == []
    route(b, prompt("b", 3), EPS[2])
    b_out = wire(b.drain())
    assert [(n, len(h)) for n, h in b_out] == [(EPS[2].metadata.name, 3)]
    a.apply("B", b_out)
    b.apply("A", wire(a.drain()))  # A→B→A: A has nothing new to send
    assert a.index.dump() == b.index.dump()
    assert len(a.index) == 5


def test_apply_keeps_lru_capacity_and_live_endpoints() -> None:
    a, b = replica(lruCapacityPerServer=3, autoTune=False), replica(lruCapacityPerServer=3, autoTune=False)
    route(a, prompt("a", 5), EPS[0])
    gone = endpoint(9)
    b.apply("A", [*wire(a.drain()), [gone.metadata.name, [1, 2, 3]]])
    assert b.index.server_size(EPS[0].metadata.name) == 3  # capacity, as a local add
    assert gone.metadata.name not in b.index.servers()  # not in B's datastore: not indexed


def test_forget_is_a_no_op() -> None:
    a, b = replica(), replica()
    route(a, prompt("a", 2), EPS[0])
    b.apply("A", wire(a.drain()))
    before = b.index.dump()
    b.forget("A")
    assert b.index.dump() == before


def test_snapshot_restore_round_trip_in_lru_order() -> None:
    a, b = replica(), replica()
    route(a, prompt("a", 2), EPS[0])
    route(b, prompt("b", 2), EPS[0])
    a.apply("B", wire(b.drain()))
    route(a, prompt("a", 2), EPS[0])  # touched again: now most recent
    snap = wire(a.snapshot())
    n = replica()
    n.restore(snap)
    assert n.index.dump() == a.index.dump() == snap
    a_hashes = hash_request(prompt("a", 2), 16, 256)
    assert snap[EPS[0].metadata.name][-2:] == a_hashes  # least recently used first
    assert n.drain() == []  # restored state is not this replica's routing


def test_no_bookkeeping_without_a_hub_and_bounded_with_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(approx_prefix, "MAX_UNDRAINED", 10)
    p: ApproxPrefixCacheProducer = build(ApproxPrefixCacheProducer)
    for ep in EPS:
        p.endpoint_added(ep)
    ticking(p)
    route(p, prompt("a", 1), EPS[0])
    assert p.drain() == []  # nothing kept before the first drain
    req = prompt("a", 1)
    for _ in range(15):
        _schedule_to(p, _prepare(p, req, EPS), req, EPS[0])
    assert [name for name, _ in p.drain()] == [EPS[0].metadata.name]  # the 10 kept, merged
    assert p.undrained_dropped == 5


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param("x", id="not-a-list"),
        pytest.param([["ep", 1]], id="hashes-not-a-list"),
        pytest.param([["ep", [1, "2"]]], id="hash-not-int"),
        pytest.param([["ep", [-1]]], id="negative-hash"),
        pytest.param([["ep", [1 << 64]]], id="hash-too-large"),
        pytest.param([[1, [1]]], id="name-not-str"),
        pytest.param([["ep", [1], 3]], id="too-long"),
    ],
)
def test_malformed_delta_raises_and_leaves_index(bad: Any) -> None:
    b = replica()
    b.apply("A", [[EPS[0].metadata.name, [11, 12]]])
    before = b.index.dump()
    valid_first = [EPS[0].metadata.name, [13]]  # a valid row before the bad one must not land either
    with pytest.raises(ValueError, match="approx-prefix delta"):
        b.apply("A", [valid_first, *bad] if isinstance(bad, list) else bad)
    assert b.index.dump() == before


def test_malformed_snapshot_raises() -> None:
    n = replica()
    with pytest.raises(ValueError, match="approx-prefix snapshot"):
        n.restore([1])
    with pytest.raises(ValueError, match="approx-prefix snapshot"):
        n.restore({EPS[0].metadata.name: [1, None]})
    assert len(n.index) == 0


def test_a_routed_insertion_tells_the_hub() -> None:
    p = replica()
    calls: list[int] = []
    p.sync_dirty = lambda: calls.append(1)
    route(p, prompt("a", 4), EPS[1])
    assert calls == [1]
    assert len(p.drain()) == 1


@pytest.mark.parametrize("capacity", [1000, 5])
def test_a_merged_drain_builds_the_peers_index_a_drain_per_insertion_would(capacity: int) -> None:
    """Insertions merged per endpoint at drain land as the insertions one by one would: the same
    hashes in the same LRU order, evictions included (capacity 5 evicts within the batch)."""
    params = {"lruCapacityPerServer": capacity, "autoTune": False}
    merged_sender, one_by_one_sender = ticking(replica(**params)), ticking(replica(**params))
    merged, one_by_one = replica(**params), replica(**params)
    shared = "s" * BLOCK * 3  # three blocks every prompt shares, then its own
    routes = [(shared + str(i) * BLOCK * (1 + i % 3), EPS[i % 2]) for i in range(9)]
    for body, target in routes:
        req = request(model="m", body=completions_body(body))
        route(merged_sender, req, target)
        route(one_by_one_sender, req, target)
        one_by_one.apply("A", wire(one_by_one_sender.drain()))
    batch = wire(merged_sender.drain())
    assert sorted(name for name, _ in batch) == sorted({ep.metadata.name for ep in EPS[:2]})
    assert sum(map(len, (h for _, h in batch))) < sum(3 + 1 + i % 3 for i in range(9))  # shared blocks once
    merged.apply("A", batch)
    assert merged.index.dump() == one_by_one.index.dump() == one_by_one_sender.index.dump()


def chat(shared: str, own: str) -> InferenceRequest:
    """A prompt of ``shared``'s blocks (a system prompt) and then ``own``'s (the question)."""
    return request(model="m", body=completions_body(shared + own))


SYSTEM = "s" * BLOCK * 4  # four blocks many prompts share


def sent(p: ApproxPrefixCacheProducer) -> list[tuple[str, int]]:
    return [(name, len(hashes)) for name, hashes in wire(p.drain())]


def test_a_held_chain_goes_whole_once_per_interval_then_only_its_new_blocks() -> None:
    a = replica()
    clock = a.clock
    assert isinstance(clock, ManualClock)
    ep = EPS[1].metadata.name
    route(a, chat(SYSTEM, "q" * BLOCK * 2), EPS[1])
    assert sent(a) == [(ep, 6)]  # nothing held: all of it
    route(a, chat(SYSTEM, "r" * BLOCK * 2), EPS[1])
    assert sent(a) == [(ep, 6)]  # held 4, never sent whole by a since: whole
    route(a, chat(SYSTEM, "t" * BLOCK * 3), EPS[1])
    assert sent(a) == [(ep, 3)]  # held 4, sent whole just now: the 3 new blocks
    route(a, chat(SYSTEM, "t" * BLOCK * 3), EPS[1])
    assert sent(a) == [(ep, 7)]  # all 7 held, but that chain of 7 never sent whole: whole
    calls: list[int] = []
    a.sync_dirty = lambda: calls.append(1)
    route(a, chat(SYSTEM, "t" * BLOCK * 3), EPS[1])
    assert sent(a) == [] and calls == []  # all 7 held, sent whole just now: nothing to tell
    assert a.debug_state()["sync"] == {"blocksSent": 22, "blocksHeldNotSent": 11}
    clock.advance(approx_prefix.REFRESH_HELD_S)
    route(a, chat(SYSTEM, "t" * BLOCK * 3), EPS[1])
    assert sent(a) == [(ep, 7)] and calls == [1]  # the interval passed: whole again, LRU refreshed
    route(a, chat(SYSTEM, "u" * BLOCK), EPS[2])
    assert sent(a) == [(EPS[2].metadata.name, 5)]  # another endpoint: its own held part, its own key


def test_peers_hold_every_block_the_sender_does() -> None:
    """Held parts skipped, a peer still knows every (endpoint, block) its sender does, and so
    matches every prompt on every endpoint as the sender would."""
    a, b = replica(), replica()
    prompts = [chat(SYSTEM[: BLOCK * (2 + i % 3)], str(i % 10) * BLOCK * (1 + i % 4)) for i in range(24)]
    for i, req in enumerate(prompts):
        route(a, req, EPS[i % 3])
        if i % 4 == 3:
            b.apply("A", wire(a.drain()))
    b.apply("A", wire(a.drain()))
    assert a.sync_blocks_held > 0  # the case under test happened
    for name, hashes in a.index.dump().items():
        assert sorted(b.index.dump()[name]) == sorted(hashes)
    for req in prompts:
        assert _matches(_prepare(b, req, EPS), EPS) == _matches(_prepare(a, req, EPS), EPS)


def test_a_peer_that_missed_the_first_sender_learns_the_chain_from_another() -> None:
    """B routes a prompt and only A hears of it (C is cut off from B).  A then routes the same
    system prompt: A holds it but never sent it whole, so it does, and C learns it from A."""
    a, b, c = replica(), replica(), replica()
    route(b, chat(SYSTEM, "q" * BLOCK), EPS[0])
    a.apply("B", wire(b.drain()))
    route(a, chat(SYSTEM, "r" * BLOCK), EPS[0])
    c.apply("A", wire(a.drain()))
    assert _matches(_prepare(c, chat(SYSTEM, "x" * BLOCK), EPS), EPS)[0] == (4, 5)


def test_a_whole_chain_dropped_on_a_full_queue_goes_whole_with_the_next_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past ``MAX_UNDRAINED`` an insertion is dropped; a held chain dropped so was never sent
    whole, so the next request holding it sends it whole, not only its new blocks."""
    monkeypatch.setattr(approx_prefix, "MAX_UNDRAINED", 1)
    a = replica()
    ep = EPS[1].metadata.name
    route(a, chat(SYSTEM, "q" * BLOCK), EPS[1])  # fills the queue
    route(a, chat(SYSTEM, "r" * BLOCK), EPS[1])  # holds 4, whole: dropped
    assert a.undrained_dropped == 1
    assert sent(a) == [(ep, 5)]  # only the first
    route(a, chat(SYSTEM, "t" * BLOCK), EPS[1])
    assert sent(a) == [(ep, 5)]  # whole: the dropped one never reached a peer
    route(a, chat(SYSTEM, "u" * BLOCK), EPS[1])
    assert sent(a) == [(ep, 1)]  # now sent whole within the interval: the new block only
