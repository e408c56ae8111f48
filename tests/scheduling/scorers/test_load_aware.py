"""load-aware-scorer: llm-d-router's vectors (load_aware_test.go) and its threshold fallback."""

from __future__ import annotations

from typing import Any

import pytest

from epp.plugin.state import CycleState
from epp.scheduling.scorers.load_aware import LoadAwareScorer
from epp.testing.builders import make_endpoint, make_request
from epp.testing.plugins import build


def _score(queues: list[int], **params: Any) -> list[float]:
    eps = [make_endpoint(i, queue=q) for i, q in enumerate(queues)]
    scorer = build(LoadAwareScorer, **params)
    scores = list(scorer.score(CycleState(), make_request(), eps))
    assert scores == list(scorer.score_metrics([ep.metrics for ep in eps]))
    return scores


def test_upstream_vector_threshold_10() -> None:
    # pod-a queue 2 → 0.4, pod-b empty → 0.5, pod-c queue 15 (over the threshold) → 0.
    assert _score([2, 0, 15], threshold=10) == pytest.approx([0.4, 0.5, 0.0])


def test_default_threshold_is_128() -> None:
    assert _score([64]) == pytest.approx([0.25])


@pytest.mark.parametrize("bad", [0, -3])
def test_non_positive_threshold_falls_back_to_default(bad: int) -> None:
    assert _score([64], threshold=bad) == pytest.approx([0.25])


def test_not_normalised_over_candidates() -> None:
    # queue-scorer would give the less busy of two busy endpoints 1.0; this one does not.
    assert _score([100, 120], threshold=128) == pytest.approx([0.109375, 0.03125])
