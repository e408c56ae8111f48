"""The victim filter and ordering of in-flight eviction, and the tracked request they judge.

llm-d-router wires ``sheddable-eviction-filter`` and ``priority-then-time-eviction-order-policy``
whenever eviction is on; both are registered types too, so a config may declare them (the
declared instance is then the one used).  Neither takes parameters.
"""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

from epp.plugin.base import PluginBase
from epp.request import InferenceRequest


class EvictionItem:
    """One request between its dispatch to an endpoint and the end of its ext_proc stream."""

    __slots__ = ("dispatched_at", "evictable", "evicted", "priority", "request", "tracked")

    def __init__(self, request: InferenceRequest, dispatched_at: float) -> None:
        self.request = request
        self.priority = request.priority
        self.dispatched_at = dispatched_at  # monotonic seconds
        self.evictable = False  # the filter accepted it: it is in the victim queue
        self.evicted = False  # its eviction was signalled; the stream has not ended yet
        self.tracked = True  # until its stream ends


@runtime_checkable
class EvictionFilterPolicy(Protocol):
    """Which in-flight requests may ever be evicted (upstream's ``EvictionFilterPolicy``)."""

    def accept(self, item: EvictionItem) -> bool: ...


@runtime_checkable
class EvictionOrderingPolicy(Protocol):
    """Victim order: the item with the smallest key is evicted first (upstream's ``Less``, as a
    sort key so the victim queue is a heap)."""

    def key(self, item: EvictionItem) -> tuple[float, ...]: ...


class SheddableEvictionFilter(PluginBase):
    """Type ``sheddable-eviction-filter``: only sheddable requests (priority < 0), the project-wide
    meaning of sheddable, may be evicted.  No parameters."""

    TYPE: ClassVar[str] = "sheddable-eviction-filter"

    def accept(self, item: EvictionItem) -> bool:
        return item.priority < 0


class PriorityThenTimeEvictionOrder(PluginBase):
    """Type ``priority-then-time-eviction-order-policy``: the lowest priority first; among equals
    the most recently dispatched (it has the least KV-cache investment to lose).  No parameters."""

    TYPE: ClassVar[str] = "priority-then-time-eviction-order-policy"

    def key(self, item: EvictionItem) -> tuple[float, ...]:
        return (item.priority, -item.dispatched_at)
