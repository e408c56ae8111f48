"""The controller's state: priority bands, their flows, and the requests queued in them."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from epp.config.schema import PriorityBandConfig
from epp.errors import ConfigError
from epp.flowcontrol.api import FairnessPolicy, FairnessState, FlowKey, OrderingPolicy, Outcome
from epp.flowcontrol.queues import HeapQueue, ListQueue, queue_type
from epp.metrics import series
from epp.plugin.base import Plugin
from epp.request import InferenceRequest


@dataclass(frozen=True, slots=True)
class BandPolicies:
    """A band's ordering and fairness plugins, and the queue type the ordering needs."""

    ordering: OrderingPolicy
    fairness: FairnessPolicy
    queue: type[ListQueue[Any]] | type[HeapQueue[Any]]

    @staticmethod
    def resolve(band: PriorityBandConfig, path: str, plugins: Mapping[str, Plugin]) -> BandPolicies:
        ordering = plugins.get(band.ordering_policy_ref)
        if not isinstance(ordering, OrderingPolicy):
            ref = band.ordering_policy_ref
            raise ConfigError(f'{path}.orderingPolicyRef: no ordering policy registered for name "{ref}"')
        fairness = plugins.get(band.fairness_policy_ref)
        if not isinstance(fairness, FairnessPolicy):
            ref = band.fairness_policy_ref
            raise ConfigError(f'{path}.fairnessPolicyRef: no fairness policy registered for name "{ref}"')
        try:
            queue = queue_type(ordering)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
        return BandPolicies(ordering, fairness, queue)


class Labels:
    """One flow's metric series for one (model, target model) pair, looked up once."""

    __slots__ = ("_durations", "_values", "bytes", "size")

    def __init__(self, values: tuple[str, str, str, str, str]) -> None:
        self._values = values  # fairness_id, priority, inference_pool, model_name, target_model_name
        self.size = series.FC_QUEUE_SIZE.labels(*values)
        self.bytes = series.FC_QUEUE_BYTES.labels(*values)
        self._durations: dict[Outcome, Any] = {}

    def finished(self, outcome: Outcome, seconds: float) -> None:
        child = self._durations.get(outcome)
        if child is None:
            fid, priority, pool, model, target = self._values
            child = series.FC_QUEUE_DURATION.labels(fid, priority, outcome.value, pool, model, target)
            self._durations[outcome] = child
        child.observe(seconds)

    def forget(self) -> None:
        for gauge in (series.FC_QUEUE_SIZE, series.FC_QUEUE_BYTES):
            gauge.remove(*self._values)
        fid, priority, pool, model, target = self._values
        for outcome in self._durations:
            series.FC_QUEUE_DURATION.remove(fid, priority, outcome.value, pool, model, target)


class Flow:
    """One fairness id's queue within a band; a ``FlowQueueView`` for fairness policies."""

    __slots__ = ("_enqueue", "_labels", "band", "bytes", "flow", "idle_since", "leases", "queue")

    def __init__(self, band: Band, flow_id: str, now: float) -> None:
        self.band = band
        self.flow = FlowKey(flow_id, band.priority)
        self.queue: ListQueue[Item] | HeapQueue[Item] = band.policies.queue()
        self.bytes = 0
        self.leases = 0  # requests of this flow waiting now: the flow must not be collected
        self.idle_since = now
        self._labels: dict[tuple[str, str], Labels] = {}
        self._enqueue: dict[Outcome, Any] = {}

    def __len__(self) -> int:
        return len(self.queue)

    def head(self) -> Item | None:
        return self.queue.head()

    def series(self, model: str, target: str) -> Labels:
        labels = self._labels.get((model, target))
        if labels is None:
            labels = Labels((self.flow.id, self.band.label, self.band.pool, model, target))
            self._labels[(model, target)] = labels
        return labels

    def enqueue_observed(self, outcome: Outcome, seconds: float) -> None:
        child = self._enqueue.get(outcome)
        if child is None:
            child = series.FC_ENQUEUE_DURATION.labels(self.flow.id, self.band.label, outcome.value)
            self._enqueue[outcome] = child
        child.observe(seconds)

    def forget_series(self) -> None:
        """Drop every series labelled with this flow: fairness ids come from a client header."""
        for labels in self._labels.values():
            labels.forget()
        for outcome in self._enqueue:
            series.FC_ENQUEUE_DURATION.remove(self.flow.id, self.band.label, outcome.value)
        self._labels.clear()
        self._enqueue.clear()


class Band:
    """All flows of one priority, with the band's limits, policies and running totals."""

    __slots__ = (
        "bytes",
        "count",
        "fairness",
        "flows",
        "idle_since",
        "jit",
        "label",
        "max_bytes",
        "max_requests",
        "ordering",
        "policies",
        "pool",
        "priority",
    )

    def __init__(
        self,
        limits: PriorityBandConfig,
        policies: BandPolicies,
        pool: str,
        *,
        jit: bool,
        now: float,
        priority: int | None = None,
    ) -> None:
        self.priority = limits.priority if priority is None else priority
        self.label = str(self.priority)
        self.pool = pool
        self.max_bytes = limits.max_bytes or 0
        self.max_requests = limits.max_requests or 0
        self.policies = policies
        self.ordering = policies.ordering
        self.fairness: FairnessState = policies.fairness.new_state()
        self.flows: dict[str, Flow] = {}
        self.count = 0
        self.bytes = 0
        self.jit = jit  # made on first use from the template: collected when idle
        self.idle_since = now

    def new_flow(self, flow_id: str, now: float) -> Flow:
        flow = Flow(self, flow_id, now)
        self.flows[flow_id] = flow
        return flow


class Item:
    """One waiting request: a ``QueuedItem`` for policies, and the waiter's future."""

    __slots__ = (
        "byte_size",
        "enqueued_at",
        "flow",
        "future",
        "labels",
        "order",
        "queued",
        "request",
        "timer",
        "ttl",
    )

    def __init__(
        self,
        request: InferenceRequest,
        byte_size: int,
        enqueued_at: float,
        ttl: float,
        flow: Flow,
        labels: Labels,
        future: asyncio.Future[Outcome],
    ) -> None:
        self.request = request
        self.byte_size = byte_size
        self.enqueued_at = enqueued_at
        self.ttl = ttl
        self.flow = flow
        self.labels = labels
        self.future = future
        self.order: tuple[float, float, int] = (0.0, 0.0, 0)
        self.queued = False
        self.timer: asyncio.TimerHandle | None = None
