"""``slo-deadline-ordering-policy``: earliest TTFT deadline (received + the TTFT SLO header) first."""

from __future__ import annotations

import math
import re
from typing import ClassVar, Final

from epp.flowcontrol.api import QueueCapability, QueuedItem
from epp.plugin.base import PluginBase
from epp.request import SLO_TTFT_HEADER, control_header

_INT64_MAX: Final = (1 << 63) - 1
_DECIMAL: Final = re.compile(r"[+-]?[0-9]+")


def slo_deadline(received_at: float, value: str | None) -> float:
    """``received_at`` + the header's milliseconds; +inf when the header is absent or not an
    integer >= 0 (Go ``strconv.ParseInt`` after trimming spaces)."""
    if not value:
        return math.inf
    text = value.strip()
    if _DECIMAL.fullmatch(text) is None:
        return math.inf
    ms = int(text)
    if ms < 0 or ms > _INT64_MAX:
        return math.inf
    return received_at + ms / 1000.0


class SloDeadlineOrderingPolicy(PluginBase):
    """Dispatch the request whose time-to-first-token SLO expires first.  Type
    ``slo-deadline-ordering-policy``.

    Deadline = the request's receive time + ``x-llm-d-slo-ttft-ms`` (or GIE's ``x-slo-ttft-ms``;
    header names are lower-cased at the edge, so the lookup is case-insensitive); requests
    without a valid header sort after every SLO-bound one.  Ties go to the earlier receive time.
    Queue: a heap (needs ``PriorityConfigurable``).  Consumes: the TTFT SLO request
    header.  Parameters: none.
    """

    TYPE: ClassVar[str] = "slo-deadline-ordering-policy"
    REQUIRED_CAPABILITIES: ClassVar[frozenset[QueueCapability]] = frozenset(
        {QueueCapability.PRIORITY_CONFIGURABLE}
    )

    def order_key(self, item: QueuedItem) -> tuple[float, float]:
        request = item.request
        return (
            slo_deadline(request.received_at, control_header(request.headers, SLO_TTFT_HEADER)),
            request.received_at,
        )
