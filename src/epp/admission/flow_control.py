"""Flow-control admission: requests wait in priority bands while the pool is saturated."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any

from epp.datalayer.api import Endpoint
from epp.datastore.store import Datastore
from epp.errors import EppError, Internal, ResourceExhausted, ServiceUnavailable
from epp.flowcontrol.api import Outcome
from epp.flowcontrol.assembly import FlowControlPlan
from epp.flowcontrol.controller import OUTCOME_MESSAGES, FlowController
from epp.request import InferenceRequest


def outcome_error(outcome: Outcome, *, pool_empty: bool) -> EppError | None:
    """The error a non-dispatched outcome becomes (GIE ``translateFlowControlOutcome``); None
    for ``Dispatched``.

    One deliberate difference (docs/decisions-flowcontrol.md): a TTL eviction is 429 while
    the pool has endpoints -- it is overloaded, the client should back off -- and 503 only
    when the pool is empty, as llm-d answers.  GIE answers 503 for both.
    """
    msg = OUTCOME_MESSAGES.get(outcome) or "request rejected by flow control"
    if outcome is Outcome.DISPATCHED:
        return None
    if outcome is Outcome.REJECTED_CAPACITY:
        return ResourceExhausted(msg, reason="rejected-queue-full")
    if outcome is Outcome.EVICTED_TTL:
        text = f"request timed out in queue: {msg}"
        ttl = "rejected-ttl-expired"
        return ServiceUnavailable(text, reason=ttl) if pool_empty else ResourceExhausted(text, reason=ttl)
    if outcome is Outcome.EVICTED_CONTEXT_CANCELLED:
        return ServiceUnavailable(f"client disconnected: {msg}", reason="rejected-context-cancelled")
    if outcome in (Outcome.REJECTED_OTHER, Outcome.EVICTED_OTHER):
        return Internal(f"internal flow control error: {msg}")
    return Internal(f"unhandled flow control outcome: {msg}")


class FlowControlAdmission:
    """The ``AdmissionController`` of the ``flowControl`` feature gate.

    Each request waits in ``FlowController.enqueue_and_wait`` under its fairness id and
    priority, sized by its body; saturation is judged over the whole pool, as in GIE, so
    the candidates (subset hint) are not consulted.  Enter it as an async context manager
    to run the dispatcher; outside it every request is refused with a 500.
    """

    __slots__ = ("controller",)

    def __init__(self, controller: FlowController) -> None:
        self.controller = controller

    @classmethod
    def from_plan(
        cls, plan: FlowControlPlan, datastore: Datastore, *, pool_name: str | None = None, **kwargs: Any
    ) -> FlowControlAdmission:
        """Built from the config; the pool is the datastore's endpoints, named for metric labels."""
        if pool_name is None:
            pool_name = datastore.pool.name if datastore.pool is not None else ""
        controller = FlowController.from_plan(
            plan, endpoints=datastore.endpoints, pool_name=pool_name, **kwargs
        )
        return cls(controller)

    async def admit(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> None:
        outcome = await self.controller.enqueue_and_wait(request, request.request_size_bytes)
        if outcome is not Outcome.DISPATCHED:
            error = outcome_error(outcome, pool_empty=self.controller.pool_is_empty())
            if error is not None:
                raise error

    def debug_state(self) -> dict[str, Any]:
        """Queue depths per band and flow, and the saturation reading (``/debug/plugins/state``)."""
        return self.controller.debug_state()

    def notify(self) -> None:
        """Capacity may have freed (a request finished): let waiting requests re-check now."""
        self.controller.notify()

    def placed(self, request: InferenceRequest, *, scheduled: bool) -> None:
        """The request is no longer in transit between flow control and its endpoint."""
        self.controller.placed(request, scheduled=scheduled)

    async def __aenter__(self) -> FlowControlAdmission:
        await self.controller.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.controller.stop()
