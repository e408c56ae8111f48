"""``global-strict-fairness-policy``: serve the best head across every flow of the band."""

from __future__ import annotations

import heapq
import itertools
from typing import ClassVar, Final

from epp.flowcontrol.api import FairnessState, FlowQueueView, QueuedItem
from epp.plugin.base import PluginBase

_MIN_REBUILD: Final = 64


class _BestHead:
    """A lazy min-heap of queue heads keyed by their order; entries go stale as heads change.

    An entry is live while its queue's head is still its item; ``pick`` pops stale entries
    off the top, and the heap is rebuilt from live entries when stale ones dominate it.
    """

    __slots__ = ("_heap", "_pushes", "_rebuild_at")

    def __init__(self) -> None:
        # (order, push number, queue, item): an item may be pushed twice (displaced, then head
        # again); the push number keeps tuple comparison away from the queue objects.
        self._heap: list[tuple[tuple[float, float, int], int, FlowQueueView, QueuedItem]] = []
        self._pushes = itertools.count()
        self._rebuild_at = _MIN_REBUILD

    def head_changed(self, queue: FlowQueueView) -> None:
        item = queue.head()
        if item is None:
            return  # its entries are now stale
        heapq.heappush(self._heap, (item.order, next(self._pushes), queue, item))
        if len(self._heap) > self._rebuild_at:
            self._compact()

    def pick(self) -> FlowQueueView | None:
        heap = self._heap
        while heap:
            _, _, queue, item = heap[0]
            if queue.head() is item:
                return queue
            heapq.heappop(heap)
        return None

    def _compact(self) -> None:
        seen: set[int] = set()
        live = []
        for entry in self._heap:
            _, _, queue, item = entry
            if queue.head() is item and id(item) not in seen:
                seen.add(id(item))
                live.append(entry)
        heapq.heapify(live)
        self._heap = live
        self._rebuild_at = max(_MIN_REBUILD, 2 * len(live))


class GlobalStrictFairnessPolicy(PluginBase):
    """No fairness between flows: the band dispatches the best request among all flow heads,
    "best" by the band's ordering policy.  Type ``global-strict-fairness-policy``.

    The band's default.  With FCFS ordering the band behaves as one FIFO queue; with EDF
    or SLO ordering, as one deadline queue.  O(log flows) per dispatch.
    Consumes: nothing.  Parameters: none.
    """

    TYPE: ClassVar[str] = "global-strict-fairness-policy"

    def new_state(self) -> FairnessState:
        return _BestHead()
