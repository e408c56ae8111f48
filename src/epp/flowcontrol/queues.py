"""Per-flow queues: a FIFO list, and a heap for deadline orderings; chosen by capability."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from typing import Any, ClassVar, Final, Generic, Protocol, TypeVar

from epp.errors import ConfigError
from epp.flowcontrol.api import OrderingPolicy, QueueCapability

_COMPACT_MIN: Final = 32


class Entry(Protocol):
    """What a queue needs of an item: its order, and a flag the queue keeps current."""

    order: tuple[float, float, int]
    queued: bool


E = TypeVar("E", bound=Entry)


class ListQueue(Generic[E]):
    """Arrival order.  O(1) push and pop; O(n) removal of a cancelled item (a C-level scan)."""

    NAME: ClassVar[str] = "ListQueue"
    CAPABILITIES: ClassVar[frozenset[QueueCapability]] = frozenset({QueueCapability.FIFO})

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: deque[E] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def head(self) -> E | None:
        return self._items[0] if self._items else None

    def push(self, item: E) -> bool:
        """Add ``item``; True when it became the head."""
        item.queued = True
        self._items.append(item)
        return len(self._items) == 1

    def pop(self) -> E:
        item = self._items.popleft()
        item.queued = False
        return item

    def remove(self, item: E) -> bool:
        """Take out a queued ``item``; True when it was the head."""
        was_head = self._items[0] is item
        self._items.remove(item)  # items compare by identity
        item.queued = False
        return was_head

    def items(self) -> Iterator[E]:
        """The queued items, head first (arrival order)."""
        return iter(self._items)

    def drain(self) -> list[E]:
        items = list(self._items)
        self._items.clear()
        for item in items:
            item.queued = False
        return items


class HeapQueue(Generic[E]):
    """Smallest ``order`` first.  O(log n) push and pop; removal leaves a tombstone, and the heap
    is compacted once tombstones outnumber live items, so memory stays O(live)."""

    NAME: ClassVar[str] = "HeapQueue"
    CAPABILITIES: ClassVar[frozenset[QueueCapability]] = frozenset({QueueCapability.PRIORITY_CONFIGURABLE})

    __slots__ = ("_heap", "_live")

    def __init__(self) -> None:
        self._heap: list[tuple[tuple[float, float, int], E]] = []  # orders are unique
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def head(self) -> E | None:
        return self._heap[0][1] if self._heap else None  # the top is always live

    def push(self, item: E) -> bool:
        item.queued = True
        heapq.heappush(self._heap, (item.order, item))
        self._live += 1
        return self._heap[0][1] is item

    def pop(self) -> E:
        item = heapq.heappop(self._heap)[1]
        item.queued = False
        self._live -= 1
        self._drop_dead_top()
        return item

    def remove(self, item: E) -> bool:
        was_head = self._heap[0][1] is item
        item.queued = False
        self._live -= 1
        if was_head:
            heapq.heappop(self._heap)
            self._drop_dead_top()
        elif len(self._heap) > _COMPACT_MIN and len(self._heap) > 2 * self._live:
            self._heap = [entry for entry in self._heap if entry[1].queued]
            heapq.heapify(self._heap)
        return was_head

    def items(self) -> Iterator[E]:
        """The queued items, in no particular order."""
        return (entry[1] for entry in self._heap if entry[1].queued)

    def drain(self) -> list[E]:
        items = [entry[1] for entry in self._heap if entry[1].queued]
        self._heap.clear()
        self._live = 0
        for item in items:
            item.queued = False
        return items

    def _drop_dead_top(self) -> None:
        heap = self._heap
        while heap and not heap[0][1].queued:
            heapq.heappop(heap)


QUEUE_TYPES: Final = (ListQueue, HeapQueue)


def queue_type(ordering: OrderingPolicy) -> type[ListQueue[Any]] | type[HeapQueue[Any]]:
    """The queue a band with this ordering uses: the list unless the policy needs more.

    GIE's rule and message (gie-inventory §5.2); raises ConfigError when no queue fits.
    """
    required = ordering.REQUIRED_CAPABILITIES
    for cls in QUEUE_TYPES:
        if required <= cls.CAPABILITIES:
            return cls
    default = QUEUE_TYPES[0]
    missing = sorted(required - default.CAPABILITIES)[0]
    raise ConfigError(
        f'policy "{ordering.typed_name.name}" is not compatible with queue "{default.NAME}": '
        f'missing capability "{missing}"'
    )
