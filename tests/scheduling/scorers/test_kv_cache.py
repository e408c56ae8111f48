"""kv-cache-utilization-scorer: 1 - utilisation."""

from __future__ import annotations

import pytest

from epp.plugin.state import CycleState
from epp.scheduling.api import ScorerCategory
from epp.scheduling.scorers.kv_cache import KVCacheUtilizationScorer
from epp.testing.plugins import build
from tests.scheduling.builders import endpoint, request


@pytest.mark.parametrize(
    ("kv", "expected"),
    [
        pytest.param([0.2, 0.1, 0.2], [0.8, 0.9, 0.8], id="hermetic-case-1"),
        pytest.param([0.0, 1.0], [1.0, 0.0], id="empty-and-full"),
        pytest.param([0.85], [0.15], id="single"),
    ],
)
def test_kv_cache_scorer(kv: list[float], expected: list[float]) -> None:
    """Score is one minus the KV-cache usage fraction."""
    scorer = build(KVCacheUtilizationScorer)
    eps = [endpoint(i, kv=k) for i, k in enumerate(kv)]
    assert scorer.score(CycleState(), request(), eps) == pytest.approx(expected)
    assert scorer.CATEGORY is ScorerCategory.DISTRIBUTION
