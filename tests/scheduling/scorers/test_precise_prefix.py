"""precise-prefix-cache-scorer: longest reported prefix per endpoint, llm-d's normalisation, the
approximate fallback per inconsistent endpoint, and predicted vs observed reuse."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from epp.datalayer.attributes import PRECISE_PREFIX_MATCH, PREFIX_MATCH, PrefixMatchInfo
from epp.datalayer.kvevents.hashing import BlockHasher
from epp.errors import ConfigError
from epp.plugin.state import CycleState
from epp.request import ResponseInfo, Usage
from epp.scheduling.api import ProfileRunResult, SchedulingResult
from epp.scheduling.scorers.precise_prefix import PrecisePrefixCacheScorer
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


def test_each_prediction_is_kept_beside_what_the_engine_reported() -> None:
    """recentPredictions: per request, predicted/as routed/from reports only/observed, the prompt,
    the new blocks queued ahead on the pick and the time to its first byte (-1: none seen)."""
    s = scorer()
    eps = seed(s, [8, 3])
    picked = SchedulingResult({"default": ProfileRunResult((eps[1],))}, "default")
    state = CycleState()
    s.prepare(state, request(), eps, TOKENS)
    s.pre_request(state, request(), picked)
    s.response_body(state, request(), ResponseInfo(request_id="r"), b"data: {}", eps[1])
    done = ResponseInfo(request_id="r", end_of_stream=True, usage=Usage(cached_tokens=32))
    s.response_complete(state, request(), done, eps[1])
    other = CycleState()
    s.prepare(other, request(), eps, TOKENS)
    s.pre_request(other, request(), picked)
    s.response_complete(other, request(), done, eps[1])
    recent = s.debug_state()["recentPredictions"]
    rows = [dict(zip(recent["fields"], row, strict=True)) for row in recent["rows"]]
    assert [(r["predicted"], r["predictedConfirmed"], r["observed"]) for r in rows] == [
        (48, 48, 32),
        (112, 48, 32),
    ]
    assert [r["promptTokens"] for r in rows] == [len(TOKENS)] * 2
    # the first request queued 5 new blocks; it ended before the second was routed
    assert [r["queuedNewBlocksAtPick"] for r in rows] == [0, 0]
    assert rows[0]["firstByteMs"] >= 0
    assert rows[1]["firstByteMs"] == -1


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"tokenProcessorConfig": {"hashAlgo": "md5"}}, "hashAlgo"),
        ({"tokenProcessorConfig": {"blockSize": -1}}, "blockSize. must be > 0, got -1"),
        ({"tokenProcessorConfig": {"blockSizeTokens": -4, "blockSize": 16}}, "must be > 0, got -4"),
        ({"tokenizerConfig": {"mode": "local"}}, "tokenizerPath"),
        ({"kvEventsConfig": {"discoverPods": False}}, "no event source: set zmqEndpoint"),
        ({"kvEventsConfig": {"zmqEndpoint": "127.0.0.1:5557"}}, "zmqEndpoint must be a tcp:"),
    ],
)
def test_invalid_configuration_is_refused(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build(PrecisePrefixCacheScorer, **params)


def test_events_are_expected_only_when_the_engine_stores_new_blocks() -> None:
    """A fully cached prompt publishes nothing: routing it must not arm the silence watchdog.  A
    request that stores new blocks arms it at its first response byte (served), not at routing
    (it may queue in the engine longer than the timeout), and only for a successful response."""
    s = scorer()
    eps = seed(s, [8, 3])
    s.subscriber.add(eps[0])
    s.subscriber.add(eps[1])
    states = []
    for picked in (1, 0, 1):
        state = CycleState()
        s.prepare(state, request(), eps, TOKENS)
        s.pre_request(
            state, request(), SchedulingResult({"default": ProfileRunResult((eps[picked],))}, "default")
        )
        states.append(state)
    assert s.subscriber._expect == {}  # nothing is due before the engine serves
    s.response_body(states[0], request(), ResponseInfo(request_id="r", status=503), b"error", eps[1])
    assert s.subscriber._expect == {}  # an error response stored nothing
    for state, ep in zip(states[1:], eps, strict=True):
        s.response_body(state, request(), ResponseInfo(request_id="r", status=200), b"{", ep)
    assert set(s.subscriber._expect) == {eps[1].metadata.name}


def route(s: PrecisePrefixCacheScorer, eps: list[Any], picked: int) -> tuple[CycleState, list[float]]:
    """Prepare, score and route one request for TOKENS to eps[picked]."""
    state = CycleState()
    s.prepare(state, request(), eps, TOKENS)
    scores = list(s.score(state, request(), eps))
    s.pre_request(
        state, request(), SchedulingResult({"default": ProfileRunResult((eps[picked],))}, "default")
    )
    return state, scores


def test_a_routed_request_makes_its_blocks_pending_on_the_pick() -> None:
    """Events come after prefill: the request routed to endpoint 1 holds its prefix there for the
    scorer at once; once the engine reports it, a request adds no pending blocks."""
    s = scorer()
    eps = seed(s, [0, 0, 0])
    _, first = route(s, eps, 1)
    assert first == [0.0, 0.0, 0.0]
    _, second = route(s, eps, 1)
    assert second == [0.0, 1.0, 0.0]
    hashes = BlockHasher("sha256_cbor", 16, "42").hashes(TOKENS)
    s.index.stored(s.index.states[eps[1].metadata.name].slot, hashes)
    _, third = route(s, eps, 1)
    assert third == [0.0, 1.0, 0.0]


def test_a_prefix_evicted_while_its_request_waits_stays_with_that_request() -> None:
    """Endpoint 1 reports the prefix and a request for it is routed there; the engine then evicts
    the prefix before that request runs.  The request will compute it again there, so the next
    request of the prefix still belongs on endpoint 1 (it used to be placed as if nobody held it)."""
    s = scorer(approximateWhenUnheld=False)
    eps = seed(s, [0, 8, 0])
    _, first = route(s, eps, 1)
    assert first == [0.0, 1.0, 0.0]
    hashes = BlockHasher("sha256_cbor", 16, "42").hashes(TOKENS)
    s.index.removed(s.index.states[eps[1].metadata.name].slot, hashes)
    _, second = route(s, eps, 1)
    assert second == [0.0, 1.0, 0.0]


@pytest.mark.parametrize("enabled", [True, False])
def test_a_prefix_nobody_holds_goes_back_to_its_last_endpoint(enabled: bool) -> None:
    """No engine holds the first block (reported or pending): the approximate index's runs (where
    the prefix was last routed) score it, and the prediction stays 0; off: nobody scores."""
    s = scorer(approximateWhenUnheld=enabled)
    eps = seed(s, [0, 0, 0])
    state = CycleState()
    state.set_attributes(PREFIX_MATCH, {eps[2]: PrefixMatchInfo(4, 4, 32)})
    s.prepare(state, request(), eps, TOKENS)
    assert s.score(state, request(), eps) == ([0.0, 0.0, 1.0] if enabled else [0.0, 0.0, 0.0])
    s.pre_request(state, request(), SchedulingResult({"default": ProfileRunResult((eps[2],))}, "default"))
    response = ResponseInfo(request_id="r", end_of_stream=True, usage=Usage(cached_tokens=0))
    s.response_complete(state, request(), response, eps[2])
    assert s.debug_state()["predictedVsObserved"]["meanPredictedTokens"] == 0


def test_prediction_expects_evictions_from_the_work_queued_ahead() -> None:
    """Endpoint 0 reports the 8 blocks of TOKENS, the oldest of its 108; a request needing 100 new
    blocks is queued there first.  The engine evicts its oldest free blocks for it, so this request
    is predicted to find nothing (as routed: 7 blocks); once the queued one has its first byte,
    nothing is ahead and the whole run is predicted again."""
    s = scorer()
    eps = seed(s, [8])
    slot = s.index.states[eps[0].metadata.name].slot
    s.index.stored(slot, range(7, 107))  # 100 more blocks, newer than TOKENS'
    big = CycleState()
    s.prepare(big, request(), eps, list(range(90_000, 90_000 + 16 * 100)))
    picked = SchedulingResult({"default": ProfileRunResult((eps[0],))}, "default")
    s.pre_request(big, request(), picked)
    assert s.debug_state()["queuedNewBlocks"] == {eps[0].metadata.name: 100}
    for observed in (0, 112):
        state = CycleState()
        s.prepare(state, request(), eps, TOKENS)
        s.pre_request(state, request(), picked)
        done = ResponseInfo(request_id="r", end_of_stream=True, usage=Usage(cached_tokens=observed))
        s.response_complete(state, request(), done, eps[0])
        s.response_body(big, request(), ResponseInfo(request_id="big"), b"data: {}", eps[0])
    debug = s.debug_state()
    assert debug["queuedNewBlocks"] == {}
    assert debug["predictedVsObserved"]["meanPredictedTokens"] == pytest.approx((0 + 112) / 2)
    assert debug["asRoutedVsObserved"]["meanPredictedTokens"] == pytest.approx(112)
    assert debug["predictedVsObserved"]["meanAbsErrorTokens"] == 0


def test_an_ended_requests_blocks_count_in_the_prediction_until_reported_evicted() -> None:
    """A request routed to endpoint 0 ends before its blocks are reported: in its grace period the
    next request is predicted to find them (their BlockStored may still be on the wire).  Once the
    events report them stored and then removed, they are predicted gone although the grace runs on."""
    s = scorer()
    eps = seed(s, [0])
    slot = s.index.states[eps[0].metadata.name].slot
    hashes = BlockHasher("sha256_cbor", 16, "42").hashes(TOKENS)
    predicted = []
    for evict in (False, True):
        first, _ = route(s, eps, 0)
        s.response_complete(first, request(), ResponseInfo(request_id="a", end_of_stream=True), eps[0])
        if evict:
            s.index.stored(slot, hashes)
            s.index.removed(slot, hashes)
        state, _ = route(s, eps, 0)
        done = ResponseInfo(request_id="b", end_of_stream=True, usage=Usage(cached_tokens=0))
        s.response_complete(state, request(), done, eps[0])
        predicted.append(s.debug_state()["recentPredictions"]["rows"][-1][0])
    assert predicted == [112, 0]


def test_pending_entries_end_with_the_request_and_are_off_when_disabled() -> None:
    s = scorer(speculativeGraceSeconds=0)
    eps = seed(s, [0, 0])
    state, _ = route(s, eps, 0)
    response = ResponseInfo(request_id="r", end_of_stream=True, usage=Usage(cached_tokens=0))
    s.response_complete(state, request(), response, eps[0])
    _, after = route(s, eps, 1)
    assert after == [0.0, 0.0]  # the request ended unreported: no claim left on endpoint 0
    off = scorer(speculativeIndexing=False)
    eps = seed(off, [0, 0])
    route(off, eps, 0)
    assert route(off, eps, 0)[1] == [0.0, 0.0]


def test_a_pending_block_weighs_less_than_a_reported_one() -> None:
    """Endpoint 0 reports 4 blocks; endpoint 1 has all 8 pending: at weight 0.25 it counts
    0 + 0.25 x 8 = 2 blocks, less than endpoint 0's 4."""
    s = scorer(speculativeWeight=0.25, scoreNormalization="fraction")
    eps = seed(s, [4, 0])
    route(s, eps, 1)
    _, scores = route(s, eps, 1)
    assert scores == pytest.approx([4 / 8, 2 / 8])


def test_prediction_with_and_without_pending_blocks() -> None:
    """predictedVsObserved is what the scorer used (pending included); confirmedOnlyVsObserved is
    the reported blocks alone, both against the engine's cached tokens."""
    s = scorer()
    eps = seed(s, [0, 3])
    for picked, observed in [(0, 0), (0, 112), (1, 48), (1, 112)]:
        state, _ = route(s, eps, picked)
        response = ResponseInfo(request_id="r", end_of_stream=True, usage=Usage(cached_tokens=observed))
        s.response_complete(state, request(), response, eps[picked])
    debug = s.debug_state()
    # 0: nothing anywhere; 0 again: 8 pending -> 7 usable; 1: 3 reported; 1 again: 8 (5 pending)
    assert debug["predictedVsObserved"]["meanPredictedTokens"] == pytest.approx((0 + 112 + 48 + 112) / 4)
    assert debug["confirmedOnlyVsObserved"]["meanPredictedTokens"] == pytest.approx((0 + 0 + 48 + 48) / 4)


@pytest.mark.parametrize(
    ("num_blocks", "kv", "expected"),
    [(108, 1.0, 0), (108, 0.5, 112), (0, 1.0, 112)],
    ids=["full-cache", "half-free", "size-unknown"],
)
def test_a_reported_block_behind_a_full_cache_is_predicted_evicted(
    num_blocks: int, kv: float, expected: int
) -> None:
    """Endpoint 0 reports TOKENS' 8 blocks as its newest of 108, and a request needing 10 new blocks
    is queued there.  With the KV cache full, running requests reference every block but these, so
    the free queue holds nothing older: the queued request's allocations evict them (predicted 0)
    though 100 blocks are older.  Half free, 54 cached blocks are evictable before them; with the
    cache size unknown, the 100 older ones bound it as before."""
    s = scorer()
    ep = endpoint(0, num_blocks=num_blocks, kv=kv)
    st = s.index.add_endpoint(ep.metadata.name)
    st.consistent = True
    s.index.stored(st.slot, range(7, 107))  # 100 older blocks
    s.index.stored(st.slot, BlockHasher("sha256_cbor", 16, "42").hashes(TOKENS))
    picked = SchedulingResult({"default": ProfileRunResult((ep,))}, "default")
    ahead = CycleState()
    s.prepare(ahead, request(), [ep], list(range(90_000, 90_000 + 16 * 10)))
    s.pre_request(ahead, request(), picked)
    state = CycleState()
    s.prepare(state, request(), [ep], TOKENS)
    s.pre_request(state, request(), picked)
    done = ResponseInfo(request_id="r", end_of_stream=True, usage=Usage(cached_tokens=expected))
    s.response_complete(state, request(), done, ep)
    assert s.debug_state()["recentPredictions"]["rows"][-1][0] == expected


def test_a_sample_says_how_long_the_latest_holder_past_its_first_byte_has_decoded() -> None:
    """Request a is past its first byte on endpoint 0 when b, same prefix, is routed there: b's row
    counts one computed holder and how long it had decoded then (>= 0 ms); a's own row, with no
    holder in flight at its pick, says -1."""
    s = scorer()
    eps = seed(s, [0])
    a, _ = route(s, eps, 0)
    s.response_body(a, request(), ResponseInfo(request_id="a"), b"data: {}", eps[0])
    b, _ = route(s, eps, 0)
    for state in (a, b):
        done = ResponseInfo(request_id="x", end_of_stream=True, usage=Usage(cached_tokens=112))
        s.response_complete(state, request(), done, eps[0])
    recent = s.debug_state()["recentPredictions"]
    rows = [dict(zip(recent["fields"], row, strict=True)) for row in recent["rows"]]
    assert [r["holdersComputedAtPick"] for r in rows] == [0, 1]
    assert rows[0]["latestHolderDecodingMsAtPick"] == -1.0
    assert rows[1]["latestHolderDecodingMsAtPick"] >= 0.0
