"""precise-prefix-cache-scorer: longest reported prefix per endpoint, llm-d's normalisation, the
approximate fallback per inconsistent endpoint, and predicted vs observed reuse."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from epp.datalayer.attributes import PREFIX_MATCH, PrefixMatchInfo
from epp.datalayer.kvevents.hashing import BlockHasher
from epp.errors import ConfigError
from epp.plugin.state import CycleState
from epp.request import ResponseInfo, Usage
from epp.scheduling.api import ProfileRunResult, SchedulingResult
from epp.scheduling.scorers.precise_prefix import PRECISE_PREFIX_MATCH, PrecisePrefixCacheScorer
from epp.testing.plugins import build
from tests.scheduling.builders import endpoint, request

TOKENS = list(range(1000, 1000 + 16 * 8))  # 8 blocks
PARAMS: dict[str, Any] = {"tokenProcessorConfig": {"hashSeed": "42"}}


def scorer(**params: Any) -> PrecisePrefixCacheScorer:
    s: PrecisePrefixCacheScorer = build(PrecisePrefixCacheScorer, **{**PARAMS, **params})
    return s


def seed(s: PrecisePrefixCacheScorer, held: list[int], *, consistent: tuple[bool, ...] = ()) -> list[Any]:
    """Endpoints 0..n-1; endpoint i holds the first held[i] blocks of TOKENS."""
    hashes = BlockHasher("sha256_cbor", 16, "42").hashes(TOKENS)
    eps = [endpoint(i) for i in range(len(held))]
    for i, (ep, n) in enumerate(zip(eps, held, strict=True)):
        st = s.index.add_endpoint(ep.metadata.name)
        st.consistent = consistent[i] if consistent else True
        s.index.stored(st.slot, hashes[:n])
    return eps


def test_longest_prefix_min_max_normalised_as_llm_d() -> None:
    s = scorer()
    eps = seed(s, [8, 2, 0, 5])
    state = CycleState()
    s.prepare(state, request(), eps, TOKENS)
    infos = state.attributes(PRECISE_PREFIX_MATCH)
    assert [infos[ep].match_blocks for ep in eps] == [8, 2, 0, 5]
    assert s.score(state, request(), eps) == pytest.approx([1.0, 0.0, 0.0, 0.5])
    one = CycleState()
    s.prepare(one, request(), eps[1:3], TOKENS)
    assert s.score(one, request(), eps[1:3]) == [1.0, 0.0]  # a single matching endpoint scores 1


def test_fraction_normalisation() -> None:
    s = scorer(scoreNormalization="fraction")
    eps = seed(s, [8, 2])
    state = CycleState()
    s.prepare(state, request(), eps, TOKENS)
    assert s.score(state, request(), eps) == pytest.approx([1.0, 0.25])


@pytest.mark.parametrize(("approx_blocks", "expected"), [(4, 8), (1, 6), (0, 6)])
def test_inconsistent_endpoint_takes_the_larger_of_events_and_approximate(
    approx_blocks: int, expected: int
) -> None:
    """Endpoint 1's events are untrusted: its run is max(what its events say (6), the approximate
    index's run converted to engine blocks (approx_blocks x 32 tokens / 16)); the others are exact."""
    s = scorer()
    eps = seed(s, [8, 6, 1], consistent=(True, False, True))
    state = CycleState()
    state.set_attributes(
        PREFIX_MATCH,
        {ep: PrefixMatchInfo(4, 4, 32) for ep in eps} | {eps[1]: PrefixMatchInfo(approx_blocks, 4, 32)},
    )
    s.prepare(state, request(), eps, TOKENS)
    infos = state.attributes(PRECISE_PREFIX_MATCH)
    assert [infos[ep].match_blocks for ep in eps] == [8, expected, 1]  # 0 and 2 ignore the approximate 4


def test_untokenisable_request_falls_back_for_every_endpoint() -> None:
    s = scorer()
    eps = seed(s, [8, 8])
    state = CycleState()
    state.set_attributes(PREFIX_MATCH, {eps[0]: PrefixMatchInfo(1, 4, 16), eps[1]: PrefixMatchInfo(2, 4, 16)})
    s.prepare(state, request(), eps, None)
    assert [state.attributes(PRECISE_PREFIX_MATCH)[ep].match_blocks for ep in eps] == [1, 2]


def test_predicted_vs_observed_reuse() -> None:
    s = scorer()
    eps = seed(s, [8, 3])
    for picked, observed in [(0, 112), (1, 48), (0, 100)]:
        state = CycleState()
        s.prepare(state, request(), eps, TOKENS)
        result = SchedulingResult({"default": ProfileRunResult((eps[picked],))}, "default")
        s.pre_request(state, request(), result)
        response = ResponseInfo(request_id="r", end_of_stream=True, usage=Usage(cached_tokens=observed))
        s.response_complete(state, request(), response, eps[picked])
    seen = s.debug_state()["predictedVsObserved"]
    # a full 8-block hit predicts 7 blocks (vLLM recomputes the last prompt token): 112 tokens
    assert seen["samples"] == 3
    assert seen["meanPredictedTokens"] == pytest.approx((112 + 48 + 112) / 3)
    assert seen["meanAbsErrorTokens"] == pytest.approx(12 / 3)
    assert seen["pearson"] == pytest.approx(statistics.correlation([112, 48, 112], [112, 48, 100]))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"tokenProcessorConfig": {"hashAlgo": "md5"}}, "hashAlgo"),
        ({"tokenProcessorConfig": {"blockSize": 0}}, "blockSize"),
        ({"tokenizerConfig": {"mode": "local"}}, "tokenizerPath"),
        ({"kvEventsConfig": {"discoverPods": False}}, "per-endpoint"),
    ],
)
def test_invalid_configuration_is_refused(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build(PrecisePrefixCacheScorer, **params)


def test_events_are_expected_only_when_the_engine_stores_new_blocks() -> None:
    """A fully cached prompt publishes nothing: routing it must not arm the silence watchdog."""
    s = scorer()
    eps = seed(s, [8, 3])
    s.subscriber.add(eps[0])
    s.subscriber.add(eps[1])
    for picked in (0, 1):
        state = CycleState()
        s.prepare(state, request(), eps, TOKENS)
        s.pre_request(
            state, request(), SchedulingResult({"default": ProfileRunResult((eps[picked],))}, "default")
        )
    assert set(s.subscriber._expect) == {eps[1].metadata.name}
