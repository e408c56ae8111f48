"""The block index: longest held prefix per endpoint, bounded per endpoint, exact removal."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from epp.datalayer.kvevents.index import BlockIndex


def brute_force(held: list[set[int]], hashes: list[int], slots: list[int]) -> dict[int, int]:
    out = {}
    for slot in slots:
        n = 0
        while n < len(hashes) and hashes[n] in held[slot]:
            n += 1
        if n:
            out[slot] = n
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 12), max_size=12), min_size=1, max_size=6),
    st.lists(st.integers(0, 12), max_size=10),
    st.data(),
)
def test_match_is_the_longest_held_prefix(
    held_lists: list[list[int]], hashes: list[int], data: st.DataObject
) -> None:
    index = BlockIndex(capacity=100)
    held = []
    for i, blocks in enumerate(held_lists):
        index.add_endpoint(f"ep-{i}")
        index.stored(i, blocks)
        held.append(set(blocks))
    slots = data.draw(st.lists(st.sampled_from(range(len(held_lists))), unique=True))
    mask = sum(1 << s for s in slots)
    assert index.match(hashes, mask) == brute_force(held, hashes, slots)


def test_capacity_evicts_least_recently_stored() -> None:
    index = BlockIndex(capacity=3)
    a = index.add_endpoint("a").slot
    b = index.add_endpoint("b").slot
    index.stored(a, [1, 2, 3])
    index.stored(b, [1])
    index.stored(a, [1])  # refreshed: 2 is now the oldest
    index.stored(a, [4])
    assert index.blocks(a) == 3
    assert index.match([1, 2], 1 << a) == {a: 1}
    assert index.match([1], 1 << b) == {b: 1}  # b's copy of 1 is untouched
    assert len(index) == 4 - 1  # 1, 3, 4 (2 evicted)


def test_removed_clear_and_endpoint_removal() -> None:
    index = BlockIndex(capacity=10)
    a = index.add_endpoint("a").slot
    b = index.add_endpoint("b").slot
    index.stored(a, [1, 2, 3])
    index.stored(b, [1, 2])
    index.removed(a, [2, 99])
    both = (1 << a) | (1 << b)
    assert index.match([1, 2, 3], both) == {a: 1, b: 2}
    index.clear(b)
    assert index.match([1, 2, 3], both) == {a: 1}
    index.remove_endpoint("a")
    assert len(index) == 0
    c = index.add_endpoint("c").slot
    assert c == a  # the slot is reused, empty
    assert index.match([1], 1 << c) == {}


def test_older_counts_the_blocks_the_engine_would_evict_first() -> None:
    """Stores stamp blocks in order; a touch (the engine freeing a request's blocks) makes them the
    newest; evictions in LRU order keep the count exact."""
    index = BlockIndex(capacity=100)
    slot = index.add_endpoint("a").slot
    index.stored(slot, range(10))
    assert [index.older(slot, h) for h in (0, 5, 9)] == [0, 5, 9]
    assert index.older(slot, 42) == -1
    index.touch(slot, [2, 1, 0, 77])  # freed tail first: 0 the newest; 77 is not held
    assert [index.older(slot, h) for h in (3, 9, 2, 1, 0)] == [0, 6, 7, 8, 9]
    index.removed(slot, [3, 4, 5])  # the engine evicts its oldest
    assert [index.older(slot, h) for h in (6, 9, 0)] == [0, 3, 6]


def test_evicted_remembers_removals_until_stored_again() -> None:
    ix = BlockIndex(3)
    a = ix.add_endpoint("a").slot
    ix.stored(a, [1, 2])
    assert not ix.evicted(a, 1)
    ix.removed(a, [1, 9])  # 9 was never held: nothing to remember
    assert ix.evicted(a, 1) and not ix.evicted(a, 9)
    ix.stored(a, [1])
    assert not ix.evicted(a, 1)
    ix.stored(a, [3, 4, 5])  # capacity 3: 1, 2 drop out without a removal event
    ix.removed(a, [3, 4, 5])
    ix.stored(a, [6])
    ix.removed(a, [6])  # bounded: the oldest removals are forgotten first
    assert [ix.evicted(a, h) for h in (3, 4, 5, 6)] == [False, True, True, True]
    ix.clear(a)
    assert not ix.evicted(a, 6)
