"""prefix-cache-scorer: match_blocks / total_blocks from PREFIX_MATCH."""

from __future__ import annotations

import pytest

from epp.datalayer.attributes import PREFIX_MATCH, PrefixMatchInfo
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
