"""``endpoint-attribute-scorer`` (llm-d-router): score candidates linearly by a numeric endpoint attribute."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import field_validator, model_validator

from epp.datalayer.api import Endpoint
from epp.datalayer.scalar_attributes import ScalarAttributeRef, data_key
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ScorerCategory


class FixedRangeParams(PluginParams):
    min: float = 0.0
    max: float = 0.0

    @model_validator(mode="after")
    def _ordered(self) -> FixedRangeParams:
        if self.min >= self.max:
            raise ValueError(f"fixedRange requires min < max, got min {self.min:g}, max {self.max:g}")
        return self


class AdaptiveRangeParams(PluginParams):
    """No parameters: the range is the candidates' own [min, max]."""


class NormalizationParams(PluginParams):
    fixed_range: FixedRangeParams | None = None
    adaptive_range: AdaptiveRangeParams | None = None

    @model_validator(mode="after")
    def _one(self) -> NormalizationParams:
        if self.fixed_range is not None and self.adaptive_range is not None:
            raise ValueError("at most one normalization strategy, got both fixedRange and adaptiveRange")
        return self


class ScorerAlgorithmParams(PluginParams):
    type: Literal["linear_lower_is_better", "linear_higher_is_better"]
    normalization: NormalizationParams = NormalizationParams()


class EndpointAttributeScorerParams(PluginParams):
    attribute_key: str
    producer: str | None = None
    algorithm: ScorerAlgorithmParams

    @field_validator("attribute_key")
    @classmethod
    def _key(cls, v: str) -> str:
        if not v:
            raise ValueError("endpoint attribute scorer requires a non-empty attributeKey")
        return v


class EndpointAttributeScorer(PluginBase):
    """Type ``endpoint-attribute-scorer``, category Distribution.

    ``(value - min) / (max - min)`` per candidate, reversed (``1 - x``) for
    ``linear_lower_is_better``.  ``normalization.fixedRange`` takes ``min``/``max`` from the
    config and clamps to [0, 1]; otherwise (``adaptiveRange``, the default) they are the
    candidates' own, and if every candidate with the attribute has the same value each scores
    1.0.  A candidate without the attribute scores 0 and takes no part in the range.  The key
    is ``attributeKey`` as written, or ``attributeKey/producer``.
    """

    TYPE: ClassVar[str] = "endpoint-attribute-scorer"
    PARAMS: ClassVar[type[PluginParams]] = EndpointAttributeScorerParams
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION
    BOUNDED: ClassVar[bool] = True

    def __init__(self, name: str, params: EndpointAttributeScorerParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.values = ScalarAttributeRef(handle, data_key(params.attribute_key, params.producer))
        self.lower_is_better = params.algorithm.type == "linear_lower_is_better"
        self.fixed = params.algorithm.normalization.fixed_range

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        values = self.values.values()
        found = [values.get(ep) for ep in endpoints]
        fixed = self.fixed
        if fixed is not None:
            low, span = fixed.min, fixed.max - fixed.min
        else:
            present = [v for v in found if v is not None]
            if not present:
                return [0.0] * len(endpoints)
            low = min(present)
            span = max(present) - low
            if span == 0:  # all equal: a neutral score for every endpoint that has the attribute
                return [0.0 if v is None else 1.0 for v in found]
        flip = self.lower_is_better
        scores: list[float] = []
        for v in found:
            if v is None:
                scores.append(0.0)
                continue
            x = min(1.0, max(0.0, (v - low) / span))
            scores.append(1.0 - x if flip else x)
        return scores
