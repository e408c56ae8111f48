"""prefill-load-scorer: backlog plus uncached prefill, released at the first response byte."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as hs

from epp.datalayer.attributes import PRECISE_PREFIX_MATCH, PREFIX_MATCH, PrefixMatchInfo
from epp.plugin.state import CycleState
from epp.request import ResponseInfo
from epp.scheduling.api import ProfileRunResult, SchedulingResult
from epp.scheduling.normalize import min_max_scores
from epp.scheduling.scorers.prefill_load import PrefillLoadScorer
from epp.testing.builders import make_endpoint, make_request
from epp.testing.plugins import build

EPS = [make_endpoint(i) for i in range(3)]


def request(prompt_tokens: int):  # type: ignore[no-untyped-def]
    req = make_request()
    req.request_size_bytes = prompt_tokens * 4
    return req


def state_with(matches: dict[int, int], total: int = 100, block: int = 16) -> CycleState:
    st = CycleState()
    for i, m in matches.items():
        st.put_attribute(PREFIX_MATCH, EPS[i], PrefixMatchInfo(m, total, block))
    return st


def routed(scorer: PrefillLoadScorer, st: CycleState, prompt: int, target: int) -> CycleState:
    result = SchedulingResult({"default": ProfileRunResult((EPS[target],))}, "default")
    scorer.pre_request(st, request(prompt), result)
    return st


@pytest.mark.parametrize(
    ("matches", "expected"),
    [
        pytest.param({}, [1.0, 1.0, 1.0], id="nothing-cached-all-equal"),
        pytest.param({1: 50}, [0.0, 1.0, 0.0], id="cache-holder-wins"),  # 1000-800 vs 1000 uncached
        pytest.param({0: 25, 1: 50}, [0.5, 1.0, 0.0], id="linear-in-cached-tokens"),
    ],
)
def test_prefix_affinity_without_backlog(matches: dict[int, int], expected: list[float]) -> None:
    """With no backlog, the endpoint holding more of the prompt has less prefill to do."""
    s: PrefillLoadScorer = build(PrefillLoadScorer)
    assert s.score(state_with(matches), request(1000), EPS) == pytest.approx(expected)


def test_backlog_outweighs_a_small_cache_hit_and_is_released_at_first_byte() -> None:
    """A busy cache holder loses to an idle replica once its backlog exceeds what the cache saves."""
    s: PrefillLoadScorer = build(PrefillLoadScorer)
    busy = [routed(s, CycleState(), 3000, 1) for _ in range(2)]  # 6000 tokens queued on endpoint 1
    assert s.backlog(EPS[1]) == 6000
    scores = s.score(state_with({1: 50}), request(1000), EPS)  # endpoint 1 would save 800 tokens
    assert scores[1] == 0.0 and scores[0] == 1.0
    resp = ResponseInfo(request_id="r")
    s.response_body(busy[0], request(3000), resp, b"data: first token", EPS[1])
    s.response_body(busy[0], request(3000), resp, b"data: second token", EPS[1])  # released once
    assert s.backlog(EPS[1]) == 3000
    s.response_complete(busy[1], request(3000), resp, EPS[1])
    assert s.backlog(EPS[1]) == 0


def test_only_uncached_tokens_join_the_backlog_and_removed_endpoints_are_forgotten() -> None:
    """The target is charged its uncached prefill only; removing it drops its backlog."""
    s: PrefillLoadScorer = build(PrefillLoadScorer)
    routed(s, state_with({2: 40}), 1000, 2)  # 640 of 1000 tokens cached
    assert s.backlog(EPS[2]) == 360
    s.endpoint_removed(EPS[2])
    assert s.backlog(EPS[2]) == 0


def test_pre_tokenized_prompt_counts_its_token_ids_when_the_body_size_is_unknown() -> None:
    """A gRPC/pre-tokenized request has no JSON body size yet: its prefill is its token count."""
    s: PrefillLoadScorer = build(PrefillLoadScorer)
    req = make_request()
    assert req.body is not None
    req.body.token_ids = list(range(1200))
    result = SchedulingResult({"default": ProfileRunResult((EPS[2],))}, "default")
    s.pre_request(CycleState(), req, result)
    assert s.backlog(EPS[2]) == 1200


def test_the_engines_reported_blocks_override_the_approximate_guess() -> None:
    """With a precise scorer configured, its per-endpoint match is what is cached: the approximate
    index's stale belief (endpoint 1 holds 50 blocks; the engine evicted them) is not counted,
    neither in the score nor in the backlog the pick adds."""
    s: PrefillLoadScorer = build(PrefillLoadScorer)
    st = state_with({1: 50})
    assert s.score(st, request(1000), EPS) == pytest.approx([0.0, 1.0, 0.0])  # approximate only
    zero = PrefixMatchInfo(0, 62, 16)
    for i, m in enumerate((0, 0, 40)):
        st.put_attribute(PRECISE_PREFIX_MATCH, EPS[i], PrefixMatchInfo(m, 62, 16) if m else zero)
    assert s.score(st, request(1000), EPS) == pytest.approx([0.0, 0.0, 1.0])
    routed(s, st, 1000, 1)
    assert s.backlog(EPS[1]) == 1000  # all of it: the engine holds none of this prompt
    routed(s, st, 1000, 2)
    assert s.backlog(EPS[2]) == 1000 - 40 * 16


@given(
    hs.lists(
        hs.tuples(hs.integers(0, 3000), hs.one_of(hs.none(), hs.integers(0, 120))), min_size=1, max_size=40
    ),
    hs.integers(1, 2000),
)
def test_scores_are_min_max_scores_of_backlog_plus_uncached_prompt(
    rows: list[tuple[int, int | None]], prompt: int
) -> None:
    """The one-pass score is the shared formula, float for float, whatever the fleet."""
    eps = [make_endpoint(i) for i in range(len(rows))]
    s = build(PrefillLoadScorer)
    cs = CycleState()
    estimates = []
    for ep, (backlog, blocks) in zip(eps, rows, strict=True):
        s._backlog[ep.name] = backlog
        cached = 0
        if blocks is not None:
            cs.put_attribute(PREFIX_MATCH, ep, PrefixMatchInfo(blocks, 120, 16))
            cached = blocks * 16
        estimates.append(backlog + max(prompt - cached, 0))
    assert s.score(cs, request(prompt), eps) == min_max_scores(estimates)
