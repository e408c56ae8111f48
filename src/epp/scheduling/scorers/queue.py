"""``queue-scorer``: prefer endpoints with short waiting queues."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from epp.datalayer.api import Endpoint, Metrics
from epp.scheduling.metric_scorer import MinMaxMetricScorer


class QueueScorer(MinMaxMetricScorer):
    """Prefer short waiting queues.  Type ``queue-scorer``, category Distribution.

    score = (max_q - q) / (max_q - min_q) over the candidates' ``waiting_queue_size``;
    when all queues are equal, every endpoint scores 1.0.
    Consumes: endpoint metrics (``waiting_queue_size``).  Parameters: none.
    """

    TYPE: ClassVar[str] = "queue-scorer"

    def metric_values(self, metrics: Sequence[Metrics]) -> list[int]:
        return [m.waiting_queue_size for m in metrics]

    def endpoint_values(self, endpoints: Sequence[Endpoint]) -> list[int]:
        return [ep.metrics.waiting_queue_size for ep in endpoints]
