"""Contracts of flow-control plugins; saturation detectors also serve legacy admission."""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from epp.datalayer.api import Endpoint
from epp.plugin.base import Plugin
from epp.request import InferenceRequest


@runtime_checkable
class SaturationDetector(Plugin, Protocol):
    """How full the pool is: 0 idle, >= 1.0 saturated.  No endpoints means saturated (1.0).

    Detectors in GIE are also scheduling filters; those that are implement
    ``epp.scheduling.api.Filter`` as well.
    """

    def saturation(self, endpoints: Sequence[Endpoint]) -> float: ...


@runtime_checkable
class TransitAwareDetector(Protocol):
    """A detector that also counts the requests flow control let through that no endpoint's
    in-flight counters have yet: they are being prepared (a tokenizer call, say) and scheduled.

    Without them every dispatch in those milliseconds reads the pool as it was, and a burst
    passes flow control whole.  The flow controller uses this reading when the pool has no
    prefill role.  Detectors whose signal is scraped from the engines do not implement it:
    the next scrape of the engine a request reaches would count it a second time.
    """

    def saturation_with_transit(
        self, endpoints: Sequence[Endpoint], transit: Collection[InferenceRequest]
    ) -> float: ...


@runtime_checkable
class UsageLimitPolicy(Plugin, Protocol):
    """Per-priority saturation ceilings: a band dispatches only while saturation < its ceiling."""

    def compute_limits(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]: ...


# --- queueing nouns and the policy contracts (gie-inventory §5) --------------------------------


class Outcome(enum.StrEnum):
    """How a request left flow control; the values are GIE's ``outcome`` metric labels."""

    NOT_YET_FINALIZED = "NotYetFinalized"
    DISPATCHED = "Dispatched"
    REJECTED_CAPACITY = "RejectedCapacity"
    REJECTED_OTHER = "RejectedOther"
    EVICTED_TTL = "EvictedTTL"
    EVICTED_CONTEXT_CANCELLED = "EvictedContextCancelled"
    EVICTED_OTHER = "EvictedOther"


class QueueCapability(enum.StrEnum):
    """What a queue can do; an ordering policy lists the capabilities it needs."""

    FIFO = "FIFO"
    PRIORITY_CONFIGURABLE = "PriorityConfigurable"


@dataclass(frozen=True, slots=True)
class FlowKey:
    """One queue: a fairness id (tenant) within a priority band.  Higher priority dispatches first."""

    id: str
    priority: int

    def __str__(self) -> str:
        return f"{self.id}@{self.priority}"


class QueuedItem(Protocol):
    """A request waiting in flow control, as policies see it."""

    @property
    def request(self) -> InferenceRequest: ...

    @property
    def enqueued_at(self) -> float:
        """``time.monotonic()`` when flow control accepted the request."""
        ...

    @property
    def ttl(self) -> float:
        """Effective time to live in seconds; 0 means none."""
        ...

    @property
    def order(self) -> tuple[float, float, int]:
        """The band's ``order_key`` plus an arrival sequence number: unique, smaller goes first."""
        ...


class FlowQueueView(Protocol):
    """One flow's queue, as fairness policies see it."""

    @property
    def flow(self) -> FlowKey: ...

    def __len__(self) -> int: ...

    def head(self) -> QueuedItem | None:
        """The item the queue would dispatch next, or None when empty."""
        ...


@runtime_checkable
class OrderingPolicy(Plugin, Protocol):
    """Which request of one flow goes first: the one with the smallest ``order_key``.

    Keys are computed once, at enqueue, so they may depend only on what is known then.
    A policy that needs ``PRIORITY_CONFIGURABLE`` gets a heap; otherwise a FIFO list, in
    which the key only matters when a fairness policy compares the heads of two flows.
    """

    REQUIRED_CAPABILITIES: ClassVar[frozenset[QueueCapability]]

    def order_key(self, item: QueuedItem) -> tuple[float, float]: ...


class FairnessState(Protocol):
    """One band's fairness memory.  The band reports every change of a queue's head to it."""

    def head_changed(self, queue: FlowQueueView) -> None:
        """``queue`` got a new head: it became non-empty, its head left, or a better item arrived.
        An empty ``queue`` has left the running."""
        ...

    def pick(self) -> FlowQueueView | None:
        """The non-empty queue whose head dispatches next; None only when all are empty."""
        ...


@runtime_checkable
class FairnessPolicy(Plugin, Protocol):
    """Which flow of a band dispatches next.  Stateless itself; each band gets a ``new_state()``."""

    def new_state(self) -> FairnessState: ...
