"""Paged KV cache with vLLM-style automatic prefix caching: chained block hashes, LRU eviction."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from epp_sim.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored


class _Block:
    """A cached (hashed, full) block; `refs` counts the sequences using it."""

    __slots__ = ("refs",)

    def __init__(self) -> None:
        self.refs = 1


class KVCache:
    """`num_blocks` blocks of `block_size` tokens.

    A block is either free and uncached, held by sequences, or cached: full, with a hash, reusable by
    any sequence whose tokens hash the same. A cached block no sequence holds is free but evictable;
    those sit in an LRU list and are evicted, oldest first, only when no uncached free block is left.
    A sequence frees its blocks tail first, so a prefix outlives its own suffix.
    """

    __slots__ = (
        "_cached",
        "_evictable",
        "_free_plain",
        "block_size",
        "events",
        "num_blocks",
        "record_events",
    )

    def __init__(self, num_blocks: int, block_size: int, *, record_events: bool = False) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.record_events = record_events
        self.events: list[BlockStored | BlockRemoved | AllBlocksCleared] = []
        self._free_plain = num_blocks
        self._cached: dict[int, _Block] = {}
        self._evictable: OrderedDict[int, _Block] = OrderedDict()

    @property
    def free_blocks(self) -> int:
        return self._free_plain + len(self._evictable)

    @property
    def cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by sequences (vLLM's kv_cache_usage_perc: evictable counts as free)."""
        return 1.0 - self.free_blocks / self.num_blocks

    def contains(self, block_hash: int) -> bool:
        return block_hash in self._cached

    def match(self, hashes: Sequence[int], limit: int) -> int:
        """How many of the first `limit` hashes are cached, counting from the start."""
        cached = self._cached
        n = 0
        while n < limit and hashes[n] in cached:
            n += 1
        return n

    def can_allocate(self, new_blocks: int, hits: Sequence[int] = ()) -> bool:
        """Whether `new_blocks` fresh blocks fit after acquiring the cached `hits`."""
        reclaimed = sum(1 for h in hits if self._cached[h].refs == 0) if hits else 0
        return self.free_blocks - reclaimed >= new_blocks

    def acquire(self, hits: Sequence[int]) -> None:
        for h in hits:
            block = self._cached[h]
            if block.refs == 0:
                del self._evictable[h]
            block.refs += 1

    def allocate(self, n: int) -> None:
        """Take `n` fresh blocks: uncached free ones first, then evict the least recently freed."""
        plain = min(n, self._free_plain)
        self._free_plain -= plain
        evict = n - plain
        if evict <= 0:
            return
        if evict > len(self._evictable):
            raise RuntimeError(
                f"KV cache over-allocated: {evict} blocks to evict, {len(self._evictable)} evictable"
            )
        removed = []
        for _ in range(evict):
            h, _block = self._evictable.popitem(last=False)
            del self._cached[h]
            removed.append(h)
        if self.record_events:
            self.events.append(BlockRemoved(block_hashes=removed, medium=MEDIUM_GPU))

    def store(self, block_hash: int) -> bool:
        """Cache a sequence's just-filled block; False if the hash is already cached (it stays plain)."""
        if block_hash in self._cached:
            return False
        self._cached[block_hash] = _Block()
        return True

    def stored_event(
        self,
        hashes: list[int],
        parent: int | None,
        token_ids: list[int],
        lora_id: int | None,
        lora_name: str | None,
        extra_keys: list[tuple[object, ...] | None] | None = None,
    ) -> None:
        if self.record_events and hashes:
            self.events.append(
                BlockStored(
                    block_hashes=hashes,
                    parent_block_hash=parent,
                    token_ids=token_ids,
                    block_size=self.block_size,
                    lora_id=lora_id,
                    medium=MEDIUM_GPU,
                    lora_name=lora_name,
                    extra_keys=extra_keys,
                )
            )

    def release(self, held: Sequence[int | None]) -> None:
        """Free a sequence's blocks (None = uncached), tail first."""
        cached = self._cached
        evictable = self._evictable
        for h in reversed(held):
            if h is None:
                self._free_plain += 1
                continue
            block = cached[h]
            block.refs -= 1
            if block.refs == 0:
                evictable[h] = block

    def clear(self) -> None:
        """Drop every cached block (a restart); only valid when no sequence holds blocks."""
        self._cached.clear()
        self._evictable.clear()
        self._free_plain = self.num_blocks
        if self.record_events:
            self.events.append(AllBlocksCleared())

    def take_events(self) -> list[BlockStored | BlockRemoved | AllBlocksCleared]:
        events, self.events = self.events, []
        return events
