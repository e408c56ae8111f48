"""no-hit-lru-scorer: llm-d-router's vectors (no_hit_lru_test.go) over our cycle state."""

from __future__ import annotations

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import PREFIX_MATCH, PrefixMatchInfo
from epp.plugin.state import CycleState
from epp.scheduling.api import ProfileRunResult, SchedulingResult
from epp.scheduling.scorers.no_hit_lru import NoHitLruScorer
from epp.testing.plugins import build
from tests.scheduling.builders import endpoint, request


def _state(warm: Endpoint | None = None) -> CycleState:
    state = CycleState()
    if warm is not None:
        state.put_attribute(PREFIX_MATCH, warm, PrefixMatchInfo(5, 10, 1))
    return state


def _serve(
    scorer: NoHitLruScorer, eps: list[Endpoint], target: Endpoint, *, warm: bool = False
) -> list[float]:
    """One request: score, then PreRequest with ``target`` as the pick."""
    state = _state(eps[0] if warm else None)
    scores = list(scorer.score(state, request(), eps))
    result = SchedulingResult(profile_results={"p": ProfileRunResult((target,))}, primary_profile_name="p")
    scorer.pre_request(state, request(), result)
    return scores


def test_cold_request_fresh_lru_ranks_in_candidate_order() -> None:
    eps = [endpoint(i) for i in range(3)]
    assert build(NoHitLruScorer).score(_state(), request(), eps) == [1.0, 0.5, 0.0]


def test_warm_request_is_neutral() -> None:
    eps = [endpoint(i) for i in range(3)]
    assert build(NoHitLruScorer).score(_state(eps[1]), request(), eps) == [0.5, 0.5, 0.5]


def test_single_and_no_endpoint() -> None:
    scorer = build(NoHitLruScorer)
    assert scorer.score(_state(), request(), [endpoint(0)]) == [1.0]
    assert list(scorer.score(_state(), request(), [])) == []


def test_prefers_least_recently_used_after_cold_requests() -> None:
    """TestNoHitLRUPreferLeastRecentlyUsedAfterColdRequests, step by step."""
    a, b, c = eps = [endpoint(i) for i in range(3)]
    scorer = build(NoHitLruScorer)
    _serve(scorer, eps, a)
    cold = _serve(scorer, eps, b)  # b, c never used: ranks 0, 1; a used: rank 2
    assert cold == [0.0, 1.0, 0.5]
    warm = _serve(scorer, eps, b, warm=True)
    assert warm == [0.5, 0.5, 0.5]
    # the warm request left the order alone: c never used → 1.0, a oldest → 0.5, b newest → 0
    assert _serve(scorer, eps, c) == [0.5, 0.0, 1.0]
    assert scorer.score(_state(), request(), eps) == [1.0, 0.5, 0.0]  # a is now the oldest


def test_prefill_pick_is_tracked_too() -> None:
    pa, pb, da, db = eps = [endpoint(i) for i in range(4)]
    scorer = build(NoHitLruScorer)
    state = _state()
    scorer.score(state, request(), eps)
    result = SchedulingResult(
        profile_results={"prefill": ProfileRunResult((pa,)), "decode": ProfileRunResult((da,))},
        primary_profile_name="decode",
    )
    scorer.pre_request(state, request(), result)
    prefill = scorer.score(_state(), request(), [pa, pb])
    decode = scorer.score(_state(), request(), [da, db])
    assert prefill[1] > prefill[0]
    assert decode[1] > decode[0]


def test_lru_size_bounds_memory() -> None:
    eps = [endpoint(i) for i in range(5)]
    scorer = build(NoHitLruScorer, lruSize=2)
    for ep in eps:
        _serve(scorer, [ep], ep)
    assert scorer.debug_state()["endpoints"] == [eps[3].name, eps[4].name]
