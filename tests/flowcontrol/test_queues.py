"""Per-flow queues: head tracking on push/pop/remove, bounded tombstones, and queue choice by capability."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

from epp.errors import ConfigError
from epp.flowcontrol.api import QueueCapability, QueuedItem
from epp.flowcontrol.ordering.edf import EdfOrderingPolicy
from epp.flowcontrol.ordering.fcfs import FcfsOrderingPolicy
from epp.flowcontrol.ordering.slo_deadline import SloDeadlineOrderingPolicy
from epp.flowcontrol.queues import HeapQueue, ListQueue, queue_type
from epp.plugin.base import NoParams, PluginBase
from epp.testing.plugins import FakeHandle


@dataclass(eq=False)
class _Entry:
    name: str
    order: tuple[float, float, int]
    queued: bool = field(default=False)


def _entries(*orders: float) -> list[_Entry]:
    return [_Entry(f"e{i}", (o, 0.0, i)) for i, o in enumerate(orders)]


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        pytest.param(ListQueue, ["e0", "e1", "e2", "e3"], id="list-keeps-arrival-order"),
        pytest.param(HeapQueue, ["e2", "e0", "e3", "e1"], id="heap-smallest-order-first"),
    ],
)
def test_pop_order(cls: Any, expected: list[str]) -> None:
    """The list pops in arrival order; the heap by smallest order."""
    q = cls()
    for e in _entries(2.0, 9.0, 1.0, 5.0):
        q.push(e)
    assert [q.pop().name for _ in range(len(q))] == expected
    assert q.head() is None


@pytest.mark.parametrize("cls", [ListQueue, HeapQueue])
def test_head_changes_are_reported(cls: Any) -> None:
    """push and remove say whether the head changed: fairness policies rely on that signal."""
    q = cls()
    a, b, c = _entries(1.0, 2.0, 3.0)
    assert q.push(a) is True
    assert q.push(b) is False
    assert q.push(c) is False
    assert q.remove(b) is False
    assert (len(q), q.head()) == (2, a)
    assert q.remove(a) is True
    assert (len(q), q.head()) == (1, c)
    assert (a.queued, b.queued, c.queued) == (False, False, True)


def test_heap_push_of_better_item_becomes_head() -> None:
    """A heap push that beats the current head reports a head change."""
    q: HeapQueue[_Entry] = HeapQueue()
    late, early = _entries(5.0, 1.0)
    q.push(late)
    assert q.push(early) is True
    assert q.head() is early


def test_heap_tombstones_stay_bounded() -> None:
    """Removing most items from the middle compacts the heap: memory tracks live items."""
    q: HeapQueue[_Entry] = HeapQueue()
    entries = _entries(*range(1000))
    for e in entries:
        q.push(e)
    for e in entries[1:900]:
        q.remove(e)
    assert len(q) == 101
    assert len(q._heap) <= 2 * 101 + 1
    assert [q.pop().name for _ in range(3)] == ["e0", "e900", "e901"]


@pytest.mark.parametrize("cls", [ListQueue, HeapQueue])
def test_drain_returns_live_items(cls: Any) -> None:
    """drain empties the queue and hands back only the items still queued."""
    q = cls()
    a, b, c = _entries(1.0, 2.0, 3.0)
    for e in (a, b, c):
        q.push(e)
    q.remove(b)
    assert sorted(e.name for e in q.drain()) == ["e0", "e2"]
    assert (len(q), a.queued, c.queued) == (0, False, False)


class _NeedsMagic(PluginBase):
    TYPE: ClassVar[str] = "test-magic-ordering"
    REQUIRED_CAPABILITIES: ClassVar[frozenset[QueueCapability]] = frozenset(
        {QueueCapability.FIFO, QueueCapability.PRIORITY_CONFIGURABLE}
    )

    def order_key(self, item: QueuedItem) -> tuple[float, float]:
        return (0.0, 0.0)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        pytest.param(FcfsOrderingPolicy, ListQueue, id="fcfs-list"),
        pytest.param(EdfOrderingPolicy, HeapQueue, id="edf-heap"),
        pytest.param(SloDeadlineOrderingPolicy, HeapQueue, id="slo-heap"),
    ],
)
def test_queue_type_by_capability(policy: Any, expected: type) -> None:
    """A band gets the list unless its ordering policy needs a priority-configurable queue."""
    assert queue_type(policy(policy.TYPE, NoParams(), FakeHandle())) is expected


def test_incompatible_policy_is_a_config_error() -> None:
    """An ordering no queue can serve fails with GIE's message."""
    with pytest.raises(
        ConfigError, match=r'^policy "magic" is not compatible with queue "ListQueue": missing'
    ):
        queue_type(_NeedsMagic("magic", NoParams(), FakeHandle()))
