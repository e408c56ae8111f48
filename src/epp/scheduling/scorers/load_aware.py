"""``load-aware-scorer`` (llm-d-router): half credit for an empty queue, less as the queue fills."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Final

import structlog

from epp.datalayer.api import Endpoint, Metrics
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ScorerCategory

log = structlog.get_logger(__name__)

QUEUE_THRESHOLD_DEFAULT: Final = 128


class LoadAwareParams(PluginParams):
    threshold: int = QUEUE_THRESHOLD_DEFAULT


class LoadAwareScorer(PluginBase):
    """Score by waiting queue against a fixed threshold.  Type ``load-aware-scorer``, Distribution.

    With ``q`` = ``waiting_queue_size`` and ``T`` = ``threshold``: ``q == 0`` → 0.5, else
    ``0.5 * (1 - min(q, T) / T)`` (llm-d-router's formula: 0.5 leaves room for a future
    "spare capacity" bonus upstream).  Unlike ``queue-scorer`` it does not normalise over the
    candidates, so a fleet that is uniformly busy scores low.  ``threshold`` <= 0 falls back
    to 128 with a log, as upstream does.  Consumes: endpoint metrics (``waiting_queue_size``).
    """

    TYPE: ClassVar[str] = "load-aware-scorer"
    PARAMS: ClassVar[type[PluginParams]] = LoadAwareParams
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION

    def __init__(self, name: str, params: LoadAwareParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        threshold = params.threshold
        if threshold <= 0:
            log.warning(
                "load_aware_threshold_not_positive",
                plugin=name,
                provided=threshold,
                using=QUEUE_THRESHOLD_DEFAULT,
            )
            threshold = QUEUE_THRESHOLD_DEFAULT
        self.threshold = float(threshold)

    def _one(self, queue: int) -> float:
        if queue == 0:
            return 0.5
        return 0.5 * (1.0 - min(float(queue), self.threshold) / self.threshold)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        return [self._one(ep.metrics.waiting_queue_size) for ep in endpoints]

    def score_metrics(self, metrics: Sequence[Metrics]) -> Sequence[float]:
        """The same scores from the readings alone: the profile reuses them until the metrics change."""
        return [self._one(m.waiting_queue_size) for m in metrics]
