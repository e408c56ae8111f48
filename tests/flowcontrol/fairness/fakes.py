"""A plain flow queue for fairness-policy tests: sorted items, no controller."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from epp.flowcontrol.api import FlowKey
from epp.request import InferenceRequest


@dataclass(eq=False)
class FakeItem:
    order: tuple[float, float, int]
    request: InferenceRequest = field(default_factory=lambda: InferenceRequest(request_id="x", headers={}))
    enqueued_at: float = 0.0
    ttl: float = 0.0


class FakeQueue:
    """Items kept sorted by order; ``head()`` is the smallest."""

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
        bisect.insort(self.items, item, key=lambda x: x.order)
        return self.items[0] is item

    def push_front(self, item: FakeItem) -> None:
        self.items.insert(0, item)

    def pop(self) -> FakeItem:
        return self.items.pop(0)
