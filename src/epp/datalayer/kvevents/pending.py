"""Blocks routed to an endpoint whose engine has not reported storing them yet (speculative entries).

An engine publishes BlockStored only after it has prefilled a request, so a request that is routed
but still queued or prefilling is invisible to an index built from events alone.  Under load the
queues are seconds long: the next requests of the same prefix find no endpoint holding it and
spread over the fleet, each paying the full prefill (SGLang's router inserts into its tree at
routing time, Dynamo's KV router counts the blocks of in-flight requests, for the same reason).

So at routing time all the request's blocks are recorded here as pending on the picked endpoint,
for as long as the request is in flight: one routed request is one ``PendingRecord``, and a block
several in-flight requests wait for on one endpoint is reference-counted there.  While the engine
reports the block (BlockStored) the event index holds it and the pending entry adds nothing to a
match; it matters when the engine evicts the block (BlockRemoved) while a request still queued
there needs it: that request will compute and store it again, so the next request of the prefix
belongs there too.  (Recording only the blocks the endpoint had not reported lost exactly this
case under overload: a group's prefix evicted while its request waited there sent the group's next
request elsewhere, and both paid the whole prefill.)  A record ends with its
request (``grace`` seconds later, for events still on the wire) or ``ttl`` seconds after routing
at the latest (a request whose end is never seen); AllBlocksCleared (a reset, a restart) drops
every entry of the endpoint.  Each endpoint holds at most ``capacity`` pending blocks; past that
the oldest routed requests' entries go first.

Active-active replicas: a request a peer routed is as invisible to this replica's events as its
own, so peers' routed records are added here too (``add_peer``) under the peer's identity.  This
replica never sees their requests end, so they last their ``ttl``; ``forget(origin)`` drops a
departed peer's at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from epp.plugin.counts import subtract


@dataclass(slots=True, eq=False)
class PendingRecord:
    """The pending blocks one routed request added on one endpoint slot."""

    slot: int
    hashes: tuple[int, ...]
    deadline: float
    live: bool = True
    computed: bool = False  # its request had its first byte: the engine has computed the blocks
    computed_at: float = 0.0  # when (monotonic), for how long it has been decoding
    ended: bool = False  # its request finished (the entry lives on for ``grace``)


class PendingBlocks:
    """Hash → bitmask of the endpoint slots a routed request is expected to fill it on."""

    __slots__ = (
        "_ended",
        "_ending",
        "_origins",
        "_records",
        "_refs",
        "_starting",
        "bits",
        "capacity",
        "grace",
        "ttl",
    )

    def __init__(self, ttl: float, grace: float, capacity: int) -> None:
        if ttl <= 0 or grace < 0 or capacity <= 0:
            raise ValueError(f"need ttl > 0, grace >= 0, capacity > 0; got {ttl}, {grace}, {capacity}")
        self.ttl = ttl
        self.grace = grace
        self.capacity = capacity
        self.bits: dict[int, int] = {}  # read by BlockIndex.match
        self._refs: list[dict[int, int]] = []  # per slot: hash -> live records holding it
        self._ended: list[dict[int, int]] = []  # per slot: hash -> those of them whose request ended
        self._records: deque[PendingRecord] = deque()  # by routing time (deadline = routed + ttl)
        self._ending: deque[PendingRecord] = deque()  # ended requests, by end time (+ grace)
        # (slot, first hash) -> the records of requests still in flight there (``holders``)
        self._starting: dict[tuple[int, int], set[PendingRecord]] = {}
        self._origins: dict[str, deque[PendingRecord]] = {}  # peer -> the records it routed, oldest first

    def _slot(self, slot: int) -> dict[int, int]:
        while len(self._refs) <= slot:
            self._refs.append({})
            self._ended.append({})
        return self._refs[slot]

    def add(self, slot: int, hashes: Sequence[int], now: float) -> PendingRecord | None:
        """Record ``hashes`` as pending on ``slot`` for one routed request."""
        self.expire(now)
        if not hashes:
            return None
        refs = self._slot(slot)
        bits = self.bits
        bit = 1 << slot
        for h in hashes:
            n = refs.get(h)
            if n is None:
                refs[h] = 1
                bits[h] = bits.get(h, 0) | bit
            else:
                refs[h] = n + 1
        record = PendingRecord(slot, tuple(hashes), now + self.ttl)
        self._records.append(record)
        self._starting.setdefault((slot, record.hashes[0]), set()).add(record)
        records = self._records
        while len(refs) > self.capacity and records:
            self._release(records.popleft())
        return record

    def add_peer(self, origin: str, slot: int, hashes: Sequence[int], now: float) -> None:
        """Record a request ``origin`` routed to ``slot``: pending here until ``ttl`` or ``forget``."""
        record = self.add(slot, hashes, now)
        if record is None:
            return
        mine = self._origins.get(origin)
        if mine is None:
            mine = self._origins[origin] = deque()
        while mine and not mine[0].live:  # released by expiry or capacity: keep the deque bounded
            mine.popleft()
        mine.append(record)

    def forget(self, origin: str) -> None:
        """Drop every pending entry the peer ``origin`` added."""
        for record in self._origins.pop(origin, ()):
            self._release(record)

    def live_records(self) -> list[PendingRecord]:
        """The records of requests still in flight (not ended), oldest first."""
        return [r for r in self._records if r.live and not r.ended]

    def end(self, record: PendingRecord, now: float) -> None:
        """The request finished: what it left unreported goes after ``grace`` (events still coming)."""
        if not record.live:
            return
        record.ended = True
        self._unstart(record)
        ended = self._ended[record.slot]
        refs = self._refs[record.slot]
        for h in record.hashes:
            if h in refs:
                ended[h] = ended.get(h, 0) + 1
        deadline = now + self.grace
        if deadline < record.deadline:
            record.deadline = deadline
            self._ending.append(record)

    def expire(self, now: float) -> None:
        for queue in (self._ending, self._records):
            while queue and (not queue[0].live or queue[0].deadline <= now):
                self._release(queue.popleft())

    def clear(self, slot: int) -> None:
        """Drop every pending entry of ``slot`` (its cache was cleared, or the endpoint went)."""
        if slot < len(self._refs):
            refs = self._refs[slot]
            for h in list(refs):
                self._drop(slot, refs, h)
            self._ended[slot].clear()

    def _drop(self, slot: int, refs: dict[int, int], h: int) -> None:
        del refs[h]
        left = self.bits[h] & ~(1 << slot)
        if left:
            self.bits[h] = left
        else:
            del self.bits[h]

    def _release(self, record: PendingRecord) -> None:
        if not record.live:
            return
        record.live = False
        if not record.ended:
            self._unstart(record)
        refs = self._refs[record.slot]
        ended = self._ended[record.slot] if record.ended else None
        for h in record.hashes:
            n = refs.get(h)
            if n is None:  # the slot's entries were cleared
                continue
            if ended is not None:
                subtract(ended, h, 1)
            if n > 1:
                refs[h] = n - 1
            else:
                self._drop(record.slot, refs, h)

    def _unstart(self, record: PendingRecord) -> None:
        key = (record.slot, record.hashes[0])
        starting = self._starting.get(key)
        if starting is not None:
            starting.discard(record)
            if not starting:
                del self._starting[key]

    # queries ------------------------------------------------------------------------------
    def holds(self, slot: int, h: int) -> bool:
        """Whether a live routed request on ``slot`` is expected to hold or compute block ``h``."""
        return slot < len(self._refs) and h in self._refs[slot]

    def blocks(self, slot: int) -> int:
        return len(self._refs[slot]) if slot < len(self._refs) else 0

    def in_flight(self, slot: int, h: int) -> bool:
        """Whether a request still in flight on ``slot`` (not one in its grace after ending) holds or
        will compute block ``h``: the engine keeps it however full its cache."""
        if slot >= len(self._refs):
            return False
        n = self._refs[slot].get(h, 0)
        return n > self._ended[slot].get(h, 0)

    def holders(self, slot: int, first: int) -> tuple[int, int, float]:
        """Requests in flight on ``slot`` whose blocks start with ``first``: (computed, not yet, when
        the latest computed one had its first byte, 0.0 if none): the latest is the one likely to
        decode, and keep the prefix in use, the longest."""
        done = 0
        latest = 0.0
        records = self._starting.get((slot, first), ())
        for r in records:
            if r.computed:
                done += 1
                if r.computed_at > latest:
                    latest = r.computed_at
        return done, len(records) - done, latest

    def __len__(self) -> int:
        return len(self.bits)

    def records(self) -> int:
        return sum(1 for r in self._records if r.live)
