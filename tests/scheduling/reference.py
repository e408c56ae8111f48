"""A frozen copy of the scheduling algorithm as of 3c4151f, the reference of the differential tests.

Do not "fix" or speed this up: it is the behaviour the fast paths in ``epp.scheduling`` must
reproduce pick for pick (tests/scheduling/test_differential.py).  It copies the profile's run
(filters, per-scorer scores, clamping, the fused weighted sum, the picker call), the built-in
scorers' formulas and the max-score picker, without timers or metrics.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Sequence
from typing import Any

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import INFLIGHT_LOAD, PREFIX_MATCH
from epp.plugin.state import CycleState
from epp.request import InferenceRequest

RefScorer = Callable[[CycleState, InferenceRequest, Sequence[Endpoint]], Sequence[float]]


def clamped(scores: Sequence[float]) -> Sequence[float]:
    s = sum(scores)
    if min(scores) >= 0.0 and max(scores) <= 1.0 and s == s:
        return scores
    return [0.0 if not v > 0.0 else (1.0 if v > 1.0 else v) for v in scores]


def combine(lists: list[Sequence[float]], weights: Sequence[float], n: int) -> list[float]:
    k = len(lists)
    if k == 0:
        return [0.0] * n
    if k == 1:
        (a,), (wa,) = lists, weights
        return [x * wa for x in a]
    if k == 2:
        (a, b), (wa, wb) = lists, weights
        return [x * wa + y * wb for x, y in zip(a, b, strict=True)]
    if k == 3:
        (a, b, c), (wa, wb, wc) = lists, weights
        return [x * wa + y * wb + z * wc for x, y, z in zip(a, b, c, strict=True)]
    if k == 4:
        (a, b, c, d), (wa, wb, wc, wd) = lists, weights
        return [x * wa + y * wb + z * wc + u * wd for x, y, z, u in zip(a, b, c, d, strict=True)]
    totals = [x * weights[0] for x in lists[0]]
    for scores, w in zip(lists[1:], weights[1:], strict=True):
        totals = [t + x * w for t, x in zip(totals, scores, strict=True)]
    return totals


def min_max_scores(values: list[int]) -> list[float]:
    distinct = set(values)
    lo = min(distinct)
    hi = max(distinct)
    if hi == lo:
        return [1.0] * len(values)
    span = float(hi - lo)
    memo = {v: (hi - v) / span for v in distinct}
    return list(map(memo.__getitem__, values))


# --- the built-in scorers' formulas -------------------------------------------------------
def queue(state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[float]:
    return min_max_scores([ep.metrics.waiting_queue_size for ep in endpoints])


def running(state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[float]:
    return min_max_scores([ep.metrics.running_requests_size for ep in endpoints])


def kv_cache(state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[float]:
    return [1.0 - ep.metrics.kv_cache_usage_percent for ep in endpoints]


def prefix_cache(
    state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
) -> Sequence[float]:
    infos = state.attributes(PREFIX_MATCH)
    if not infos:
        return [0.0] * len(endpoints)
    return [
        info.match_blocks / info.total_blocks if info is not None and info.total_blocks > 0 else 0.0
        for info in map(infos.get, endpoints)
    ]


def lora_affinity(
    state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
) -> Sequence[float]:
    model = request.target_model
    out: list[float] = []
    for ep in endpoints:
        m = ep.metrics
        if model in m.active_models:
            out.append(1.0)
        elif len(m.active_models) + len(m.waiting_models) < m.max_active_models:
            out.append(0.8)
        elif model in m.waiting_models:
            out.append(0.6)
        else:
            out.append(0.0)
    return out


def token_load(cap: float) -> RefScorer:
    def score(state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[float]:
        loads = state.attributes(INFLIGHT_LOAD)
        if not loads:
            return [1.0] * len(endpoints)
        out: list[float] = []
        for load in map(loads.get, endpoints):
            t = 0 if load is None else load.tokens
            out.append(1.0 if t <= 0 else 1.0 - min(t, cap) / cap)
        return out

    return score


SCORERS: dict[str, tuple[RefScorer, bool]] = {  # type -> (formula, BOUNDED)
    "queue-scorer": (queue, True),
    "running-requests-size-scorer": (running, True),
    "kv-cache-utilization-scorer": (kv_cache, False),
    "prefix-cache-scorer": (prefix_cache, True),
    "lora-affinity-scorer": (lora_affinity, True),
}


# --- the max-score picker -------------------------------------------------------------------
def max_score_pick(
    endpoints: Sequence[Endpoint], scores: Sequence[float], k: int, rng: random.Random
) -> tuple[Endpoint, ...]:
    n = len(endpoints)
    if k == 1:
        best = max(scores)
        first = scores.index(best)
        try:
            scores.index(best, first + 1)
        except ValueError:
            return (endpoints[first],)
        ties = [i for i, s in enumerate(scores) if s == best]
        return (endpoints[ties[rng.randrange(len(ties))]],)
    k = min(k, n)
    top = heapq.nlargest(k, range(n), key=scores.__getitem__)
    cut = scores[top[-1]]
    above = [i for i in top if scores[i] > cut]
    above.sort(key=lambda i: (-scores[i], rng.random()))
    at_cut = [i for i, s in enumerate(scores) if s == cut]
    chosen = above + rng.sample(at_cut, k - len(above))
    return tuple(endpoints[i] for i in chosen)


# --- the profile's run ----------------------------------------------------------------------
def run_profile(
    state: CycleState,
    request: InferenceRequest,
    endpoints: Sequence[Endpoint],
    *,
    filters: Sequence[Callable[[CycleState, InferenceRequest, Sequence[Endpoint]], Sequence[Endpoint]]],
    scorers: Sequence[tuple[RefScorer, bool, float]],
    pick: Callable[[Sequence[Endpoint], Sequence[float]], Any],
) -> tuple[Any, list[float]] | None:
    """(the picker's answer, the totals it saw), or None when the filters left nothing."""
    eps = endpoints
    for f in filters:
        eps = f(state, request, eps)
        if not eps:
            break
    if not eps:
        return None
    n = len(eps)
    lists: list[Sequence[float]] = []
    for score, bounded, _ in scorers:
        scores = score(state, request, eps)
        assert len(scores) == n
        lists.append(scores if bounded else clamped(scores))
    totals = combine(lists, [w for _, _, w in scorers], n)
    return pick(eps, totals), totals
