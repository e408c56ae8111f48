"""``round-robin-fairness-policy``: flows of a band take turns, one request each."""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from typing import ClassVar

from epp.flowcontrol.api import FairnessState, FlowQueueView
from epp.plugin.base import PluginBase


class _Turns:
    """Non-empty flows sorted by id, and a cursor: the id served last."""

    __slots__ = ("_ids", "_last", "_queues")

    def __init__(self) -> None:
        self._ids: list[str] = []
        self._queues: dict[str, FlowQueueView] = {}
        self._last: str | None = None

    def head_changed(self, queue: FlowQueueView) -> None:
        flow_id = queue.flow.id
        if len(queue):
            if flow_id not in self._queues:
                insort(self._ids, flow_id)
                self._queues[flow_id] = queue
        elif self._queues.pop(flow_id, None) is not None:
            del self._ids[bisect_left(self._ids, flow_id)]

    def pick(self) -> FlowQueueView | None:
        ids = self._ids
        if not ids:
            return None
        i = 0 if self._last is None else bisect_right(ids, self._last)
        if i == len(ids):
            i = 0
        flow_id = ids[i]
        self._last = flow_id
        return self._queues[flow_id]


class RoundRobinFairnessPolicy(PluginBase):
    """Serve the band's non-empty flows in turn, one request per turn, so a busy tenant
    cannot starve a quiet one.  Type ``round-robin-fairness-policy``.

    Flows are visited in fairness-id order (all flows of a band share its priority), and
    each pick starts after the flow served last, as in GIE.  O(log flows) per dispatch.
    Consumes: nothing.  Parameters: none.
    """

    TYPE: ClassVar[str] = "round-robin-fairness-policy"

    def new_state(self) -> FairnessState:
        return _Turns()
