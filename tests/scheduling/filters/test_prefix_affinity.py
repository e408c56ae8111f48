"""prefix-cache-affinity-filter: thresholds, exploration and the TTFT gate."""

from __future__ import annotations

import random
from typing import Any

import pytest

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import (
    INFLIGHT_LOAD,
    LATENCY_PREDICTION,
    PRECISE_PREFIX_MATCH,
    PREFIX_MATCH,
    InFlightLoad,
    LatencyPredictionInfo,
    PrefixMatchInfo,
)
from epp.errors import ConfigError
from epp.plugin.state import CycleState
from epp.scheduling.filters.prefix_affinity import PrefixCacheAffinityFilter
from epp.testing.plugins import build
from tests.scheduling.builders import endpoint, request


class _FixedRng(random.Random):
    """Returns ``value`` from random(): decides the exploration draw."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


class _UnusedRng(random.Random):
    """Fails the test if the filter draws from it."""

    def random(self) -> float:
        raise AssertionError("the filter consulted the RNG")


def _state(eps: list[Endpoint], matches: list[int], ttfts: list[float | None] | None = None) -> CycleState:
    state = CycleState()
    for ep, m in zip(eps, matches, strict=False):
        state.put_attribute(PREFIX_MATCH, ep, PrefixMatchInfo(m, 10, 16))
    for ep, t in zip(eps, ttfts or [], strict=False):
        if t is not None:
            state.put_attribute(
                LATENCY_PREDICTION, ep, LatencyPredictionInfo(True, True, 0.0, 0.0, t, 0.0, 0)
            )
    return state


@pytest.mark.parametrize(
    ("params", "draw", "matches", "ttfts", "expected"),
    [
        pytest.param({}, 0.5, [9, 2, 8], None, [0, 2], id="sticky-only"),
        pytest.param({}, 0.5, [8, 2], None, [0], id="threshold-inclusive"),
        pytest.param({}, 0.5, [7, 2, 0], None, [0, 1, 2], id="no-sticky-keeps-all"),
        pytest.param({}, 0.005, [9, 2], None, [0, 1], id="exploration-keeps-all"),
        pytest.param({}, 0.01, [9, 2], None, [0], id="exploration-boundary"),
        pytest.param({"explorationProbability": 1.0}, 0.999, [9, 2], None, [0, 1], id="always-explore"),
        pytest.param({"affinityThreshold": 0}, 0.5, [9, 2], None, [0, 1], id="zero-threshold-passthrough"),
        pytest.param({"affinityThreshold": 0.5}, 0.5, [5, 4], None, [0], id="custom-threshold"),
        pytest.param({}, 0.5, [9, 2], [7000.0, 1000.0], [0, 1], id="ttft-penalty-breaks-stickiness"),
        pytest.param({}, 0.5, [9, 2], [6000.0, 1000.0], [0], id="ttft-penalty-at-limit-sticks"),
        pytest.param(
            {"maxTTFTPenaltyMs": 0}, 0.5, [9, 2], [99999.0, 1.0], [0], id="zero-penalty-always-sticks"
        ),
        pytest.param({}, 0.5, [9, 2], [None, 1000.0], [0, 1], id="sticky-without-prediction-is-max-ttft"),
        pytest.param({}, 0.5, [9, 2], [1000.0, None], [0], id="others-without-prediction"),
        pytest.param({}, 0.5, [9, 9], None, [0, 1], id="all-sticky"),
    ],
)
def test_affinity_filter(
    params: dict[str, Any],
    draw: float,
    matches: list[int],
    ttfts: list[float | None] | None,
    expected: list[int],
) -> None:
    """GIE's decision order: passthrough, exploration, no sticky, TTFT gate, sticky only."""
    f = build(PrefixCacheAffinityFilter, **params)
    f.rng = _FixedRng(draw)
    eps = [endpoint(i) for i in range(len(matches))]
    got = f.filter(_state(eps, matches, ttfts), request(), eps)
    assert [eps.index(e) for e in got] == expected


def test_single_endpoint_passthrough() -> None:
    """One candidate is returned as is, without consulting the RNG."""
    f = build(PrefixCacheAffinityFilter)
    f.rng = _UnusedRng(0)
    eps = [endpoint(0)]
    assert list(f.filter(CycleState(), request(), eps)) == eps


def test_exploration_rate_with_seeded_rng() -> None:
    """With p = 0.2 about a fifth of the calls keep everything."""
    f = build(PrefixCacheAffinityFilter, explorationProbability=0.2)
    f.rng = random.Random(99)
    eps = [endpoint(0), endpoint(1)]
    state = _state(eps, [10, 0])
    kept_all = sum(len(f.filter(state, request(), eps)) == 2 for _ in range(5000))
    assert 900 < kept_all < 1100


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param(
            {"affinityThreshold": 1.5}, "affinityThreshold must be <= 1.0, got 1.500000", id="threshold"
        ),
        pytest.param(
            {"explorationProbability": -0.1},
            "explorationProbability must be in \\[0, 1\\], got -0.100000",
            id="p-low",
        ),
        pytest.param(
            {"explorationProbability": 1.1},
            "explorationProbability must be in \\[0, 1\\], got 1.100000",
            id="p-high",
        ),
        pytest.param({"maxTTFTPenaltyMs": -1}, "maxTTFTPenaltyMs must be >= 0, got -1.000000", id="penalty"),
    ],
)
def test_affinity_filter_validation(params: dict[str, Any], message: str) -> None:
    """Invalid parameters fail at build time with GIE's messages."""
    with pytest.raises(ConfigError, match=message):
        build(PrefixCacheAffinityFilter, **params)


# --- llm-d-router's prefillThroughput TTFT source ----------------------------------------------
def _loaded(eps: list[Endpoint], matches: list[int], tokens: list[int]) -> CycleState:
    state = _state(eps, matches)
    for ep, t in zip(eps, tokens, strict=True):
        state.put_attribute(INFLIGHT_LOAD, ep, InFlightLoad(requests=1, tokens=t))
    return state


@pytest.mark.parametrize(
    ("sticky_tokens", "kept"),
    [
        (10_000, [0]),  # 10000 / 1000 * 1000 = 10 s - 0 s = 10000 ms <= 18000: stay sticky
        (20_000, [0, 1]),  # 20 s behind the idle pod: break stickiness
    ],
)
def test_peak_prefill_throughput_estimates_ttft_from_in_flight_tokens(
    sticky_tokens: int, kept: list[int]
) -> None:
    f = build(
        PrefixCacheAffinityFilter,
        peakPrefillThroughput=1000,
        maxTTFTPenaltyMs=18000,
        explorationProbability=0,
    )
    eps = [endpoint(0), endpoint(1)]
    out = f.filter(_loaded(eps, [9, 0], [sticky_tokens, 0]), request(), eps)
    assert [eps.index(e) for e in out] == kept


def test_throughput_source_consumes_in_flight_load_and_gie_default_does_not() -> None:
    assert INFLIGHT_LOAD in build(PrefixCacheAffinityFilter, peakPrefillThroughput=33821).CONSUMES
    assert INFLIGHT_LOAD in build(PrefixCacheAffinityFilter, ttftSource="prefillThroughput").CONSUMES
    assert INFLIGHT_LOAD not in build(PrefixCacheAffinityFilter).CONSUMES
    with pytest.raises(ConfigError, match="peakPrefillThroughput must be > 0"):
        build(PrefixCacheAffinityFilter, ttftSource="prefillThroughput", peakPrefillThroughput=0)


def test_stickiness_follows_the_engines_reported_prefix_where_the_precise_scorer_runs() -> None:
    """The approximate index says endpoint 0 holds the prompt; the engines' events say endpoint
    1 does (0 evicted it): endpoint 1 is the sticky one."""
    eps = [endpoint(i) for i in range(3)]
    state = _state(eps, [9, 0, 0])
    f = build(PrefixCacheAffinityFilter)
    f.rng = _FixedRng(0.5)
    assert PRECISE_PREFIX_MATCH in f.READS
    assert list(f.filter(state, request(), eps)) == [eps[0]]
    for ep, m in zip(eps, [0, 9, 1], strict=True):
        state.put_attribute(PRECISE_PREFIX_MATCH, ep, PrefixMatchInfo(m, 10, 16))
    assert list(f.filter(state, request(), eps)) == [eps[1]]
