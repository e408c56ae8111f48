"""precise-prefix-cache-scorer across replicas: A's routed requests are pending on B under "A"."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest

from epp.datalayer.kvevents.hashing import BlockHasher
from epp.plugin.replicated import Replicated
from epp.scheduling.scorers.precise_prefix import PrecisePrefixCacheScorer
from epp.testing.plugins import build
from tests.scheduling.scorers.test_precise_prefix import PARAMS, TOKENS, route, seed

HASHES = BlockHasher("sha256_cbor", 16, "42").hashes(TOKENS)


def replica(**params: Any) -> tuple[PrecisePrefixCacheScorer, list[Any]]:
    s: PrecisePrefixCacheScorer = build(PrecisePrefixCacheScorer, name="precise", **{**PARAMS, **params})
    eps = seed(s, [0, 0, 0])
    s.drain()  # a hub is attached
    return s, eps


def wire(value: Any) -> Any:
    return msgspec.msgpack.decode(msgspec.msgpack.encode(value))


def pending_on(s: PrecisePrefixCacheScorer, ep: Any) -> int:
    return s.index.pending.blocks(s.index.states[ep.metadata.name].slot)


def test_is_replicated_with_type_slash_name() -> None:
    s, _ = replica()
    assert isinstance(s, Replicated)
    assert s.sync_key == "precise-prefix-cache-scorer/precise"


def test_a_request_routed_on_a_is_pending_on_b() -> None:
    a, eps_a = replica()
    b, eps_b = replica()
    route(a, eps_a, 1)
    assert route(b, eps_b, 0)[1] == [0.0, 0.0, 0.0]  # B alone: nobody holds the prefix yet
    b2, eps_b2 = replica()
    b2.apply("A", wire(a.drain()))
    assert pending_on(b2, eps_b2[1]) == len(HASHES)
    assert route(b2, eps_b2, 1)[1] == [0.0, 1.0, 0.0]


def test_drain_has_only_local_records_and_no_echo() -> None:
    a, eps_a = replica()
    b, eps_b = replica()
    route(a, eps_a, 2)
    out = wire(a.drain())
    assert out == [[eps_a[2].metadata.name, HASHES]]
    b.apply("A", out)
    assert b.drain() == []
    route(b, eps_b, 0)
    a.apply("B", wire(b.drain()))
    b.apply("A", wire(a.drain()))  # A→B→A: nothing new from A
    assert pending_on(a, eps_a[0]) == pending_on(b, eps_b[0]) == len(HASHES)
    assert a.index.pending.records() == b.index.pending.records() == 2


def test_forget_drops_the_origins_records_only() -> None:
    a, eps_a = replica()
    c, eps_c = replica()
    b, eps_b = replica()
    route(a, eps_a, 0)
    route(c, eps_c, 1)
    b.apply("A", wire(a.drain()))
    b.apply("C", wire(c.drain()))
    b.forget("A")
    assert pending_on(b, eps_b[0]) == 0
    assert pending_on(b, eps_b[1]) == len(HASHES)
    b.forget("A")  # twice: nothing left to drop


def test_peer_records_expire_by_ttl() -> None:
    a, eps_a = replica()
    b, eps_b = replica()
    route(a, eps_a, 0)
    b.apply("A", wire(a.drain()))
    assert pending_on(b, eps_b[0]) == len(HASHES)
    b.index.pending.expire(time.monotonic() + b.index.pending.ttl - 1.0)
    assert pending_on(b, eps_b[0]) == len(HASHES)  # no end is ever seen here: it lasts its TTL
    b.index.pending.expire(time.monotonic() + b.index.pending.ttl + 0.1)
    assert pending_on(b, eps_b[0]) == 0


def test_snapshot_restore_round_trip() -> None:
    a, eps_a = replica()
    route(a, eps_a, 0)
    snap = wire(a.snapshot())
    assert snap == [[eps_a[0].metadata.name, HASHES]]
    n, eps_n = replica()
    n.restore(snap)
    assert pending_on(n, eps_n[0]) == len(HASHES)
    assert n.drain() == []


def test_unknown_endpoint_and_disabled_speculation_add_nothing() -> None:
    b, _ = replica()
    b.apply("A", [["not-indexed", HASHES]])
    assert len(b.index.pending) == 0
    off, eps_off = replica(speculativeIndexing=False)
    off.apply("A", [[eps_off[0].metadata.name, HASHES]])
    assert len(off.index.pending) == 0
    assert off.drain() == []


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(3, id="not-a-list"),
        pytest.param([["ep", [1, 2], "x"]], id="too-long"),
        pytest.param([["ep", (1, 2)]], id="hashes-not-a-list"),
        pytest.param([["ep", [1.5]]], id="hash-not-int"),
        pytest.param([["ep", [1 << 64]]], id="hash-too-large"),
        pytest.param([[None, [1]]], id="name-not-str"),
    ],
)
def test_malformed_delta_raises_and_leaves_pending(bad: Any) -> None:
    b, eps_b = replica()
    valid_first = [eps_b[0].metadata.name, HASHES]
    with pytest.raises(ValueError, match="precise-prefix delta"):
        b.apply("A", [valid_first, *bad] if isinstance(bad, list) else bad)
    assert len(b.index.pending) == 0
    with pytest.raises(ValueError, match="precise-prefix snapshot"):
        b.restore({"x": 1})


def test_no_bookkeeping_before_a_hub_drains() -> None:
    s: PrecisePrefixCacheScorer = build(PrecisePrefixCacheScorer, **PARAMS)
    eps = seed(s, [0, 0])
    route(s, eps, 0)
    assert s.drain() == []
    route(s, eps, 1)
    assert len(s.drain()) == 1


def test_a_routed_request_tells_the_hub() -> None:
    a, eps = replica()
    calls: list[int] = []
    a.sync_dirty = lambda: calls.append(1)
    route(a, eps, 1)
    assert calls == [1]
    assert a.drain() == [[eps[1].metadata.name, HASHES]]
