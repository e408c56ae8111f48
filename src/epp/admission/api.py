"""The admission contract: may this request proceed to scheduling now?"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from epp.datalayer.api import Endpoint
from epp.request import InferenceRequest


class AdmissionController(Protocol):
    """Admit (return), make the request wait (await), or refuse it (raise an ``EppError``)."""

    async def admit(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> None: ...

    def notify(self) -> None:
        """A request finished: capacity may have freed up (flow control re-checks its queues)."""
        ...

    def placed(self, request: InferenceRequest, *, scheduled: bool) -> None:
        """An admitted request left admission's hands: scheduled (its endpoint's in-flight
        counters have it) or failed before.  Called once for every request ``admit`` let through."""
        ...
