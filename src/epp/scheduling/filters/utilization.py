"""``utilization-filter`` (llm-d-router): drop endpoints past a cap on any of their load readings.

Scorers only prefer; a hard cap keeps requests off an endpoint that is already overloaded (a
long queue, a full KV cache) even when it is the best prefix match.  Each condition caps one
reading; an endpoint is dropped as soon as one reading exceeds its cap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Final, Literal

from pydantic import Field, model_validator

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import INFLIGHT_LOAD
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest

ACTIVE_REQUESTS: Final = "active-requests"

Metric = Literal["active-requests", "running-requests", "waiting-queue", "kv-cache-utilization"]


class Condition(PluginParams):
    metric: Metric
    max_value: float = Field(ge=0.0)

    @model_validator(mode="after")
    def _fraction(self) -> Condition:
        if self.metric == "kv-cache-utilization" and self.max_value > 1:
            raise ValueError(
                "utilization filter maxValue for 'kv-cache-utilization' is a fraction and must be "
                f"at most 1, got {self.max_value}"
            )
        return self


class UtilizationFilterParams(PluginParams):
    conditions: tuple[Condition, ...] = Field(min_length=1)
    fallback_on_empty: bool = False
    in_flight_load_producer_name: str = ""  # one in-flight producer here: informational


class UtilizationFilter(PluginBase):
    """Type ``utilization-filter``.  Keep an endpoint iff every condition's reading <= ``maxValue``.

    Readings: ``active-requests`` (the EPP's in-flight count, ``INFLIGHT_LOAD``; consumed, so the
    in-flight producer is added, only when a condition uses it), ``running-requests``,
    ``waiting-queue``, ``kv-cache-utilization`` (a fraction, cap <= 1).  ``fallbackOnEmpty``
    (false): when nothing is left, keep every candidate instead.  At least one condition.
    """

    TYPE: ClassVar[str] = "utilization-filter"
    PARAMS: ClassVar[type[PluginParams]] = UtilizationFilterParams

    def __init__(self, name: str, params: UtilizationFilterParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.conditions = tuple((c.metric, c.max_value) for c in params.conditions)
        self.fallback_on_empty = params.fallback_on_empty
        uses_load = any(m == ACTIVE_REQUESTS for m, _ in self.conditions)
        self.CONSUMES: frozenset[AttributeKey[Any]] = frozenset({INFLIGHT_LOAD}) if uses_load else frozenset()

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        loads = state.attributes(INFLIGHT_LOAD)
        kept: list[Endpoint] = []
        for ep in endpoints:
            m = ep.metrics
            for metric, cap in self.conditions:
                if metric == "running-requests":
                    value: float = m.running_requests_size
                elif metric == "waiting-queue":
                    value = m.waiting_queue_size
                elif metric == "kv-cache-utilization":
                    value = m.kv_cache_usage_percent
                else:
                    load = loads.get(ep)
                    value = 0 if load is None else load.requests
                if value > cap:
                    break
            else:
                kept.append(ep)
        if not kept and self.fallback_on_empty:
            return endpoints
        return kept
