"""A profile's weighted scorers and the float operations of their sum, in one place.

The profile (scheduler.py) adds scores per request and the metrics score cache (score_cache.py)
keeps a partial sum of the metrics-only scorers between requests.  Both use ``combine`` and
``clamped`` from here, so a cached partial sum and a sum made per request are bit-identical:
floats are added left to right in scorer order, ``((x*wa + y*wb) + z*wc)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from epp.metrics.series import PLUGIN_DURATION
from epp.scheduling.api import (
    AccumulatingScorer,
    BoundedScorer,
    IncrementalMetricsScorer,
    MetricsScorer,
    Scorer,
)


def timer(extension_point: str, plugin: Any) -> Any:
    """The histogram child for one plugin at one extension point, resolved once."""
    tn = plugin.typed_name
    return PLUGIN_DURATION.labels(extension_point, tn.type, tn.name)


def clamped(scores: Sequence[float]) -> Sequence[float]:
    """``scores`` with every value clamped to [0, 1] and NaN read as 0.

    The common case (already in range, no NaN) is detected with C-speed min/max/sum and
    returns the input untouched, so the per-element loop carries no clamp.
    """
    s = sum(scores)
    if min(scores) >= 0.0 and max(scores) <= 1.0 and s == s:
        return scores
    return [0.0 if not v > 0.0 else (1.0 if v > 1.0 else v) for v in scores]


def combine(
    lists: Sequence[Sequence[float]], weights: Sequence[float], n: int, partial: Sequence[float] | None
) -> list[float]:
    """``partial[i] + sum_k lists[k][i] * weights[k]`` for every i, added in scorer order.

    Without ``partial`` the sum starts from the first weighted score.  One fused pass for the
    usual one to four lists instead of one pass per scorer.  Floats are added left to right
    exactly as ``((x*wa + y*wb) + z*wc)``, so a cached partial sum of the leading scorers
    gives bit-identical totals.

    Every list (and ``partial``) has ``n`` items: callers check each scorer's list where it is
    made ("scorer returned ... scores") and the cache's lists are made for ``n``.  The fused
    passes index ``range(n)`` (a short list still raises) rather than ``zip(..., strict=True)``:
    ``zip`` called with a keyword builds a kwargs dict, ~2.5k instructions a call, as much as
    the arithmetic of four endpoints.  They are append loops, not comprehensions: a
    comprehension is a function object and a frame, and every name it reads from here becomes
    a cell of this function (four lists on four endpoints: 12.7k -> 8.3k instructions).
    """
    k = len(lists)
    out: list[float] = []
    append = out.append
    if partial is None:
        if k == 0:
            return [0.0] * n
        if k == 1:
            (a,), (wa,) = lists, weights
            for i in range(n):
                append(a[i] * wa)
            return out
        if k == 2:
            (a, b), (wa, wb) = lists, weights
            for i in range(n):
                append(a[i] * wa + b[i] * wb)
            return out
        if k == 3:
            (a, b, c), (wa, wb, wc) = lists, weights
            for i in range(n):
                append(a[i] * wa + b[i] * wb + c[i] * wc)
            return out
        if k == 4:
            (a, b, c, d), (wa, wb, wc, wd) = lists, weights
            for i in range(n):
                append(a[i] * wa + b[i] * wb + c[i] * wc + d[i] * wd)
            return out
        return _combine_many(lists, weights, None)
    if k == 0:
        return list(partial)  # a copy: the picker must not see (or touch) the cached list
    if k == 1:
        (a,), (wa,) = lists, weights
        for i in range(n):
            append(partial[i] + a[i] * wa)
        return out
    if k == 2:
        (a, b), (wa, wb) = lists, weights
        for i in range(n):
            append(partial[i] + a[i] * wa + b[i] * wb)
        return out
    if k == 3:
        (a, b, c), (wa, wb, wc) = lists, weights
        for i in range(n):
            append(partial[i] + a[i] * wa + b[i] * wb + c[i] * wc)
        return out
    if k == 4:  # an affinity scorer first, then four (prefix-heavy): one pass, not four
        (a, b, c, d), (wa, wb, wc, wd) = lists, weights
        for i in range(n):
            append(partial[i] + a[i] * wa + b[i] * wb + c[i] * wc + d[i] * wd)
        return out
    return _combine_many(lists, weights, partial)


def _combine_many(
    lists: Sequence[Sequence[float]], weights: Sequence[float], partial: Sequence[float] | None
) -> list[float]:
    """``combine`` of more than four lists: one pass per list, in scorer order."""
    if partial is None:
        totals = [x * weights[0] for x in lists[0]]
        lists, weights = lists[1:], weights[1:]
    else:
        totals = list(partial)
    for scores, w in zip(lists, weights, strict=True):
        totals = [t + x * w for t, x in zip(totals, scores, strict=True)]
    return totals


class WeightedScorer:
    """One weighted scorer of a profile: its histogram child and the optional paths it offers,
    resolved once so a run reads attributes instead of testing protocols."""

    __slots__ = ("add_weighted", "bounded", "hist", "inc", "score", "score_metrics", "weight")

    def __init__(self, scorer: Scorer, weight: float) -> None:
        self.score = scorer.score
        self.hist = timer("Scorer", scorer)
        self.bounded = isinstance(scorer, BoundedScorer) and scorer.BOUNDED
        self.score_metrics = scorer.score_metrics if isinstance(scorer, MetricsScorer) else None
        self.inc = scorer if isinstance(scorer, IncrementalMetricsScorer) else None
        self.add_weighted = scorer.add_weighted_scores if isinstance(scorer, AccumulatingScorer) else None
        self.weight = weight
