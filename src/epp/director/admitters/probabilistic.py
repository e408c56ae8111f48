"""``probabilistic-admitter`` (llm-d-router): shed sheddable requests more likely the fuller the pool.

A hard saturation cut-off flips every sheddable request from admitted to refused at once; a
probability that grows as a high power of the pool's saturation sheds a few early and almost
all near the limit, which keeps the pool just below saturation instead of oscillating around it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import ClassVar, Final

from pydantic import Field

from epp.datalayer.api import Endpoint
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.state import CycleState
from epp.request import InferenceRequest

DEFAULT_QUEUE_DEPTH_THRESHOLD: Final = 5
DEFAULT_KV_CACHE_UTIL_THRESHOLD: Final = 0.8
DEFAULT_POWER: Final = 5.0
DEFAULT_K: Final = 300.0


class ProbabilisticAdmitterParams(PluginParams):
    queue_depth_threshold: int = Field(default=DEFAULT_QUEUE_DEPTH_THRESHOLD, gt=0)
    kv_cache_util_threshold: float = Field(default=DEFAULT_KV_CACHE_UTIL_THRESHOLD, gt=0)
    power: float = Field(default=DEFAULT_POWER, gt=0)
    k: float = Field(default=DEFAULT_K, gt=0)


class ProbabilisticAdmitter(PluginBase):
    """Type ``probabilistic-admitter``.

    Only sheddable requests (priority < 0) are considered.  Per candidate,
    ``max(waiting / queueDepthThreshold, kvCacheUsage / kvCacheUtilThreshold)`` (1.0 for an
    endpoint never scraped, as upstream treats missing metrics); ``saturation`` is their mean;
    the request is refused with probability ``min(saturation**power * k, 1)``.  No candidates:
    admitted.  A refusal is answered like every admitter's (500 ``request cannot be admitted``,
    as upstream's director wraps it).  Parameters (all > 0): ``queueDepthThreshold`` (5),
    ``kvCacheUtilThreshold`` (0.8), ``power`` (5), ``k`` (300).
    """

    TYPE: ClassVar[str] = "probabilistic-admitter"
    PARAMS: ClassVar[type[PluginParams]] = ProbabilisticAdmitterParams

    def __init__(self, name: str, params: ProbabilisticAdmitterParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.queue_depth_threshold = float(params.queue_depth_threshold)
        self.kv_cache_util_threshold = params.kv_cache_util_threshold
        self.power = params.power
        self.k = params.k
        self.rand: Callable[[], float] = random.random

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        q, kv = self.queue_depth_threshold, self.kv_cache_util_threshold
        total = 0.0
        for ep in endpoints:
            m = ep.metrics
            if m.update_time == 0.0:
                total += 1.0
            else:
                total += max(m.waiting_queue_size / q, m.kv_cache_usage_percent / kv)
        return total / len(endpoints)

    def admit_request(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> str | None:
        if request.priority >= 0 or not endpoints:
            return None
        saturation = self.saturation(endpoints)
        prob = min(saturation**self.power * self.k, 1.0)
        if self.rand() < prob:
            return f"probabilistic-admitter: rejected, saturation={saturation:.3f} prob={prob:.2f}"
        return None
