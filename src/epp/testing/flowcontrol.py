"""Flow-control fakes: a sorted flow queue for policy tests; a detector and a usage limit the test sets."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from epp.datalayer.api import Endpoint
from epp.flowcontrol.api import FlowKey
from epp.plugin.base import NoParams, PluginBase
from epp.request import InferenceRequest
from epp.testing.plugins import FakeHandle


@dataclass(eq=False)
class FakeItem:
    """A queued request as a policy sees it; ``order`` is the queue's sort key."""

    order: tuple[float, float, int]
    request: InferenceRequest = field(default_factory=lambda: InferenceRequest(request_id="x", headers={}))
    enqueued_at: float = 0.0
    ttl: float = 0.0


class FakeQueue:
    """Items kept sorted by ``order``; ``head()`` is the smallest. ``orders`` seed one item each."""

    def __init__(self, flow_id: str, *orders: float, priority: int = 0) -> None:
        self.flow = FlowKey(flow_id, priority)
        self.items: list[FakeItem] = []
        for i, o in enumerate(orders):
            self.push(FakeItem((o, 0.0, i)))

    def __len__(self) -> int:
        return len(self.items)

    def head(self) -> FakeItem | None:
        return self.items[0] if self.items else None

    def push(self, item: FakeItem) -> bool:
        """Insert in order; True if the item became the head."""
        bisect.insort(self.items, item, key=lambda x: x.order)
        return self.items[0] is item

    def push_front(self, item: FakeItem) -> None:
        self.items.insert(0, item)

    def pop(self) -> FakeItem:
        return self.items.pop(0)


class FakeDetector(PluginBase):
    """Saturation is ``value``, or ``fn()`` when set; counts its calls."""

    TYPE: ClassVar[str] = "test-fake-detector"

    def __init__(self, value: float = 0.0, fn: Callable[[], float] | None = None) -> None:
        super().__init__("fake-detector", NoParams(), FakeHandle())
        self.value = value
        self.fn = fn
        self.calls = 0

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        self.calls += 1
        return self.fn() if self.fn is not None else self.value


class CeilingsByPriority(PluginBase):
    """A usage-limit policy with a fixed ceiling per priority (1.0 for the others)."""

    TYPE: ClassVar[str] = "test-ceilings"

    def __init__(self, ceilings: Mapping[int, float]) -> None:
        super().__init__("ceilings", NoParams(), FakeHandle())
        self.ceilings = dict(ceilings)

    def compute_limits(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]:
        return [self.ceilings.get(p, 1.0) for p in priorities]
