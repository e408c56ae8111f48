"""Legacy admission: shed sheddable requests (priority < 0) while the pool is saturated."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Final

from epp.datalayer.api import Endpoint
from epp.errors import ResourceExhausted
from epp.flowcontrol.api import SaturationDetector
from epp.request import InferenceRequest

SHED_MESSAGE: Final = "system saturated, sheddable request dropped"


class LegacyAdmission:
    """GIE's default admission (flowControl gate off).

    Only requests with a negative priority are ever refused, with 429 as the Go code does
    (GIE's docs say 503).  Priority >= 0 is always admitted, however full the pool is.
    """

    __slots__ = ("_detector",)

    TRACKS: ClassVar[bool] = False  # ``ImmediateAdmission``: nothing waits, nothing to wake

    def __init__(self, detector: SaturationDetector) -> None:
        self._detector = detector

    async def admit(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> None:
        self.admit_now(request, candidates)

    def admit_now(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> bool:
        if request.priority < 0 and self._detector.saturation(candidates) >= 1.0:
            raise ResourceExhausted(SHED_MESSAGE)
        return True

    def notify(self) -> None:
        return None

    def placed(self, request: InferenceRequest, *, scheduled: bool) -> None:
        return None


class AlwaysAdmit:
    """Admission for tests and for configurations without a detector.

    ``TRACKS`` False: ``notify`` and ``placed`` are not called; a subclass that overrides
    either sets it True."""

    __slots__ = ()

    TRACKS: ClassVar[bool] = False

    async def admit(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> None:
        return None

    def admit_now(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> bool:
        return True

    def notify(self) -> None:
        return None

    def placed(self, request: InferenceRequest, *, scheduled: bool) -> None:
        return None
