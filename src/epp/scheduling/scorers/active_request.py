"""``active-request-scorer`` (llm-d-router): prefer endpoints with fewer requests in flight from this EPP."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import structlog

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import INFLIGHT_LOAD
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ScorerCategory

log = structlog.get_logger(__name__)


class ActiveRequestParams(PluginParams):
    idle_threshold: int = 0
    max_busy_score: float = 1.0
    request_timeout: str = ""  # deprecated in llm-d and ignored: the in-flight producer tracks lifetimes


class ActiveRequestScorer(PluginBase):
    """Score by in-flight requests.  Type ``active-request-scorer``, category Distribution.

    With ``c`` = the endpoint's ``InFlightLoad.requests`` and ``M`` = the largest ``c`` among
    the candidates: ``c <= idleThreshold`` → 1.0, else ``(M - c) / M * maxBusyScore``
    (llm-d-router's formula; the busiest scores 0).  Consumes ``INFLIGHT_LOAD``
    (auto-creates ``inflight-load-producer``).  Parameters: ``idleThreshold`` (0),
    ``maxBusyScore`` (1.0; outside [0, 1] is ignored with a log, as llm-d), ``requestTimeout``
    (deprecated, ignored).
    """

    TYPE: ClassVar[str] = "active-request-scorer"
    PARAMS: ClassVar[type[PluginParams]] = ActiveRequestParams
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION
    BOUNDED: ClassVar[bool] = True
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({INFLIGHT_LOAD})

    def __init__(self, name: str, params: ActiveRequestParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.idle_threshold = params.idle_threshold
        busy = params.max_busy_score
        if not 0.0 <= busy <= 1.0:
            log.warning("active_request_max_busy_score_ignored", plugin=name, provided=busy, using=1.0)
            busy = 1.0
        self.max_busy_score = busy
        if params.request_timeout:
            log.warning("deprecated_parameter", plugin=name, parameter="requestTimeout")

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        loads = state.attributes(INFLIGHT_LOAD)
        counts = [0 if (load := loads.get(ep)) is None else load.requests for ep in endpoints]
        top = max(counts, default=0)
        idle, busy = self.idle_threshold, self.max_busy_score
        return [1.0 if c <= idle else (top - c) / top * busy for c in counts]
