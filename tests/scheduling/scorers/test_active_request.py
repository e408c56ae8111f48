"""active-request-scorer: llm-d-router's formula over the in-flight request counts."""

from __future__ import annotations

from typing import Any

import pytest

from epp.datalayer.attributes import INFLIGHT_LOAD, InFlightLoad
from epp.plugin.state import CycleState
from epp.scheduling.api import Scorer
from epp.scheduling.scorers.active_request import ActiveRequestScorer
from epp.testing.builders import make_endpoint, make_request
from epp.testing.plugins import build


def _score(counts: list[int | None], **params: Any) -> list[float]:
    eps = [make_endpoint(i) for i in range(len(counts))]
    state = CycleState()
    for ep, c in zip(eps, counts, strict=True):
        if c is not None:
            state.put_attribute(INFLIGHT_LOAD, ep, InFlightLoad(requests=c, tokens=0))
    scorer = build(ActiveRequestScorer, **params)
    assert isinstance(scorer, Scorer)
    return list(scorer.score(state, make_request(), eps))


def test_busiest_scores_zero_idle_scores_one() -> None:
    assert _score([0, 2, 4, None]) == [1.0, 0.5, 0.0, 1.0]


def test_idle_threshold_and_max_busy_score() -> None:
    assert _score([1, 2, 4], idleThreshold=1, maxBusyScore=0.5) == [1.0, 0.25, 0.0]


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_out_of_range_max_busy_score_is_ignored(bad: float) -> None:
    assert _score([2, 4], maxBusyScore=bad) == [0.5, 0.0]


def test_no_load_at_all() -> None:
    assert _score([None, None]) == [1.0, 1.0]
