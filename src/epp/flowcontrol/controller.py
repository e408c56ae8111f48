"""The flow controller: queues requests per flow and priority band; dispatches them as the pool has room."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, cast

import structlog

from epp.config.schema import FlowControlConfig, PriorityBandConfig
from epp.datalayer import roles
from epp.datalayer.api import Endpoint
from epp.errors import ConfigError
from epp.flowcontrol.api import Outcome, SaturationDetector, TransitAwareDetector, UsageLimitPolicy
from epp.flowcontrol.bands import Band, BandPolicies, Flow, Item
from epp.flowcontrol.eviction.policies import (
    EvictionFilterPolicy,
    EvictionOrderingPolicy,
    PriorityThenTimeEvictionOrder,
    SheddableEvictionFilter,
)
from epp.flowcontrol.eviction.reclaim import LEADING_SENSOR_GRACE, SCRAPED_SENSOR_GRACE, InFlightEviction
from epp.flowcontrol.verdict import stage_saturation, verdict
from epp.metrics import disagg as disagg_metrics
from epp.metrics import series
from epp.plugin.base import Handle, NoParams, Plugin
from epp.request import InferenceRequest

if TYPE_CHECKING:  # the plan imports the controller only when the flowControl gate is on
    from epp.flowcontrol.assembly import FlowControlPlan


def in_flight_eviction(plan: FlowControlPlan, clock: Callable[[], float]) -> InFlightEviction:
    """``flowControl.enableEviction``: upstream's fixed policies (a declared instance of either type
    is the one used) and a pacing grace derived from the saturation detector, as upstream's."""
    ordering: EvictionOrderingPolicy = PriorityThenTimeEvictionOrder(
        PriorityThenTimeEvictionOrder.TYPE, NoParams(), cast(Handle, None)
    )
    accept: EvictionFilterPolicy = SheddableEvictionFilter(
        SheddableEvictionFilter.TYPE, NoParams(), cast(Handle, None)
    )
    for plugin in plan.plugins.values():
        if isinstance(plugin, PriorityThenTimeEvictionOrder):
            ordering = plugin
        elif isinstance(plugin, SheddableEvictionFilter):
            accept = plugin
    leading = plan.detector.typed_name.type == "concurrency-detector"
    grace = LEADING_SENSOR_GRACE if leading else SCRAPED_SENSOR_GRACE
    return InFlightEviction(ordering, accept, grace=grace, clock=clock)


log = structlog.get_logger(__name__)

DEFAULT_TICK: Final = 0.002  # re-check saturation this often while requests wait (GIE: 1 ms, busy)
FLOW_GC_TIMEOUT: Final = 300.0  # GIE FlowGCTimeout
BAND_GC_TIMEOUT: Final = 600.0  # GIE PriorityBandGCTimeout
GC_INTERVAL: Final = 60.0
DEBUG_MAX_FLOWS: Final = 50  # per band in debug_state: fairness ids come from a client header

# GIE's error texts (flowcontrol/types/errors.go), by outcome.
OUTCOME_MESSAGES: Final[Mapping[Outcome, str]] = {
    Outcome.DISPATCHED: "",
    Outcome.REJECTED_CAPACITY: "request rejected pre-queue: queue at capacity",
    Outcome.REJECTED_OTHER: "request rejected pre-queue: flow controller is not running",
    Outcome.EVICTED_TTL: "request evicted from queue: request TTL expired",
    Outcome.EVICTED_CONTEXT_CANCELLED: (
        "request evicted from queue: request context cancelled: context canceled"
    ),
    Outcome.EVICTED_OTHER: "request evicted from queue: flow controller is not running",
}


class FlowController:
    """Admission by queueing (gie-inventory §5.3), on one event loop: no shards, no locks.

    A request joins the queue of its flow (fairness id) in the band of its priority; bands
    unknown to the config are made on first use from ``defaultPriorityBand``.  Capacity
    (global, then band; bytes and requests) counts queued requests only.  A dispatch cycle
    reads pool saturation from the detector over *all* pool endpoints and the per-band
    ceilings from the usage-limit policy, walks the bands from the highest priority down
    and stops at the first band whose ceiling the saturation reaches -- GIE's head-of-line
    rule: a lower band never overtakes a blocked higher one.  In the first band that may
    dispatch and has work, the fairness policy picks a flow and its head is dispatched.

    Dispatching is event-driven: an arrival that could dispatch right now (no queued work
    at or above its priority, every ceiling above saturation down to its band) returns at
    once without being queued -- exactly what GIE's post-enqueue cycle would do.  Otherwise
    the dispatcher task wakes on arrivals, on ``notify()``, and every ``tick`` while work
    waits; it dispatches one request per cycle and yields to the loop between cycles.  Idle,
    it sleeps.  A dispatched request is *in transit* until the director reports it placed
    (``placed``: its endpoint's in-flight counters have it, or it failed): its data producers
    may await (a tokenizer call), and a detector that implements ``TransitAwareDetector``
    counts it meanwhile, so a burst does not pass on a reading of the pool taken before any
    of it landed.
    """

    def __init__(
        self,
        settings: FlowControlConfig,
        *,
        detector: SaturationDetector,
        usage_limit: UsageLimitPolicy,
        plugins: Mapping[str, Plugin],
        endpoints: Callable[[], Sequence[Endpoint]],
        pool_name: str = "",
        tick: float = DEFAULT_TICK,
        flow_gc_timeout: float = FLOW_GC_TIMEOUT,
        band_gc_timeout: float = BAND_GC_TIMEOUT,
        gc_interval: float = GC_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        eviction: InFlightEviction | None = None,
    ) -> None:
        self._detector = detector
        self._eviction = eviction  # flowControl.enableEviction
        self._transit_detector = detector if isinstance(detector, TransitAwareDetector) else None
        # dispatched requests that no endpoint's in-flight counters have yet (id -> request),
        # kept only for a detector that counts them
        self._transit: dict[int, InferenceRequest] = {}
        self._usage = usage_limit
        self._endpoints = endpoints
        self._pool = pool_name
        self._tick = tick
        self._flow_gc_timeout = flow_gc_timeout
        self._band_gc_timeout = band_gc_timeout
        self._gc_interval = gc_interval
        self._clock = clock
        self._max_bytes = settings.max_bytes or 0
        self._max_requests = settings.max_requests or 0
        self._ttl = settings.default_request_ttl or 0.0
        self._saturation_gauge = series.FC_POOL_SATURATION.labels(pool_name)
        self._last_saturation = math.nan
        # llm-d's per-stage gauge: decode and effective always, prefill while the pool has prefill roles
        self._decode_gauge = disagg_metrics.FC_POOL_STAGE_SATURATION.labels(pool_name, "decode")
        self._effective_gauge = disagg_metrics.FC_POOL_STAGE_SATURATION.labels(pool_name, "effective")
        self._stage_source: Sequence[Endpoint] | None = None
        self._stages: tuple[list[Endpoint], list[Endpoint]] | None = None

        self._policies: dict[str, BandPolicies] = {}
        template = settings.default_priority_band
        if template is None:
            raise ConfigError("flowControl.defaultPriorityBand: missing (pass the resolved config)")
        self._template = template
        self._policies_for(template, "flowControl.defaultPriorityBand", plugins)  # fail at startup
        self._bands: dict[int, Band] = {}
        for i, band in enumerate(settings.priority_bands):
            policies = self._policies_for(band, f"flowControl.priorityBands[{i}]", plugins)
            self._bands[band.priority] = Band(band, policies, pool_name, jit=False, now=clock())
        self._plugins = plugins
        self._ordered: list[Band] = []
        self._priorities: tuple[int, ...] = ()
        self._reorder()

        self._queued = 0  # requests waiting, all bands
        self._bytes = 0
        self._seq = 0
        self._running = False
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._cycle_failed = False

    @classmethod
    def from_plan(
        cls, plan: FlowControlPlan, *, endpoints: Callable[[], Sequence[Endpoint]], **kwargs: Any
    ) -> FlowController:
        """The controller the config asked for; ``endpoints`` is the pool (``Datastore.endpoints``)."""
        settings = plan.settings
        ref = settings.usage_limit_policy_plugin_ref
        usage = plan.plugins.get(ref)
        if not isinstance(usage, UsageLimitPolicy):
            raise ConfigError(f"flowControl.usageLimitPolicyPluginRef: '{ref}' is not a usage limit policy")
        if settings.enable_eviction and "eviction" not in kwargs:
            kwargs["eviction"] = in_flight_eviction(plan, kwargs.get("clock", time.monotonic))
        return cls(
            settings,
            detector=plan.detector,
            usage_limit=usage,
            plugins=plan.plugins,
            endpoints=endpoints,
            **kwargs,
        )

    # --- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        if self._running:
            return
        self._running = True
        self._tasks = [
            asyncio.create_task(self._dispatch_loop(), name="flow-control-dispatch"),
            asyncio.create_task(self._gc_loop(), name="flow-control-gc"),
        ]

    async def stop(self) -> None:
        """Stop dispatching; every waiting request leaves as ``EvictedOther`` (GIE's shutdown)."""
        self._running = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        for band in self._bands.values():
            for flow in band.flows.values():
                for item in flow.queue.drain():
                    self._unlinked(band, flow, item)
                    self._finish(item, Outcome.EVICTED_OTHER)
                band.fairness.head_changed(flow)

    async def __aenter__(self) -> FlowController:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def notify(self) -> None:
        """Capacity may have freed (a request completed, metrics were scraped): re-check now."""
        if self._queued:
            self._wake.set()

    # --- the request path ----------------------------------------------------------------------
    async def enqueue_and_wait(
        self, request: InferenceRequest, byte_size: int, *, ttl: float | None = None
    ) -> Outcome:
        """Wait until the request may proceed (``Dispatched``) or must not (any other outcome).

        ``ttl`` (seconds) overrides ``defaultRequestTTL`` when > 0, as GIE's
        ``InitialEffectiveTTL``.  Cancelling the awaiting task (client gone) removes the
        request from its queue at once, records ``EvictedContextCancelled`` and re-raises.
        """
        now = self._clock()
        if not self._running:
            series.FC_ENQUEUE_DURATION.labels(
                request.fairness_id, str(request.priority), Outcome.REJECTED_OTHER.value
            ).observe(self._clock() - now)
            return Outcome.REJECTED_OTHER
        band = self._bands.get(request.priority)
        if band is None:
            band = self._new_band(request.priority)
        flow = band.flows.get(request.fairness_id)
        if flow is None:  # not ``or``: an empty flow is falsy (it has a length)
            flow = band.new_flow(request.fairness_id, now)
        labels = flow.series(request.incoming_model, request.target_model)

        if self._can_dispatch_now(band):
            if self._transit_detector is not None:
                self._transit[id(request)] = request
            flow.idle_since = now
            labels.finished(Outcome.DISPATCHED, 0.0)
            flow.enqueue_observed(Outcome.DISPATCHED, self._clock() - now)
            return Outcome.DISPATCHED
        if not self._has_capacity(band, byte_size):
            flow.idle_since = now
            labels.finished(Outcome.REJECTED_CAPACITY, 0.0)
            flow.enqueue_observed(Outcome.REJECTED_CAPACITY, self._clock() - now)
            log.debug("flow_control_rejected", flow=str(flow.flow), reason="queue at capacity")
            return Outcome.REJECTED_CAPACITY

        loop = asyncio.get_running_loop()
        self._seq += 1
        effective_ttl = ttl if ttl is not None and ttl > 0 else self._ttl
        item = Item(request, byte_size, now, effective_ttl, flow, labels, loop.create_future())
        item.order = (*band.ordering.order_key(item), self._seq)
        if flow.queue.push(item):
            band.fairness.head_changed(flow)
        band.count += 1
        band.bytes += byte_size
        flow.bytes += byte_size
        flow.leases += 1
        self._queued += 1
        self._bytes += byte_size
        labels.size.inc()
        labels.bytes.inc(byte_size)
        if effective_ttl > 0:
            item.timer = loop.call_later(effective_ttl, self._expire, item)
        self._wake.set()
        flow.enqueue_observed(Outcome.NOT_YET_FINALIZED, self._clock() - now)
        try:
            return await item.future
        except asyncio.CancelledError:
            if item.queued:
                self._unlink(item)
                self._finish(item, Outcome.EVICTED_CONTEXT_CANCELLED)
            elif self._transit.pop(id(request), None) is not None and self._queued:
                self._wake.set()  # dispatched, then its client left: the room it took is free
            raise
        finally:
            labels.size.dec()
            labels.bytes.dec(byte_size)
            flow.leases -= 1
            if not flow.leases:
                flow.idle_since = self._clock()

    def placed(self, request: InferenceRequest, *, scheduled: bool) -> None:
        """A dispatched request reached its endpoint's in-flight counters (``scheduled``) or
        failed before: it no longer counts as in transit.  A failure frees the room it held."""
        if self._transit.pop(id(request), None) is not None and not scheduled and self._queued:
            self._wake.set()
        if scheduled and self._eviction is not None:
            self._eviction.placed(request)

    @property
    def in_transit(self) -> int:
        """Requests dispatched and not yet placed on an endpoint."""
        return len(self._transit)

    def pool_is_empty(self) -> bool:
        return not self._endpoints()

    @property
    def queued(self) -> int:
        """Requests waiting now, all bands."""
        return self._queued

    def debug_state(self, max_flows: int = DEBUG_MAX_FLOWS) -> dict[str, Any]:
        """``/debug/plugins/state``'s ``flowControl``: queue depths per band and flow, read-only.

        ``saturation`` is the detector's reading now (``verdict.verdict``; not the cached value
        the gauges hold); each band shows its ceiling from the usage-limit policy and whether it
        may dispatch now (``open``: saturation below its ceiling and below every higher band's --
        the head-of-line rule).  Per band, the ``max_flows`` flows with the most queued requests
        (``flowsWithQueue`` counts them all), each with its oldest request's wait.
        """
        now = self._clock()
        reading = verdict(self._detector, self._endpoints())
        saturation = reading["saturation"]
        limits = self._usage.compute_limits(saturation, self._priorities)
        bands = []
        open_ = True
        for band, ceiling in zip(self._ordered, limits, strict=False):
            open_ = open_ and saturation < ceiling
            waiting = [f for f in band.flows.values() if len(f.queue)]
            waiting.sort(key=len, reverse=True)
            flows = {}
            for flow in waiting[:max_flows]:
                oldest = min(item.enqueued_at for item in flow.queue.items())
                flows[flow.flow.id] = {
                    "queued": len(flow.queue),
                    "bytes": flow.bytes,
                    "oldestWaitSeconds": round(now - oldest, 3),
                }
            bands.append(
                {
                    "priority": band.priority,
                    "queued": band.count,
                    "bytes": band.bytes,
                    "maxRequests": band.max_requests or None,
                    "maxBytes": band.max_bytes or None,
                    "ceiling": ceiling,
                    "open": open_,
                    "flowsKnown": len(band.flows),
                    "flowsWithQueue": len(waiting),
                    "flows": flows,
                }
            )
        return {
            "running": self._running,
            "queued": self._queued,
            "inTransit": len(self._transit),
            "bytes": self._bytes,
            "maxRequests": self._max_requests or None,
            "maxBytes": self._max_bytes or None,
            "saturation": reading,
            "bands": bands,
            **({"eviction": self._eviction.debug_state()} if self._eviction is not None else {}),
        }

    def _has_capacity(self, band: Band, size: int) -> bool:
        if self._max_bytes and self._bytes + size > self._max_bytes:
            return False
        if self._max_requests and self._queued + 1 > self._max_requests:
            return False
        if band.max_bytes and band.bytes + size > band.max_bytes:
            return False
        return not (band.max_requests and band.count + 1 > band.max_requests)

    def _can_dispatch_now(self, band: Band) -> bool:
        if self._queued:
            for b in self._ordered:
                if b.priority < band.priority:
                    break
                if b.count:
                    return False
        saturation = self._saturation()
        limits = self._usage.compute_limits(saturation, self._priorities)
        for b, ceiling in zip(self._ordered, limits, strict=False):
            if saturation >= ceiling:
                return False
            if b is band:
                return True
        return False

    def _saturation(self) -> float:
        eps = self._endpoints()
        if eps is not self._stage_source:  # the datastore hands out a new tuple when the pool changes
            self._stage_source = eps
            had_prefill = self._stages is not None and bool(self._stages[0])
            self._stages = roles.partition(eps)
            if had_prefill and (self._stages is None or not self._stages[0]):
                disagg_metrics.FC_POOL_STAGE_SATURATION.remove(self._pool, "prefill")
        stages = self._stages
        if stages is None:  # no prefill role in the pool: one stage, the whole pool (GIE's reading)
            transit = self._transit_detector
            if transit is not None and self._transit:
                saturation = transit.saturation_with_transit(eps, self._transit.values())
            else:
                saturation = self._detector.saturation(eps)
            if saturation != self._last_saturation:  # it moves only when metrics do
                self._last_saturation = saturation
                self._saturation_gauge.set(saturation)
                self._decode_gauge.set(saturation)
                self._effective_gauge.set(saturation)
            return saturation
        return self._stage_saturation(eps, stages)

    def _stage_saturation(
        self, eps: Sequence[Endpoint], stages: tuple[list[Endpoint], list[Endpoint]]
    ) -> float:
        """llm-d-router's P/D reading (``verdict.stage_saturation``), and its gauges."""
        s = stage_saturation(self._detector, eps, stages)
        if s.prefill is not None:
            disagg_metrics.FC_POOL_STAGE_SATURATION.labels(self._pool, "prefill").set(s.prefill)
        if s.decode is not None:
            self._decode_gauge.set(s.decode)
        saturation = s.effective
        self._effective_gauge.set(saturation)
        if saturation != self._last_saturation:
            self._last_saturation = saturation
            self._saturation_gauge.set(saturation)
        return saturation

    # --- dispatch ------------------------------------------------------------------------------
    def dispatch_cycle(self) -> bool:
        """One GIE dispatch cycle: dispatch at most one request; True when one was."""
        if not self._queued:
            return False
        started = time.perf_counter()
        try:
            saturation = self._saturation()
            limits = self._usage.compute_limits(saturation, self._priorities)
            for i, (band, ceiling) in enumerate(zip(self._ordered, limits, strict=False)):
                if saturation >= ceiling:
                    if self._eviction is not None:  # end sheddable in-flight work for the blocked demand
                        self._eviction.maybe_reclaim(saturation, self._ordered, limits, i)
                    return False  # head-of-line: lower bands wait behind a blocked higher one
                if not band.count:
                    continue
                picked = band.fairness.pick()
                if picked is None:
                    continue
                flow = cast(Flow, picked)
                item = flow.queue.pop()
                band.fairness.head_changed(flow)
                self._unlinked(band, flow, item)
                if self._transit_detector is not None:
                    self._transit[id(item.request)] = item.request
                self._finish(item, Outcome.DISPATCHED)
                return True
            return False
        finally:
            series.FC_DISPATCH_CYCLE_DURATION.observe(time.perf_counter() - started)

    async def _dispatch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        wake = self._wake
        while True:
            if self._queued:
                timer = loop.call_later(self._tick, wake.set)
                await wake.wait()
                timer.cancel()
            else:
                await wake.wait()
            wake.clear()
            while self._queued:
                try:
                    dispatched = self.dispatch_cycle()
                    self._cycle_failed = False
                except Exception:  # why: a failing plugin must not kill the dispatcher
                    if not self._cycle_failed:
                        log.exception("flow_control_dispatch_cycle_failed")
                    self._cycle_failed = True
                    dispatched = False
                if not dispatched:
                    break
                await asyncio.sleep(0)  # let the dispatched request move on before re-reading saturation

    def _expire(self, item: Item) -> None:
        if item.queued:
            self._unlink(item)
            self._finish(item, Outcome.EVICTED_TTL)

    def _unlink(self, item: Item) -> None:
        flow = item.flow
        band = flow.band
        if flow.queue.remove(item):
            band.fairness.head_changed(flow)
        self._unlinked(band, flow, item)

    def _unlinked(self, band: Band, flow: Flow, item: Item) -> None:
        band.count -= 1
        band.bytes -= item.byte_size
        flow.bytes -= item.byte_size
        self._queued -= 1
        self._bytes -= item.byte_size

    def _finish(self, item: Item, outcome: Outcome) -> None:
        if item.timer is not None:
            item.timer.cancel()
        item.labels.finished(outcome, self._clock() - item.enqueued_at)
        if not item.future.done():
            item.future.set_result(outcome)

    # --- bands and garbage collection ----------------------------------------------------------
    def _policies_for(
        self, band: PriorityBandConfig, path: str, plugins: Mapping[str, Plugin]
    ) -> BandPolicies:
        key = f"{band.ordering_policy_ref}\x00{band.fairness_policy_ref}"
        policies = self._policies.get(key)
        if policies is None:
            policies = BandPolicies.resolve(band, path, plugins)
            self._policies[key] = policies
        return policies

    def _new_band(self, priority: int) -> Band:
        policies = self._policies_for(self._template, "flowControl.defaultPriorityBand", self._plugins)
        band = Band(self._template, policies, self._pool, jit=True, now=self._clock(), priority=priority)
        self._bands[priority] = band
        self._reorder()
        return band

    def _reorder(self) -> None:
        self._ordered = sorted(self._bands.values(), key=lambda b: -b.priority)
        self._priorities = tuple(b.priority for b in self._ordered)

    def collect_garbage(self, now: float | None = None) -> None:
        """Drop flows idle for ``flow_gc_timeout`` (and their metric series), then bands made on
        first use that have had no flow for ``band_gc_timeout``."""
        now = self._clock() if now is None else now
        dropped = False
        for priority, band in list(self._bands.items()):
            for flow_id, flow in list(band.flows.items()):
                if not flow.leases and not len(flow.queue) and now - flow.idle_since >= self._flow_gc_timeout:
                    del band.flows[flow_id]
                    flow.forget_series()
                    band.idle_since = now
            if band.jit and not band.flows and now - band.idle_since >= self._band_gc_timeout:
                del self._bands[priority]
                dropped = True
        if dropped:
            self._reorder()

    async def _gc_loop(self) -> None:
        while True:
            await asyncio.sleep(self._gc_interval)
            self.collect_garbage()
