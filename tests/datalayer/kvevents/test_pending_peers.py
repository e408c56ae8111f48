"""PendingBlocks' peer records: kept per origin, dropped by forget, bounded as local ones."""

from __future__ import annotations

from epp.datalayer.kvevents.pending import PendingBlocks


def test_forget_drops_one_origins_records_and_keeps_local_ones() -> None:
    p = PendingBlocks(ttl=30.0, grace=1.0, capacity=100)
    local = p.add(0, [1, 2], 0.0)
    p.add_peer("A", 0, [2, 3], 0.0)
    p.add_peer("B", 1, [4], 0.0)
    assert p.holds(0, 3) and p.holds(1, 4)
    p.forget("A")
    assert not p.holds(0, 3)
    assert p.holds(0, 2) and p.holds(0, 1)  # the local record's share of block 2 stays
    assert p.holds(1, 4)
    assert local is not None and local.live


def test_an_origins_record_list_stays_bounded_by_the_live_records() -> None:
    p = PendingBlocks(ttl=30.0, grace=1.0, capacity=4)
    for i in range(100):
        p.add_peer("A", 0, [10 * i, 10 * i + 1], float(i) * 0.01)
    assert p.blocks(0) <= 4
    assert len(p._origins["A"]) <= 3  # released records are pruned as new ones arrive
    p.forget("A")
    assert p.blocks(0) == 0 and not p.bits
