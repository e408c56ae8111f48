"""When flow control ends in-flight requests, and how many (llm-d-router's ``RequestEvictor`` and
``ReclamationController``, docs/flow-control-eviction.md).

A request is tracked from its dispatch to an endpoint (``FlowController.placed``) until its
ext_proc stream ends (``InferenceRequest.on_closed``), if its edge can end it
(``InferenceRequest.edge``).  When a dispatch cycle stops at a band whose ceiling the pool's
saturation reaches, and that band or a later blocked one holds queued requests of a priority
strictly above the next victim's, one *decision* evicts

    n = max(1, ceil((saturation - ceiling - pendingReclaim) / credit)),  credit = saturation / inFlight

victims (at most 2, and only of a priority below the blocked band's), then waits: the next
decision runs once every evicted stream has ended (or 10 s passed) and a grace for the freed
capacity to show in the saturation reading has elapsed (10 ms behind the concurrency detector,
whose counters drop with the stream; 0.5 s behind a scraped detector).  All numbers are upstream's.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import structlog

from epp.flowcontrol.bands import Band
from epp.flowcontrol.eviction.policies import EvictionFilterPolicy, EvictionItem, EvictionOrderingPolicy
from epp.request import InferenceRequest

log = structlog.get_logger(__name__)

MAX_REVOCATIONS_PER_DECISION: Final = 2
CONFIRMATION_TIMEOUT: Final = 10.0
LEADING_SENSOR_GRACE: Final = 0.010  # the concurrency detector: the gauge drops with the stream
SCRAPED_SENSOR_GRACE: Final = 0.5  # upstream's controller default for a scraped detector


class RequestEvictor:
    """The in-flight requests and the victim queue (a heap with lazy removal: a request that
    ends leaves its entry behind, dropped when it reaches the top)."""

    __slots__ = ("_evictable", "_filter", "_heap", "_in_flight", "_listener", "_order", "_seq")

    def __init__(self, ordering: EvictionOrderingPolicy, accept: EvictionFilterPolicy) -> None:
        self._order = ordering
        self._filter = accept
        self._heap: list[tuple[tuple[float, ...], int, EvictionItem]] = []
        self._seq = itertools.count()
        self._in_flight = 0
        self._evictable = 0
        self._listener: Callable[[EvictionItem], None] | None = None

    def set_listener(self, listener: Callable[[EvictionItem], None]) -> None:
        """Called once per evicted request when its stream ends (the decision's confirmation)."""
        self._listener = listener

    def track(self, request: InferenceRequest, now: float) -> EvictionItem | None:
        """Track a request its edge can end; None (untracked) when it cannot."""
        if request.edge is None:
            return None
        item = EvictionItem(request, now)
        self._in_flight += 1
        if self._filter.accept(item):
            item.evictable = True
            self._evictable += 1
            heapq.heappush(self._heap, (self._order.key(item), next(self._seq), item))
        request.on_closed = lambda: self.untrack(item)
        return item

    def untrack(self, item: EvictionItem) -> None:
        """Its stream ended (idempotent)."""
        if not item.tracked:
            return
        item.tracked = False
        self._in_flight -= 1
        if item.evictable and not item.evicted:
            self._evictable -= 1
        if item.evicted and self._listener is not None:
            self._listener(item)

    def _head(self) -> EvictionItem | None:
        heap = self._heap
        while heap:
            item = heap[0][2]
            if item.tracked and not item.evicted:
                return item
            heapq.heappop(heap)
        return None

    def peek_victim_priority(self) -> int | None:
        head = self._head()
        return None if head is None else head.priority

    def evict_n(
        self, n: int, priority_bound: int, issued: Callable[[EvictionItem], None] | None = None
    ) -> list[EvictionItem]:
        """Evict up to ``n`` victims in order, stopping at the first whose priority is not
        strictly below ``priority_bound`` (no victim at or above the demand's band).

        ``issued`` sees each victim before its edge is signalled: an edge may end the stream at
        once (the h2 transport writes the reply), and the confirmation must find it outstanding.
        """
        evicted: list[EvictionItem] = []
        while len(evicted) < n:
            item = self._head()
            if item is None or item.priority >= priority_bound:
                break
            heapq.heappop(self._heap)
            item.evicted = True
            self._evictable -= 1
            if issued is not None:
                issued(item)
            edge = item.request.edge
            if edge is not None:
                edge.evict()
            evicted.append(item)
            log.info(
                "flow_control_evicted",
                request_id=item.request.request_id,
                priority=item.priority,
                demand_priority=priority_bound,
            )
        return evicted

    def stats(self) -> tuple[int, int]:
        """(in-flight requests tracked, how many of them are evictable)."""
        return self._in_flight, self._evictable


@dataclass(slots=True)
class _Debit:
    credit: float
    since: float  # issued at (outstanding) or expiring at (cooling)


class ReclamationController:
    """Sizing and stop-and-wait pacing of eviction decisions (upstream's, unchanged)."""

    __slots__ = (
        "_cooling",
        "_evictor",
        "_grace",
        "_max",
        "_outstanding",
        "_pending",
        "_timeout",
        "revocations",
    )

    def __init__(
        self,
        evictor: RequestEvictor,
        *,
        grace: float,
        max_revocations: int = MAX_REVOCATIONS_PER_DECISION,
        timeout: float = CONFIRMATION_TIMEOUT,
    ) -> None:
        self._evictor = evictor
        self._grace = grace
        self._max = max_revocations
        self._timeout = timeout
        self._outstanding: dict[EvictionItem, _Debit] = {}
        self._cooling: list[_Debit] = []
        self._pending = 0.0  # pendingReclaim, in saturation units
        self.revocations = 0  # issued, ever (debug state)

    def gate_open(self, now: float) -> bool:
        """Nothing outstanding and nothing cooling: a new decision may run."""
        if self._outstanding:
            for item, debit in list(self._outstanding.items()):
                if now - debit.since >= self._timeout:  # a hung stream must not hold the gate
                    del self._outstanding[item]
                    self._cooling.append(_Debit(debit.credit, now + self._grace))
                    log.info("flow_control_eviction_unconfirmed", request_id=item.request.request_id)
        if self._cooling:
            kept = [d for d in self._cooling if now < d.since]
            for d in self._cooling:
                if now >= d.since:
                    self._pending -= d.credit
            self._cooling = kept
            self._pending = max(self._pending, 0.0)
        return not self._outstanding and not self._cooling

    def reclaim(self, saturation: float, ceiling: float, demand_priority: int, now: float) -> int:
        """One sizing decision; returns how many requests it evicted."""
        in_flight, evictable = self._evictor.stats()
        if in_flight <= 0 or evictable <= 0:
            return 0
        credit = saturation / in_flight
        if credit <= 0 or not math.isfinite(credit):
            return 0
        net = saturation - ceiling - self._pending
        if net < 0 or (net == 0 and self._pending > 0):
            return 0
        n = min(max(1, math.ceil(net / credit)), self._max, evictable)

        def issued(item: EvictionItem) -> None:
            self._outstanding[item] = _Debit(credit, now)
            self._pending += credit

        evicted = self._evictor.evict_n(n, demand_priority, issued)
        self.revocations += len(evicted)
        return len(evicted)

    def confirm(self, item: EvictionItem, now: float) -> None:
        """An evicted request's stream ended: its debit cools for the grace, then expires."""
        debit = self._outstanding.pop(item, None)
        if debit is not None:
            self._cooling.append(_Debit(debit.credit, now + self._grace))


class InFlightEviction:
    """What the flow controller holds when ``flowControl.enableEviction`` is on."""

    __slots__ = ("_clock", "_warned", "evictor", "reclamation")

    def __init__(
        self,
        ordering: EvictionOrderingPolicy,
        accept: EvictionFilterPolicy,
        *,
        grace: float,
        clock: Callable[[], float],
    ) -> None:
        self._clock = clock
        self._warned = False  # the unavailable-mode warning, once
        self.evictor = RequestEvictor(ordering, accept)
        self.reclamation = ReclamationController(self.evictor, grace=grace)
        self.evictor.set_listener(lambda item: self.reclamation.confirm(item, self._clock()))

    def placed(self, request: InferenceRequest) -> None:
        """The request reached its endpoint: track it, if its edge can end it."""
        if self.evictor.track(request, self._clock()) is None and not self._warned:
            self._warned = True
            log.warning(
                "flow_control_eviction_unavailable",
                request_id=request.request_id,
                reason="the EPP can end an in-flight request only while Envoy sends it the response: "
                "set the ext_proc response_body_mode to FULL_DUPLEX_STREAMED; requests on this "
                "stream are never evicted",
            )

    def maybe_reclaim(
        self, saturation: float, bands: Sequence[Band], ceilings: Sequence[float], blocked: int
    ) -> None:
        """Upstream's ``maybeReclaim`` on a head-of-line break at band index ``blocked`` (bands
        ordered highest priority first, ``ceilings`` aligned with them)."""
        if not self.reclamation.gate_open(self._clock()):
            return
        victim = self.evictor.peek_victim_priority()
        if victim is None:
            return
        for band, ceiling in zip(bands[blocked:], ceilings[blocked:], strict=False):
            if band.priority <= victim:
                return
            # a zero ceiling: the band must never dispatch, no reclamation can unblock it
            if ceiling <= 0 or saturation < ceiling or not band.count:
                continue
            self.reclamation.reclaim(saturation, ceiling, band.priority, self._clock())
            return

    def debug_state(self) -> dict[str, int]:
        in_flight, evictable = self.evictor.stats()
        return {"inFlight": in_flight, "evictable": evictable, "evicted": self.reclamation.revocations}
