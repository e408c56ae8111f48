"""``running-requests-size-scorer``: prefer endpoints running fewer requests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from epp.datalayer.api import Endpoint, Metrics
from epp.scheduling.metric_scorer import MinMaxMetricScorer


class RunningRequestsSizeScorer(MinMaxMetricScorer):
    """Prefer few running requests.  Type ``running-requests-size-scorer``, category Distribution.

    score = (max_r - r) / (max_r - min_r) over the candidates' ``running_requests_size``;
    when all are equal, every endpoint scores 1.0.
    Consumes: endpoint metrics (``running_requests_size``).  Parameters: none.
    """

    TYPE: ClassVar[str] = "running-requests-size-scorer"

    def metric_values(self, metrics: Sequence[Metrics]) -> list[int]:
        return [m.running_requests_size for m in metrics]

    def endpoint_values(self, endpoints: Sequence[Endpoint]) -> list[int]:
        return [ep.metrics.running_requests_size for ep in endpoints]
