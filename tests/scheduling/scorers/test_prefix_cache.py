"""prefix-cache-scorer: match_blocks / total_blocks from PREFIX_MATCH."""

from __future__ import annotations

from typing import Any

import pytest

from epp.datalayer.attributes import PREFIX_MATCH, PrefixMatchInfo
from epp.errors import ConfigError
from epp.plugin.state import CycleState
from epp.scheduling.api import ScorerCategory
from epp.scheduling.scorers.prefix_cache import PrefixCacheScorer
from epp.testing.plugins import build
from tests.scheduling.builders import endpoint, request


@pytest.mark.parametrize(
    ("infos", "expected"),
    [
        pytest.param([(4, 8), (8, 8), (0, 8)], [0.5, 1.0, 0.0], id="ratio"),
        pytest.param([(0, 0), (3, 0)], [0.0, 0.0], id="no-blocks"),
        pytest.param([None, (1, 4)], [0.0, 0.25], id="missing-info"),
    ],
)
def test_prefix_scorer(infos: list[tuple[int, int] | None], expected: list[float]) -> None:
    """Score is the matched share of the request's blocks; 0 without info or blocks."""
    scorer = build(PrefixCacheScorer)
    eps = [endpoint(i) for i in range(len(infos))]
    state = CycleState()
    for ep, info in zip(eps, infos, strict=False):
        if info is not None:
            state.put_attribute(PREFIX_MATCH, ep, PrefixMatchInfo(info[0], info[1], 16))
    assert scorer.score(state, request(), eps) == pytest.approx(expected)


def test_prefix_scorer_without_producer() -> None:
    """With no PREFIX_MATCH at all every endpoint scores 0; the key is declared consumed."""
    scorer = build(PrefixCacheScorer)
    assert scorer.score(CycleState(), request(), [endpoint(0), endpoint(1)]) == [0.0, 0.0]
    assert frozenset({PREFIX_MATCH}) == PrefixCacheScorer.CONSUMES
    assert scorer.CATEGORY is ScorerCategory.AFFINITY


def _weighted(infos: list[tuple[int, int, int]], **params: Any) -> list[float]:
    scorer = build(PrefixCacheScorer, **params)
    eps = [endpoint(i) for i in range(len(infos))]
    state = CycleState()
    for ep, (m, t, bs) in zip(eps, infos, strict=True):
        state.put_attribute(PREFIX_MATCH, ep, PrefixMatchInfo(m, t, bs))
    scores = list(scorer.score(state, request(), eps))
    fast = scorer.add_weighted_scores(state, request(), eps, None, 2.0)
    assert fast == pytest.approx([s * 2.0 for s in scores])
    return scores


def test_upstream_ratio_vector() -> None:
    """llm-d-router plugin_test.go TestPrefixPluginScore: 5/10 → 0.5, 2/10 → 0.2."""
    assert _weighted([(5, 10, 1), (2, 10, 1)]) == pytest.approx([0.5, 0.2])


def test_upstream_match_length_weight_vector() -> None:
    """TestPrefixPluginScoreWithWeights: same ratio, the longer match scores higher."""
    scores = _weighted([(5, 10, 1), (50, 100, 1)], matchLengthWeight=0.5, matchLengthScaleTokens=100)
    assert scores == pytest.approx([0.25125, 0.375], abs=1e-6)


@pytest.mark.parametrize(
    "params",
    [
        {"matchLengthWeight": -0.1, "matchLengthScaleTokens": 100},
        {"matchLengthWeight": 1.1, "matchLengthScaleTokens": 100},
        {"matchLengthWeight": 0.5, "matchLengthScaleTokens": 0},
    ],
)
def test_upstream_invalid_params(params: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="matchLength"):
        build(PrefixCacheScorer, **params)


def test_zero_weight_needs_no_scale_and_producer_name_is_accepted() -> None:
    scorer = build(PrefixCacheScorer, matchLengthWeight=0.0, prefixMatchInfoProducerName="precise")
    assert scorer.match_length_scale_tokens == 8192
    assert scorer.producer_name == "precise"


@pytest.mark.parametrize("shared_miss", [True, False], ids=["shared-miss-info", "distinct-infos"])
def test_add_weighted_into_totals_is_score_times_weight_added(shared_miss: bool) -> None:
    """Into running totals: ``t + score * weight`` bit for bit, whether an endpoint's info is the
    producer's shared miss object (computed once) or its own; totals of another length raise."""
    scorer = build(PrefixCacheScorer)
    eps = [endpoint(i) for i in range(5)]
    state = CycleState()
    miss = PrefixMatchInfo(0, 7, 16)
    for i, ep in enumerate(eps):
        if i == 2:
            continue  # no info at all: scores 0
        info = PrefixMatchInfo(i, 7, 16) if i % 2 else (miss if shared_miss else PrefixMatchInfo(0, 7, 16))
        state.put_attribute(PREFIX_MATCH, ep, info)
    totals = [0.1, 0.7, 1.3, 0.2, 2.9]
    scores = scorer.score(state, request(), eps)
    got = scorer.add_weighted_scores(state, request(), eps, totals, 3.0)
    assert got == [t + s * 3.0 for t, s in zip(totals, scores, strict=True)]  # exact, not approx
    assert scorer.add_weighted_scores(state, request(), eps, None, 3.0) == [s * 3.0 for s in scores]
    with pytest.raises((ValueError, IndexError)):
        scorer.add_weighted_scores(state, request(), eps, totals[:4], 3.0)
    with pytest.raises(ValueError, match="totals"):
        scorer.add_weighted_scores(state, request(), eps, [*totals, 0.0], 3.0)
