"""Pending (speculative) blocks: counted as held from routing while the request is in flight
(its end plus a grace, or the TTL); reference-counted and bounded per endpoint."""

from __future__ import annotations

from epp.datalayer.kvevents.index import BlockIndex
from epp.datalayer.kvevents.pending import PendingBlocks


def index(capacity: int = 100) -> tuple[BlockIndex, int, int]:
    ix = BlockIndex(capacity)
    ix.pending = PendingBlocks(ttl=30.0, grace=2.0, capacity=capacity)
    return ix, ix.add_endpoint("a").slot, ix.add_endpoint("b").slot


def test_pending_blocks_count_only_when_asked() -> None:
    ix, a, b = index()
    ix.stored(a, [1, 2])
    ix.pending.add(b, [1, 2, 3], now=0.0)
    mask = (1 << a) | (1 << b)
    assert ix.match([1, 2, 3], mask) == {a: 2}
    assert ix.match([1, 2, 3], mask, pending=True) == {a: 2, b: 3}


def test_a_waiting_request_keeps_its_blocks_through_an_eviction() -> None:
    """Reported blocks count once; evicted while the request still waits there, they stay pending
    (the request will store them again); after the request and its grace, only the events count."""
    ix, a, _ = index()
    record = ix.pending.add(a, [1, 2, 3], now=0.0)
    assert record is not None
    ix.stored(a, [1, 2])
    assert ix.match([1, 2, 3], 1 << a, pending=True) == {a: 3}
    ix.removed(a, [2])
    assert ix.match([1, 2, 3], 1 << a) == {a: 1}
    assert ix.match([1, 2, 3], 1 << a, pending=True) == {a: 3}
    ix.pending.end(record, now=5.0)
    ix.pending.expire(7.0)
    assert ix.match([1, 2, 3], 1 << a, pending=True) == {a: 1}  # the eviction is the events' word now


def test_request_end_expires_after_grace_and_ttl_bounds_the_rest() -> None:
    ix, a, b = index()
    ended = ix.pending.add(a, [1, 2], now=0.0)
    ix.pending.add(b, [1, 2], now=1.0)
    assert ended is not None
    ix.pending.end(ended, now=5.0)
    ix.pending.expire(6.9)
    assert ix.pending.blocks(a) == 2  # within the grace: events may still be on their way
    ix.pending.expire(7.0)
    assert ix.pending.blocks(a) == 0
    assert ix.pending.blocks(b) == 2
    ix.pending.expire(31.0)  # b's request never ended: the TTL
    assert ix.pending.blocks(b) == 0
    assert len(ix.pending) == 0


def test_shared_blocks_live_while_any_request_holds_them() -> None:
    ix, a, _ = index()
    first = ix.pending.add(a, [1, 2], now=0.0)
    ix.pending.add(a, [1, 2, 3], now=1.0)
    assert first is not None
    ix.pending.end(first, now=1.0)
    ix.pending.expire(4.0)
    assert ix.match([1, 2, 3], 1 << a, pending=True) == {a: 3}


def test_capacity_drops_the_oldest_requests_first() -> None:
    ix, a, _ = index(capacity=4)
    ix.pending.add(a, [1, 2, 3], now=0.0)
    ix.pending.add(a, [4, 5, 6], now=1.0)
    assert ix.pending.blocks(a) == 3
    assert ix.match([4, 5, 6], 1 << a, pending=True) == {a: 3}
    assert ix.match([1], 1 << a, pending=True) == {}


def test_cleared_or_removed_endpoint_drops_its_pending_blocks() -> None:
    ix, a, b = index()
    ix.pending.add(a, [1], now=0.0)
    ix.pending.add(b, [1], now=0.0)
    ix.clear(a)
    ix.remove_endpoint("b")
    assert len(ix.pending) == 0


def test_holders_of_a_first_block_split_into_computed_and_still_to_compute_with_the_latest_first_byte() -> (
    None
):
    p = PendingBlocks(ttl=30, grace=2, capacity=100)
    a = p.add(0, [1, 2, 3], now=0)
    b = p.add(0, [1, 2, 4], now=0)
    p.add(1, [1, 2], now=0)  # another slot
    p.add(0, [9, 1], now=0)  # block 1, but not first
    assert a is not None and b is not None
    assert p.holders(0, 1) == (0, 2, 0.0)
    a.computed, a.computed_at = True, 5.0
    assert p.holders(0, 1) == (1, 1, 5.0)
    b.computed, b.computed_at = True, 7.0
    assert p.holders(0, 1) == (2, 0, 7.0)  # the latest first byte: the holder decoding longest
    p.end(b, now=8)  # ended: in grace, no longer in flight
    assert p.holders(0, 1) == (1, 0, 5.0)
    assert p.holders(2, 1) == (0, 0, 0.0)
