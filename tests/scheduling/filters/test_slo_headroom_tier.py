"""slo-headroom-tier-filter: positive / negative tiers with epsilon exploration (gie-inventory §4.6)."""

from __future__ import annotations

import random

import pytest

from epp.datalayer.attributes import LATENCY_PREDICTION, LatencyPredictionInfo
from epp.errors import ConfigError
from epp.plugin.state import CycleState
from epp.scheduling.filters.slo_headroom_tier import SloHeadroomTierFilter
from epp.testing.plugins import build
from tests.scheduling.builders import endpoint, request


def info(ttft_h: float, tpot_h: float, valid: bool = True) -> LatencyPredictionInfo:
    return LatencyPredictionInfo(valid, valid, ttft_h, tpot_h, 50.0, 5.0, 0)


class _Rng(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def run(f: SloHeadroomTierFilter, infos: list[LatencyPredictionInfo | None]) -> list[int]:
    eps = [endpoint(i) for i in range(len(infos))]
    state = CycleState()
    state.set_attributes(
        LATENCY_PREDICTION, {ep: i for ep, i in zip(eps, infos, strict=True) if i is not None}
    )
    kept = f.filter(state, request(), eps)
    return [eps.index(ep) for ep in kept]


def test_positive_tier_unless_exploring() -> None:
    f = build(SloHeadroomTierFilter)
    assert f.epsilon == 0.01
    f.rng = _Rng(0.5)
    assert run(f, [info(1, 1), info(-1, 1), info(0, 0), None]) == [0, 2]
    f.rng = _Rng(0.001)  # < epsilon: explore the negative tier (no prediction joins it)
    assert run(f, [info(1, 1), info(-1, 1), info(0, 0), None]) == [1, 3]


def test_single_tier_and_no_predictions() -> None:
    f = build(SloHeadroomTierFilter)
    assert run(f, [info(-1, -1), info(1, -1)]) == [0, 1]
    assert run(f, [info(1, 1), info(2, 2)]) == [0, 1]
    assert run(f, [None, info(5, 5, valid=False)]) == [0, 1]  # no valid prediction: all


def test_epsilon_validated() -> None:
    with pytest.raises(ConfigError, match="epsilonExploreNeg"):
        build(SloHeadroomTierFilter, epsilonExploreNeg=1.5)
