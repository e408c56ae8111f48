"""The metrics score cache on its own: what a profile reads from it, and samples applied at arrival."""

from __future__ import annotations

from collections.abc import Sequence

from epp.datalayer.api import Endpoint, Metrics
from epp.scheduling.api import Scorer
from epp.scheduling.score_cache import MetricsScoreCache
from epp.scheduling.scorers.kv_cache import KVCacheUtilizationScorer
from epp.scheduling.scorers.prefix_cache import PrefixCacheScorer
from epp.scheduling.scorers.queue import QueueScorer
from epp.scheduling.weighting import WeightedScorer
from epp.testing.plugins import build
from tests.scheduling.builders import endpoint


def _cache() -> MetricsScoreCache:
    """queue (w2) and kv-cache (w3) lead; the prefix scorer (request-dependent) comes last."""
    scorers: list[tuple[Scorer, float]] = [
        (build(QueueScorer), 2.0),
        (build(KVCacheUtilizationScorer), 3.0),
        (build(PrefixCacheScorer), 1.0),
    ]
    return MetricsScoreCache("p", [WeightedScorer(s, w) for s, w in scorers])


def _expected(eps: Sequence[Endpoint]) -> tuple[list[float], list[float], list[float]]:
    """Queue and kv scores of the endpoints' current readings, and their weighted sum."""
    queues = [ep.metrics.waiting_queue_size for ep in eps]
    lo, hi = min(queues), max(queues)
    queue = [(hi - q) / (hi - lo) if hi > lo else 1.0 for q in queues]
    kv = [1.0 - ep.metrics.kv_cache_usage_percent for ep in eps]
    return queue, kv, [q * 2.0 + k * 3.0 for q, k in zip(queue, kv, strict=True)]


def _tracking(cache: MetricsScoreCache) -> tuple[bool, tuple[Endpoint, ...] | None]:
    """Whether samples are applied on arrival, and for which candidates (a call: mypy does not narrow)."""
    return cache.live, cache.tracked


def test_scores_and_partial_sum_of_the_leading_metrics_scorers() -> None:
    eps = (endpoint(0, queue=4, kv=0.5), endpoint(1, queue=0, kv=0.25), endpoint(2, queue=2, kv=1.0))
    cache = _cache()
    assert cache.leading == 2
    cache.refresh(eps, len(eps))
    queue, kv, partial = _expected(eps)
    assert [list(s) if s is not None else None for s in cache.scores] == [queue, kv, None]
    assert cache.partial == partial


def test_a_tuple_seen_twice_is_tracked_and_its_samples_are_applied_as_they_arrive() -> None:
    eps = tuple(endpoint(i, queue=i, kv=0.1 * i) for i in range(9))
    cache = _cache()
    cache.refresh(eps, len(eps))
    assert _tracking(cache) == (False, None)  # seen once: nobody is listened to yet
    cache.refresh(eps, len(eps))
    live, tracked = _tracking(cache)
    assert live and tracked is eps
    eps[4].metrics = Metrics(waiting_queue_size=20, kv_cache_usage_percent=0.75)  # a new max
    eps[2].metrics = Metrics(waiting_queue_size=3, kv_cache_usage_percent=0.5)
    queue, kv, partial = _expected(eps)  # no refresh: the samples were applied on arrival
    assert [list(s or ()) for s in cache.scores[:2]] == [queue, kv]
    assert cache.partial == partial


def test_a_different_candidate_list_is_recomputed_and_stops_the_arrival_updates() -> None:
    eps = tuple(endpoint(i, queue=i) for i in range(6))
    cache = _cache()
    for _ in range(2):
        cache.refresh(eps, len(eps))
    subset = eps[1:4]
    cache.refresh(subset, len(subset))
    assert _tracking(cache) == (False, eps)  # the snapshot's positions are the subset's now
    eps[5].metrics = Metrics(waiting_queue_size=0)  # a tracked endpoint outside the subset
    assert cache.partial == _expected(subset)[2]
