"""``endpoint-attribute-filter`` (llm-d-router): keep candidates whose attribute passes a threshold."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import ClassVar, Final, Literal

from pydantic import field_validator

from epp.datalayer.api import Endpoint
from epp.datalayer.scalar_attributes import ScalarAttributeRef, data_key
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.state import CycleState
from epp.request import InferenceRequest

OPERATORS: Final[dict[str, Callable[[float, float], bool]]] = {
    "LessThan": operator.lt,
    "LessThanOrEqual": operator.le,
    "GreaterThan": operator.gt,
    "GreaterThanOrEqual": operator.ge,
    "Equal": operator.eq,
    "NotEqual": operator.ne,
}


class ThresholdParams(PluginParams):
    operator: str
    value: float

    @field_validator("operator")
    @classmethod
    def _operator(cls, v: str) -> str:
        if v not in OPERATORS:
            raise ValueError(f"threshold.operator must be one of {', '.join(OPERATORS)}, got {v!r}")
        return v


class FilterAlgorithmParams(PluginParams):
    """Only ``threshold`` exists upstream (percentile, topK and range are planned there)."""

    type: Literal["threshold"]
    threshold: ThresholdParams


class EndpointAttributeFilterParams(PluginParams):
    attribute: str
    producer: str | None = None
    on_missing: Literal["Pass", "Fail", ""] = "Pass"
    fallback_on_empty: bool = False
    algorithm: FilterAlgorithmParams

    @field_validator("attribute")
    @classmethod
    def _attribute(cls, v: str) -> str:
        if not v:
            raise ValueError("endpoint attribute filter requires a non-empty attribute")
        return v


class EndpointAttributeFilter(PluginBase):
    """Type ``endpoint-attribute-filter``.

    Keeps the candidates whose attribute ``attribute`` compares true against
    ``algorithm.threshold`` (``operator``: LessThan, LessThanOrEqual, GreaterThan,
    GreaterThanOrEqual, Equal, NotEqual; ``value``).  A candidate without the attribute is
    kept with ``onMissing: Pass`` (the default) and dropped with ``Fail``.  With
    ``fallbackOnEmpty`` an empty result gives back every candidate.  The key is ``attribute``
    as written (v0.10's ``"GPUUtilization/dcgm-extractor"``) or ``attribute`` + ``/`` +
    ``producer`` (later releases' split spelling).
    """

    TYPE: ClassVar[str] = "endpoint-attribute-filter"
    PARAMS: ClassVar[type[PluginParams]] = EndpointAttributeFilterParams

    def __init__(self, name: str, params: EndpointAttributeFilterParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.values = ScalarAttributeRef(handle, data_key(params.attribute, params.producer))
        self.pass_on_missing = params.on_missing != "Fail"
        self.fallback_on_empty = params.fallback_on_empty
        self.compare = OPERATORS[params.algorithm.threshold.operator]
        self.threshold = params.algorithm.threshold.value

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        values = self.values.values()
        compare, threshold, keep_missing = self.compare, self.threshold, self.pass_on_missing
        kept = [
            ep
            for ep in endpoints
            if ((v := values.get(ep)) is None and keep_missing) or (v is not None and compare(v, threshold))
        ]
        if not kept and self.fallback_on_empty:
            return endpoints
        return kept
