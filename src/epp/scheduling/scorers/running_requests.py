"""``running-requests-size-scorer``: prefer endpoints running fewer requests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from epp.datalayer.api import Endpoint, Metrics
from epp.plugin.base import PluginBase
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ScorerCategory
from epp.scheduling.normalize import min_max_apply, min_max_bounds, min_max_scores, min_max_update


class RunningRequestsSizeScorer(PluginBase):
    """Prefer few running requests.  Type ``running-requests-size-scorer``, category Distribution.

    score = (max_r - r) / (max_r - min_r) over the candidates' ``running_requests_size``;
    when all are equal, every endpoint scores 1.0.
    Consumes: endpoint metrics (``running_requests_size``).  Parameters: none.
    """

    TYPE: ClassVar[str] = "running-requests-size-scorer"
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION
    BOUNDED: ClassVar[bool] = True  # scores always in [0, 1]: the profile skips its range check

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        return min_max_scores([ep.metrics.running_requests_size for ep in endpoints])

    def score_metrics(self, metrics: Sequence[Metrics]) -> Sequence[float]:
        """The same scores from the readings alone: the profile reuses them until the metrics change."""
        return min_max_scores([m.running_requests_size for m in metrics])

    def metric_values(self, metrics: Sequence[Metrics]) -> list[int]:
        """Each reading's ``running_requests_size`` (the incremental path's per-endpoint value)."""
        return [m.running_requests_size for m in metrics]

    def summarize(self, values: Sequence[int]) -> tuple[int, int]:
        """The normalisation bounds over every candidate."""
        return min_max_bounds(values)

    def scores_for(self, values: Sequence[int], summary: tuple[int, int]) -> list[float]:
        """The scores of ``values`` (any subset) within the candidates' bounds."""
        return min_max_apply(values, summary)

    def update_summary(
        self, summary: tuple[int, int], old: Sequence[int], new: Sequence[int]
    ) -> tuple[int, int] | None:
        """The bounds after a few readings changed, when known without a rescan."""
        return min_max_update(summary, old, new)
