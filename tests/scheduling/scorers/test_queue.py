"""queue-scorer and running-requests-size-scorer: min/max normalisation."""

from __future__ import annotations

import pytest

from epp.plugin.state import CycleState
from epp.scheduling.api import Scorer, ScorerCategory
from epp.scheduling.scorers.queue import QueueScorer
from epp.scheduling.scorers.running_requests import RunningRequestsSizeScorer
from epp.testing.plugins import PluginClass, build
from tests.scheduling.builders import endpoint, request


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param([10, 5, 0], [0.0, 0.5, 1.0], id="linear-between-min-and-max"),
        pytest.param([3, 0, 10], [0.7, 1.0, 0.0], id="hermetic-case-1"),
        pytest.param([5, 5], [1.0, 1.0], id="all-equal-neutral"),
        pytest.param([0], [1.0], id="single-endpoint"),
        pytest.param([2, 4, 6, 10], [1.0, 0.75, 0.5, 0.0], id="four-endpoints"),
    ],
)
def test_queue_scorer(values: list[int], expected: list[float]) -> None:
    """The shortest queue scores 1, the longest 0, the rest linearly between; all equal → 1."""
    scorer = build(QueueScorer)
    eps = [endpoint(i, queue=q) for i, q in enumerate(values)]
    assert scorer.score(CycleState(), request(), eps) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param([10, 5, 0], [0.0, 0.5, 1.0], id="linear"),
        pytest.param([7, 7, 7], [1.0, 1.0, 1.0], id="all-equal"),
    ],
)
def test_running_requests_scorer(values: list[int], expected: list[float]) -> None:
    """Same normalisation as the queue scorer, on running_requests_size."""
    scorer = build(RunningRequestsSizeScorer)
    eps = [endpoint(i, running=r, queue=100 - i) for i, r in enumerate(values)]
    assert scorer.score(CycleState(), request(), eps) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("cls", "category"),
    [
        pytest.param(QueueScorer, ScorerCategory.DISTRIBUTION, id="queue"),
        pytest.param(RunningRequestsSizeScorer, ScorerCategory.DISTRIBUTION, id="running"),
    ],
)
def test_scorer_protocol_and_category(cls: PluginClass[Scorer], category: ScorerCategory) -> None:
    """Both satisfy the Scorer protocol and declare GIE's category."""
    scorer = build(cls)
    assert isinstance(scorer, Scorer)
    assert scorer.CATEGORY is category
