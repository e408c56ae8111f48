"""The admission contract: may this request proceed to scheduling now?"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol

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


class ImmediateAdmission(Protocol):
    """An admission controller that never makes a request wait may answer with a plain call.

    The director then calls ``admit_now`` instead of creating and awaiting ``admit``'s coroutine
    (~1.5k instructions a request): it refuses by raising as ``admit`` does, and returns True
    when the request is admitted; False sends it to ``await admit`` (a controller that waits
    only sometimes).  ``TRACKS`` False says ``notify`` and ``placed`` do nothing (the controller
    keeps nothing between admission and completion), so the director and the response side do
    not call them.  Both optional: looked up once per pipeline.
    """

    TRACKS: ClassVar[bool]

    def admit_now(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> bool: ...
