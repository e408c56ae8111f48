"""``lora-affinity-scorer``: prefer endpoints where the requested LoRA adapter is (or can be) loaded."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from epp.datalayer.api import Endpoint
from epp.plugin.base import PluginBase
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ScorerCategory


class LoraAffinityScorer(PluginBase):
    """Prefer endpoints that hold the target adapter.  Type ``lora-affinity-scorer``, category Affinity.

    With ``m = request.target_model``: 1.0 if ``m`` is an active adapter; else 0.8 if the
    endpoint can load one more (``len(active) + len(waiting) < max_active_models``); else
    0.6 if ``m`` is waiting to load; else 0.0.
    Consumes: endpoint metrics (``active_models``, ``waiting_models``, ``max_active_models``).
    Parameters: none.
    """

    TYPE: ClassVar[str] = "lora-affinity-scorer"
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.AFFINITY
    BOUNDED: ClassVar[bool] = True  # scores always in [0, 1]: the profile skips its range check

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        model = request.target_model
        out: list[float] = []
        append = out.append
        for ep in endpoints:
            m = ep.metrics
            if model in m.active_models:
                append(1.0)
            elif len(m.active_models) + len(m.waiting_models) < m.max_active_models:
                append(0.8)
            elif model in m.waiting_models:
                append(0.6)
            else:
                append(0.0)
        return out
