"""``edf-ordering-policy``: earliest deadline (enqueue time + TTL) first."""

from __future__ import annotations

import math
from typing import ClassVar

from epp.flowcontrol.api import QueueCapability, QueuedItem
from epp.plugin.base import PluginBase


class EdfOrderingPolicy(PluginBase):
    """Dispatch the request whose queue deadline comes first.  Type ``edf-ordering-policy``.

    Deadline = enqueue time + effective TTL; without a TTL (``defaultRequestTTL`` 0) the
    deadline is +inf, which degrades to FCFS.  Ties go to the earlier enqueue time.
    Queue: a heap (needs ``PriorityConfigurable``).  Consumes: nothing.  Parameters: none.
    """

    TYPE: ClassVar[str] = "edf-ordering-policy"
    REQUIRED_CAPABILITIES: ClassVar[frozenset[QueueCapability]] = frozenset(
        {QueueCapability.PRIORITY_CONFIGURABLE}
    )

    def order_key(self, item: QueuedItem) -> tuple[float, float]:
        ttl = item.ttl
        deadline = item.enqueued_at + ttl if ttl > 0 else math.inf
        return (deadline, item.enqueued_at)
