"""The approximate prefix index: per-server LRUs of block hashes and a reverse index hash → servers."""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

from epp.datalayer.api import Endpoint
from epp.director.prefix.native import ACTIVE, Loops, bits

_INTERN_MAX: Final = 65536


class PrefixIndex:
    """Which servers are believed to hold which prompt blocks.

    Each server gets a slot (a small int, recycled when the server goes) and an LRU of
    block hashes bounded by its capacity.  The reverse index maps a hash to the bitmask of
    the slots whose LRU holds it; an LRU eviction clears that bit and drops the hash when
    no bit is left, so the reverse index never outlives the LRUs.  Memory is therefore
    bounded by the sum of the capacities (about 180 bytes per entry in CPython when every
    hash is distinct, the worst case).

    Bitmask values are interned, since few distinct holder sets exist; this keeps one int
    object per holder set instead of one per hash.  Not thread-safe: the asyncio loop is
    the only caller.

    The per-request loops (match, the insertion and eviction of ``add``) are ``loops``': by
    default the C ones (``epp.director.prefix.native``) over these same containers.
    """

    __slots__ = (
        "_add",
        "_endpoints",
        "_entries",
        "_evict_n",
        "_free",
        "_index",
        "_intern",
        "_lrus",
        "_match",
        "_names",
        "_slot_of",
        "implementation",
    )

    def __init__(self, loops: Loops = ACTIVE) -> None:
        self.implementation = loops.name  # "c" or "python"
        self._match = loops.match
        self._add = loops.add
        self._evict_n = loops.evict
        self._index: dict[int, int] = {}
        self._slot_of: dict[str, int] = {}
        self._lrus: list[OrderedDict[int, None] | None] = []
        self._names: list[str] = []
        self._endpoints: list[Endpoint | None] = []
        self._free: list[int] = []  # min-heap, so masks stay as small as possible
        self._intern: dict[int, int] = {}
        self._entries = 0

    # queries ------------------------------------------------------------------------
    def __len__(self) -> int:
        """Total entries over every server's LRU (the ``prefix_indexer_size`` gauge)."""
        return self._entries

    @property
    def reverse_size(self) -> int:
        """Distinct hashes in the reverse index."""
        return len(self._index)

    def servers(self) -> list[str]:
        return list(self._slot_of)

    def server_size(self, server: str) -> int:
        slot = self._slot_of.get(server)
        lru = None if slot is None else self._lrus[slot]
        return 0 if lru is None else len(lru)

    def holders(self, block_hash: int) -> set[str]:
        """Servers whose LRU holds ``block_hash`` (for tests and debugging)."""
        mask = self._index.get(block_hash, 0)
        return {self._names[s] for s in bits(mask)}

    def match(self, hashes: Sequence[int]) -> dict[int, int]:
        """Slot → number of blocks held, walking ``hashes`` until the first block nobody holds.

        As in GIE, every server holding a walked block counts it, contiguous or not."""
        return self._match(self._index, hashes)

    def name_of(self, slot: int) -> str:
        return self._names[slot]

    def endpoint_of(self, slot: int) -> Endpoint | None:
        """The endpoint object last recorded for ``slot`` (to map matches back cheaply)."""
        return self._endpoints[slot]

    def dump(self) -> dict[str, list[int]]:
        """Every server's hashes, least recently used first (``add`` of each list rebuilds the index)."""
        out: dict[str, list[int]] = {}
        for server, slot in self._slot_of.items():
            lru = self._lrus[slot]
            if lru:
                out[server] = list(lru)
        return out

    # updates ------------------------------------------------------------------------
    def add(self, server: str, endpoint: Endpoint | None, hashes: Sequence[int], capacity: int) -> None:
        """Record that ``server`` now holds ``hashes`` (most recent last), within ``capacity`` entries."""
        slot = self._slot_of.get(server)
        if slot is None:
            slot = self._new_slot(server)
        lru = self._lrus[slot]
        assert lru is not None
        if endpoint is not None:  # a peer's insertion (no object) keeps the one routing recorded
            self._endpoints[slot] = endpoint
        intern = self._intern
        # held hashes move to the recent end, new ones are inserted, then the oldest evicted
        self._entries += self._add(self._index, intern, lru, hashes, 1 << slot, capacity)
        if len(intern) > _INTERN_MAX:
            intern.clear()

    def remove_server(self, server: str) -> None:
        """Forget everything ``server`` holds and recycle its slot."""
        slot = self._slot_of.pop(server, None)
        if slot is None:
            return
        lru = self._lrus[slot]
        assert lru is not None
        self._evict(slot, lru, len(lru))
        self._lrus[slot] = None
        self._endpoints[slot] = None
        self._names[slot] = ""
        heapq.heappush(self._free, slot)

    def _evict(self, slot: int, lru: OrderedDict[int, None], count: int) -> None:
        self._evict_n(self._index, self._intern, lru, 1 << slot, count)
        self._entries -= count

    def _new_slot(self, server: str) -> int:
        if self._free:
            slot = heapq.heappop(self._free)
            self._lrus[slot] = OrderedDict()
            self._names[slot] = server
        else:
            slot = len(self._lrus)
            self._lrus.append(OrderedDict())
            self._names.append(server)
            self._endpoints.append(None)
        self._slot_of[server] = slot
        return slot
