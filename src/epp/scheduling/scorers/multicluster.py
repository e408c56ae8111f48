"""llm-d-router's multicluster scorers: for a cluster-scoped EPP whose endpoints are peer clusters.

The endpoints come from ``multicluster-file-discovery``; each carries its pool's aggregates as
attributes written by ``multicluster-metrics-extractor`` (``llm-d.ai/multicluster-*``), which
these read instead of a pod's metrics.  ``multicluster-prefix-cache-scorer`` is the stock scorer
under the cluster-scoped name: keyed on endpoint identity, it already sends a repeated prefix
back to the cluster that served it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from epp.datalayer.api import Endpoint
from epp.datalayer.scalar_attributes import (
    MULTICLUSTER_KV_CACHE_UTILIZATION_KEY,
    MULTICLUSTER_QUEUE_SIZE_KEY,
    ScalarAttributeRef,
)
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ScorerCategory
from epp.scheduling.scorers.prefix_cache import PrefixCacheScorer


class MultiClusterQueueScorer(PluginBase):
    """Prefer the cluster with the shortest pool queue.  Type ``multicluster-queue-scorer``.

    Reads ``llm-d.ai/multicluster-queue-size``: ``(max - q) / (max - min)`` over the candidates
    that have it, 1.0 for all when equal; a candidate without it scores 0 (upstream: unscored).
    No parameters.  Category Distribution.
    """

    TYPE: ClassVar[str] = "multicluster-queue-scorer"
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION
    BOUNDED: ClassVar[bool] = True

    def __init__(self, name: str, params: PluginParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.values = ScalarAttributeRef(handle, MULTICLUSTER_QUEUE_SIZE_KEY)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        values = self.values.values()
        found = [values.get(ep) for ep in endpoints]
        present = [q for q in found if q is not None]
        if not present:
            return [0.0] * len(endpoints)
        low, high = min(present), max(present)
        if high == low:
            return [0.0 if q is None else 1.0 for q in found]
        span = high - low
        return [0.0 if q is None else (high - q) / span for q in found]


class MultiClusterKVCacheUtilizationScorer(PluginBase):
    """Prefer the cluster with free KV cache.  Type ``multicluster-kv-cache-utilization-scorer``.

    Reads ``llm-d.ai/multicluster-kv-cache-utilization``: ``1 - utilization``; a candidate
    without it scores 0 (upstream: unscored).  No parameters.  Category Distribution.
    """

    TYPE: ClassVar[str] = "multicluster-kv-cache-utilization-scorer"
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION

    def __init__(self, name: str, params: PluginParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.values = ScalarAttributeRef(handle, MULTICLUSTER_KV_CACHE_UTILIZATION_KEY)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        values = self.values.values()
        return [0.0 if (u := values.get(ep)) is None else 1.0 - u for ep in endpoints]


class MultiClusterPrefixCacheScorer(PrefixCacheScorer):
    """``prefix-cache-scorer`` over cluster endpoints.  Type ``multicluster-prefix-cache-scorer``."""

    TYPE: ClassVar[str] = "multicluster-prefix-cache-scorer"
