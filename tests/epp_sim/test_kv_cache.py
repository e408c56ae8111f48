"""Tests of the paged KV cache: allocation, prefix reuse, LRU eviction, usage, events."""

from __future__ import annotations

import pytest

from epp_sim.kv_cache import KVCache
from epp_sim.kv_events import AllBlocksCleared, BlockRemoved


def fill(cache: KVCache, hashes: list[int]) -> list[int | None]:
    """Allocate one block per hash and cache it, as a sequence filling its blocks does."""
    cache.allocate(len(hashes))
    return [h if cache.store(h) else None for h in hashes]


def test_usage_counts_held_blocks_only() -> None:
    """Usage is held blocks / all blocks; cached blocks no sequence holds count as free."""
    cache = KVCache(10, 16)
    held = fill(cache, [1, 2, 3, 4])
    assert (cache.usage, cache.free_blocks, cache.cached_blocks) == (0.4, 6, 4)
    cache.release(held)
    assert (cache.usage, cache.free_blocks, cache.cached_blocks) == (0.0, 10, 4)


@pytest.mark.parametrize(
    ("cached", "query", "limit", "expected"),
    [
        pytest.param([1, 2, 3], [1, 2, 3, 4], 4, 3, id="prefix-then-miss"),
        pytest.param([1, 2, 3], [1, 2, 3], 2, 2, id="limited"),
        pytest.param([2, 3], [1, 2, 3], 3, 0, id="first-block-missing"),
    ],
)
def test_match_counts_leading_hits(cached: list[int], query: list[int], limit: int, expected: int) -> None:
    """Only a contiguous run of cached hashes from the start counts as a prefix hit."""
    cache = KVCache(8, 16)
    cache.release(fill(cache, cached))
    assert cache.match(query, limit) == expected


def test_eviction_prefers_uncached_free_blocks_then_lru_tail_first() -> None:
    """Fresh blocks come from uncached free ones first; then the least recently freed cached block goes,
    and a sequence's tail is freed before its prefix."""
    cache = KVCache(6, 16, record_events=True)
    first = fill(cache, [10, 11, 12])  # a sequence's blocks, prefix first
    cache.release(first)  # freed tail first: LRU order 12, 11, 10
    second = fill(cache, [20, 21])
    cache.release(second)  # LRU order 12, 11, 10, 21, 20
    cache.allocate(1)  # one uncached free block left: no eviction
    assert cache.take_events() == []
    cache.allocate(2)
    assert cache.take_events() == [BlockRemoved(block_hashes=[12, 11], medium="GPU")]
    assert (cache.contains(10), cache.contains(11), cache.contains(20)) == (True, False, True)


def test_acquired_hits_are_not_evictable() -> None:
    """Blocks a sequence reuses leave the LRU list, and can_allocate accounts for reclaiming them."""
    cache = KVCache(4, 16)
    cache.release(fill(cache, [1, 2, 3, 4]))
    assert cache.can_allocate(2, [1, 2])
    assert not cache.can_allocate(3, [1, 2])
    cache.acquire([1, 2])
    cache.allocate(2)  # evicts 4 and 3
    assert (cache.contains(1), cache.contains(3), cache.free_blocks) == (True, False, 0)


def test_store_keeps_duplicates_uncached() -> None:
    """A block whose hash is already cached stays a plain block of its sequence and frees as one."""
    cache = KVCache(4, 16)
    a = fill(cache, [7])
    b = fill(cache, [7])
    assert (a, b, cache.cached_blocks) == ([7], [None], 1)
    cache.release(b)
    cache.release(a)
    assert cache.free_blocks == 4


def test_over_allocation_is_a_bug() -> None:
    """Allocating more than is free raises instead of corrupting the accounting."""
    cache = KVCache(2, 16)
    with pytest.raises(RuntimeError, match="over-allocated"):
        cache.allocate(3)


def test_clear_drops_everything_and_reports_it() -> None:
    """A restart empties the cache and emits AllBlocksCleared."""
    cache = KVCache(4, 16, record_events=True)
    cache.release(fill(cache, [1, 2]))
    cache.clear()
    assert (cache.cached_blocks, cache.free_blocks, cache.take_events()) == (0, 4, [AllBlocksCleared()])
