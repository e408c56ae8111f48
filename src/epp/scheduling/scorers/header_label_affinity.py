"""``header-label-affinity-scorer`` (llm-d-router): prefer endpoints whose label equals a request header.

A soft pin: a client (or a gateway filter) names, say, the tenant or hardware class it wants in
a header; endpoints labelled with that value score 1, the rest 0 and stay eligible.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from pydantic import field_validator

from epp.datalayer.api import Endpoint
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ScorerCategory


class HeaderLabelAffinityParams(PluginParams):
    header_name: str
    label_key: str

    @field_validator("header_name", "label_key")
    @classmethod
    def _required(cls, v: str) -> str:
        if not v:
            raise ValueError("is required")
        return v


class HeaderLabelAffinityScorer(PluginBase):
    """Type ``header-label-affinity-scorer``, category Affinity.

    1.0 where the endpoint's ``labelKey`` label equals the request's ``headerName`` header
    (matched case-insensitively by name), else 0.0; all 0.0 when the header is absent or empty.
    Parameters (both required): ``headerName``, ``labelKey``.
    """

    TYPE: ClassVar[str] = "header-label-affinity-scorer"
    PARAMS: ClassVar[type[PluginParams]] = HeaderLabelAffinityParams
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.AFFINITY
    BOUNDED: ClassVar[bool] = True

    def __init__(self, name: str, params: HeaderLabelAffinityParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.header_name = params.header_name.lower()
        self.label_key = params.label_key

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        wanted = request.headers.get(self.header_name, "")
        if not wanted:
            return [0.0] * len(endpoints)
        key = self.label_key
        return [1.0 if ep.metadata.labels.get(key) == wanted else 0.0 for ep in endpoints]
