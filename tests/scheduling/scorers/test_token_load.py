"""token-load-scorer: 1 - min(tokens, T) / T from INFLIGHT_LOAD."""

from __future__ import annotations

import pytest

from epp.datalayer.attributes import INFLIGHT_LOAD, InFlightLoad
from epp.plugin.state import CycleState
from epp.scheduling.scorers.token_load import DEFAULT_QUEUE_THRESHOLD_TOKENS, TokenLoadScorer
from epp.testing.plugins import build
from tests.scheduling.builders import endpoint, request


@pytest.mark.parametrize(
    ("threshold", "tokens", "expected"),
    [
        pytest.param(1000, [0, 250, 1000, 5000], [1.0, 0.75, 0.0, 0.0], id="linear-and-capped"),
        pytest.param(1000, [-5], [1.0], id="negative-load-is-idle"),
        pytest.param(0, [DEFAULT_QUEUE_THRESHOLD_TOKENS // 2], [0.5], id="zero-threshold-means-default"),
        pytest.param(
            -1, [DEFAULT_QUEUE_THRESHOLD_TOKENS // 4], [0.75], id="negative-threshold-means-default"
        ),
    ],
)
def test_token_load(threshold: int, tokens: list[int], expected: list[float]) -> None:
    """Tokens in flight reduce the score linearly up to the threshold."""
    scorer = build(TokenLoadScorer, queueThresholdTokens=threshold)
    eps = [endpoint(i) for i in range(len(tokens))]
    state = CycleState()
    state.set_attributes(
        INFLIGHT_LOAD, {ep: InFlightLoad(requests=1, tokens=t) for ep, t in zip(eps, tokens, strict=False)}
    )
    assert scorer.score(state, request(), eps) == pytest.approx(expected)


def test_token_load_missing_attribute() -> None:
    """No INFLIGHT_LOAD (for the state or one endpoint) counts as idle."""
    scorer = build(TokenLoadScorer, queueThresholdTokens=100)
    eps = [endpoint(0), endpoint(1)]
    assert scorer.score(CycleState(), request(), eps) == [1.0, 1.0]
    state = CycleState()
    state.put_attribute(INFLIGHT_LOAD, eps[0], InFlightLoad(requests=1, tokens=50))
    assert scorer.score(state, request(), eps) == pytest.approx([0.5, 1.0])
    assert INFLIGHT_LOAD in TokenLoadScorer.CONSUMES
