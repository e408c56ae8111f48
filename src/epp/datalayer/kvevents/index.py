"""Which endpoint holds which KV block, as the engines reported it; bounded per endpoint.

One dict maps a block's 64-bit hash to a bitmask of the endpoints holding it (one bit per
endpoint slot), so matching a request costs O(prefix blocks + endpoints): walk the request's
block hashes while any endpoint still holds the whole prefix so far, and note each endpoint's
run length when it drops out.  Each endpoint also keeps an LRU of its blocks, capped at
``capacity``: an engine's evictions normally arrive as BlockRemoved, the cap bounds memory when
they do not (lost events, a wrong capacity).

Each endpoint has a consistency state kept by the subscriber (``EndpointState``): while it is
inconsistent (a sequence gap, a restart seen mid-stream, a silent publisher, a block-size or
hash mismatch) the scorer does not trust this index for it and falls back to the approximate one.

``pending`` holds the blocks of requests routed and still in flight (``pending.PendingBlocks``);
they count while their requests are in flight (a block the events report counts once), and a
cleared cache drops them.

Recency: each endpoint's LRU also stamps its blocks with a per-endpoint clock, advanced by stores
and by ``touch`` (the scorer touches a request's blocks, tail first, when the request ends: that is
when the engine puts them on its free queue, tail first).  ``older`` estimates how many of the
endpoint's blocks sit before a block in that order, i.e. how many the engine would evict first:
what the scorer's eviction-aware prediction needs (will the prefix still be there when a request
queued behind others runs?).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from epp.datalayer.kvevents.pending import PendingBlocks


@dataclass(slots=True)
class EndpointState:
    """The event stream of one endpoint as the subscriber sees it."""

    name: str
    slot: int
    consistent: bool = False  # False until the first batch arrives
    reason: str = "no events yet"
    last_seq: int = -1  # the last sequence number applied, -1 before any
    last_event_at: float = 0.0  # time.monotonic() of the last batch
    batches: int = 0
    events: int = 0
    gaps: int = 0
    restarts: int = 0
    replays: int = 0
    clears: int = 0
    mismatches: int = 0
    mismatch: str = ""  # the configuration mismatch in force (block_size, hash_scheme) until a restart
    verified: int = 0  # sampled first blocks whose hash the configured scheme reproduced
    verify_failures: int = 0
    rebuilding: bool = False  # after an unreplayable gap, until the engine's cache is known complete
    transitions: list[tuple[float, bool, str]] = field(default_factory=list)  # bounded history

    def mark(self, consistent: bool, reason: str, now: float) -> bool:
        """Set the state; True when it changed."""
        if consistent == self.consistent and reason == self.reason:
            return False
        changed = consistent != self.consistent
        self.consistent = consistent
        self.reason = reason
        if changed:
            self.transitions.append((now, consistent, reason))
            del self.transitions[:-16]
        return changed


class BlockIndex:
    """Block hash → endpoints holding it, with a per-endpoint LRU capped at ``capacity`` blocks."""

    __slots__ = ("_clock", "_free", "_gone", "_lru", "_owners", "_slots", "capacity", "pending", "states")

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be > 0, got {capacity}")
        self.capacity = capacity
        self._owners: dict[int, int] = {}
        self._slots: dict[str, int] = {}
        self._lru: list[OrderedDict[int, int]] = []  # per slot: hash -> recency stamp, oldest first
        self._clock: list[int] = []  # per slot: the next stamp
        # per slot: blocks the engine reported removing and has not stored again, the latest
        # ``capacity`` of them (``evicted``)
        self._gone: list[OrderedDict[int, None]] = []
        self._free: list[int] = []
        self.states: dict[str, EndpointState] = {}
        self.pending = PendingBlocks(ttl=30.0, grace=2.0, capacity=capacity)

    # endpoints ----------------------------------------------------------------------------
    def add_endpoint(self, name: str) -> EndpointState:
        state = self.states.get(name)
        if state is not None:
            return state
        if self._free:
            slot = self._free.pop()
        else:
            slot = len(self._lru)
            self._lru.append(OrderedDict())
            self._clock.append(0)
            self._gone.append(OrderedDict())
        self._slots[name] = slot
        state = self.states[name] = EndpointState(name, slot)
        return state

    def remove_endpoint(self, name: str) -> None:
        slot = self._slots.pop(name, None)
        if slot is None:
            return
        self._clear_slot(slot)
        del self.states[name]
        self._free.append(slot)

    def slot_of(self, name: str) -> int | None:
        return self._slots.get(name)

    # events -------------------------------------------------------------------------------
    def stored(self, slot: int, hashes: Iterable[int]) -> None:
        lru = self._lru[slot]
        owners = self._owners
        bit = 1 << slot
        clock = self._clock[slot]
        gone = self._gone[slot]
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
                lru[h] = clock
                clock += 1
                continue
            lru[h] = clock
            clock += 1
            owners[h] = owners.get(h, 0) | bit
            if gone:
                gone.pop(h, None)
        self._clock[slot] = clock
        if len(lru) > self.capacity:
            clear = ~bit
            for _ in range(len(lru) - self.capacity):
                old, _none = lru.popitem(last=False)
                left = owners[old] & clear
                if left:
                    owners[old] = left
                else:
                    del owners[old]

    def removed(self, slot: int, hashes: Iterable[int]) -> None:
        lru = self._lru[slot]
        owners = self._owners
        clear = ~(1 << slot)
        gone = self._gone[slot]
        for h in hashes:
            if lru.pop(h, -1) >= 0:  # present (stamps are >= 0)
                left = owners[h] & clear
                if left:
                    owners[h] = left
                else:
                    del owners[h]
                gone[h] = None
        while len(gone) > self.capacity:
            gone.popitem(last=False)

    def clear(self, slot: int) -> None:
        self._clear_slot(slot)

    def _clear_slot(self, slot: int) -> None:
        self.pending.clear(slot)
        lru = self._lru[slot]
        owners = self._owners
        clear = ~(1 << slot)
        for h in lru:
            left = owners[h] & clear
            if left:
                owners[h] = left
            else:
                del owners[h]
        lru.clear()
        self._gone[slot].clear()

    def touch(self, slot: int, hashes: Iterable[int]) -> None:
        """The engine used these blocks just now (in this order): the most recent go last.  Blocks the
        endpoint does not hold are skipped."""
        lru = self._lru[slot]
        clock = self._clock[slot]
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
                lru[h] = clock
                clock += 1
        self._clock[slot] = clock

    # queries ------------------------------------------------------------------------------
    def blocks(self, slot: int) -> int:
        return len(self._lru[slot])

    def evicted(self, slot: int, h: int) -> bool:
        """Whether the engine reported removing ``h`` (and has not stored it again since)."""
        return h in self._gone[slot]

    def older(self, slot: int, h: int) -> int:
        """About how many of the slot's blocks are less recent than ``h`` (-1: ``h`` not held).

        Stamps are dense when blocks leave in LRU order (the engine's evictions) and thin out when
        they leave out of order (a touch moves one), so the count is the stamp distance to the
        oldest block scaled by the blocks held per stamp: O(1), exact for a pure LRU."""
        lru = self._lru[slot]
        stamp = lru.get(h)
        if stamp is None:
            return -1
        oldest = lru[next(iter(lru))]
        span = self._clock[slot] - oldest
        return round((stamp - oldest) * len(lru) / span) if span > 0 else 0

    def __len__(self) -> int:
        """Distinct block hashes held by any endpoint."""
        return len(self._owners)

    def match(self, hashes: list[int], mask: int, *, pending: bool = False) -> dict[int, int]:
        """Slot → length of the longest run of ``hashes`` from the start that the slot holds, for
        the slots in ``mask`` with a run of at least one block.  ``pending``: a block pending on a
        slot counts as held (``PendingBlocks``)."""
        owners = self._owners
        if pending and self.pending.bits:
            return self._match_pending(hashes, mask)
        alive = mask
        counts: dict[int, int] = {}
        for i, h in enumerate(hashes):
            held = owners.get(h, 0) & alive
            if held != alive:
                if i:
                    dropped = alive & ~held
                    while dropped:
                        low = dropped & -dropped
                        counts[low.bit_length() - 1] = i
                        dropped ^= low
                alive = held
                if not alive:
                    return counts
        n = len(hashes)
        while alive and n:
            low = alive & -alive
            counts[low.bit_length() - 1] = n
            alive ^= low
        return counts

    def _match_pending(self, hashes: list[int], mask: int) -> dict[int, int]:
        # match()'s loop with the pending bits OR-ed into each lookup: a copy, so that the common
        # no-pending path pays no second dict lookup per block
        owners = self._owners
        extra = self.pending.bits
        alive = mask
        counts: dict[int, int] = {}
        for i, h in enumerate(hashes):
            held = (owners.get(h, 0) | extra.get(h, 0)) & alive
            if held != alive:
                if i:
                    dropped = alive & ~held
                    while dropped:
                        low = dropped & -dropped
                        counts[low.bit_length() - 1] = i
                        dropped ^= low
                alive = held
                if not alive:
                    return counts
        n = len(hashes)
        while alive and n:
            low = alive & -alive
            counts[low.bit_length() - 1] = n
            alive ^= low
        return counts
