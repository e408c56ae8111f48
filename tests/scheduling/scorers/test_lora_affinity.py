"""lora-affinity-scorer: 1.0 / 0.8 / 0.6 / 0.0 tiers."""

from __future__ import annotations

import pytest

from epp.plugin.state import CycleState
from epp.scheduling.api import ScorerCategory
from epp.scheduling.scorers.lora_affinity import LoraAffinityScorer
from epp.testing.plugins import build
from tests.scheduling.builders import endpoint, request


@pytest.mark.parametrize(
    ("active", "waiting", "max_active", "expected"),
    [
        pytest.param(["sql-lora"], [], 0, 1.0, id="active"),
        pytest.param(["sql-lora", "a", "b"], ["c"], 2, 1.0, id="active-beats-full"),
        pytest.param(["a"], [], 2, 0.8, id="room-to-load"),
        pytest.param(["a"], ["sql-lora"], 3, 0.8, id="room-beats-waiting"),
        pytest.param(["a"], ["sql-lora"], 2, 0.6, id="waiting-no-room"),
        pytest.param(["a", "b"], [], 2, 0.0, id="full"),
        pytest.param([], [], 0, 0.0, id="no-lora-support"),
    ],
)
def test_lora_affinity(active: list[str], waiting: list[str], max_active: int, expected: float) -> None:
    """Active adapter 1.0, else free slot 0.8, else waiting 0.6, else 0."""
    scorer = build(LoraAffinityScorer)
    ep = endpoint(0, active=active, waiting=waiting, max_active=max_active)
    assert scorer.score(CycleState(), request(model="sql-lora"), [ep]) == [expected]
    assert scorer.CATEGORY is ScorerCategory.AFFINITY
