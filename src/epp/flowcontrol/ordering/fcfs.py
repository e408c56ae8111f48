"""``fcfs-ordering-policy``: first come, first served."""

from __future__ import annotations

from typing import ClassVar

from epp.flowcontrol.api import QueueCapability, QueuedItem
from epp.plugin.base import PluginBase


class FcfsOrderingPolicy(PluginBase):
    """Dispatch a flow's requests in the order flow control accepted them.  Type ``fcfs-ordering-policy``.

    The band's default.  Queue: a FIFO list.  Key: enqueue time, so that
    ``global-strict-fairness-policy`` serves the oldest head across flows.
    Consumes: nothing.  Parameters: none.
    """

    TYPE: ClassVar[str] = "fcfs-ordering-policy"
    REQUIRED_CAPABILITIES: ClassVar[frozenset[QueueCapability]] = frozenset()

    def order_key(self, item: QueuedItem) -> tuple[float, float]:
        return (item.enqueued_at, 0.0)
