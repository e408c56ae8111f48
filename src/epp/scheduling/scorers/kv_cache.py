"""``kv-cache-utilization-scorer``: prefer endpoints with free KV-cache."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from epp.datalayer.api import Endpoint, Metrics
from epp.plugin.base import PluginBase
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ScorerCategory


class KVCacheUtilizationScorer(PluginBase):
    """Prefer free KV-cache.  Type ``kv-cache-utilization-scorer``, category Distribution.

    score = 1 - ``kv_cache_usage_percent`` (a fraction in [0, 1]).
    Consumes: endpoint metrics (``kv_cache_usage_percent``).  Parameters: none.
    """

    TYPE: ClassVar[str] = "kv-cache-utilization-scorer"
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        return [1.0 - ep.metrics.kv_cache_usage_percent for ep in endpoints]

    def score_metrics(self, metrics: Sequence[Metrics]) -> Sequence[float]:
        """The same scores from the readings alone: the profile reuses them until the metrics change."""
        return [1.0 - m.kv_cache_usage_percent for m in metrics]

    def metric_values(self, metrics: Sequence[Metrics]) -> list[float]:
        """Each reading's ``kv_cache_usage_percent`` (the incremental path's per-endpoint value)."""
        return [m.kv_cache_usage_percent for m in metrics]

    def summarize(self, values: Sequence[float]) -> None:
        """No fleet term: each score depends on its own reading only."""
        return None

    def scores_for(self, values: Sequence[float], summary: None) -> list[float]:
        """``1 - usage`` for each value."""
        return [1.0 - v for v in values]

    def update_summary(self, summary: None, old: Sequence[float], new: Sequence[float]) -> None:
        """Still none (``summarize`` is free)."""
        return None
