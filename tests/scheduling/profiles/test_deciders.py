"""P/D deciders: llm-d-router's prefix-based threshold, always, and the multimodal one."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import PRECISE_PREFIX_MATCH, PREFIX_MATCH, PrefixMatchInfo
from epp.plugin.state import CycleState
from epp.request import ApiKind, InferenceRequest, prompt_tokens
from epp.scheduling.profiles.deciders import (
    AlwaysDisaggMultimodalDecider,
    AlwaysDisaggPDDecider,
    Decider,
    PrefixBasedPDDecider,
)
from epp.testing.builders import chat_body, make_endpoint, make_request
from epp.testing.plugins import build


def _state(match_blocks: int, block_size: int = 16) -> tuple[CycleState, Endpoint]:
    ep = make_endpoint(0)
    state = CycleState()
    state.put_attribute(PREFIX_MATCH, ep, PrefixMatchInfo(match_blocks, 100, block_size))
    return state, ep


def _request(tokens: int) -> InferenceRequest:
    req = make_request("m")
    req.request_size_bytes = tokens * 4
    return req


@pytest.mark.parametrize(
    ("threshold", "prompt", "cached_blocks", "expected"),
    [
        (0, 10_000, 0, False),  # 0 = never
        (16, 15, 0, False),  # shorter than the threshold
        (16, 16, 0, True),  # 16 uncached >= 16
        (16, 100, 5, True),  # 100 - 80 = 20 >= 16
        (16, 100, 6, False),  # 100 - 96 = 4 < 16
        (512, 1024, 32, True),  # 1024 - 512 = 512 >= 512
        (512, 1024, 33, False),
    ],
)
def test_prefix_decider_uses_the_decode_picks_cached_prefix(
    threshold: int, prompt: int, cached_blocks: int, expected: bool
) -> None:
    decider = build(PrefixBasedPDDecider, nonCachedTokens=threshold)
    assert isinstance(decider, Decider)
    state, ep = _state(cached_blocks)
    assert decider.disaggregate(state, _request(prompt), ep) is expected


def test_prompt_tokens_gate() -> None:
    decider = build(PrefixBasedPDDecider, nonCachedTokens=8, promptTokens=1000)
    state, ep = _state(0)
    assert decider.disaggregate(state, _request(999), ep) is False
    assert decider.disaggregate(state, _request(1000), ep) is True


def test_no_prefix_information_means_local() -> None:
    decider = build(PrefixBasedPDDecider, nonCachedTokens=8)
    assert decider.disaggregate(CycleState(), _request(10_000), make_endpoint(0)) is False
    assert decider.disaggregate(CycleState(), _request(10_000), None) is False


@pytest.mark.parametrize("field", ["nonCachedTokens", "promptTokens"])
def test_negative_parameters_are_rejected(field: str) -> None:
    with pytest.raises(ValidationError, match="cannot be negative"):
        build(PrefixBasedPDDecider, **{field: -1})  # type: ignore[arg-type]


def test_consumes_prefix_match_so_the_producer_is_added() -> None:
    assert PREFIX_MATCH in PrefixBasedPDDecider.CONSUMES


def test_the_engines_reported_prefix_overrides_the_approximate_guess() -> None:
    """Where a precise-prefix-cache-scorer wrote what the engine holds, a prefix the approximate
    index still remembers but the engine evicted is uncached: it must be prefilled again."""
    decider = build(PrefixBasedPDDecider, nonCachedTokens=16)
    assert PRECISE_PREFIX_MATCH in decider.READS
    state, ep = _state(6)  # approximate: 96 of 100 cached -> local
    assert decider.disaggregate(state, _request(100), ep) is False
    state.put_attribute(PRECISE_PREFIX_MATCH, ep, PrefixMatchInfo(1, 100, 16))  # engine: 16 cached
    assert decider.disaggregate(state, _request(100), ep) is True


def test_prompt_tokens_estimate() -> None:
    req = make_request("m", prompt="x" * 40)
    assert prompt_tokens(req) == 10  # no body size yet: prompt text / 4
    req.request_size_bytes = 400
    assert prompt_tokens(req) == 100


def test_always_disaggregates() -> None:
    assert build(AlwaysDisaggPDDecider).disaggregate(CycleState(), make_request(), None) is True


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("just text", False),
        ([{"type": "text", "text": "hi"}], False),
        ([{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}], True),
        ([{"type": "input_audio", "input_audio": {"data": "x"}}], True),
        ([{"type": "video_url", "video_url": {"url": "x"}}], True),
    ],
)
def test_multimodal_decider(content: object, expected: bool) -> None:
    req = make_request("m", api=ApiKind.CHAT_COMPLETIONS)
    req.body = chat_body([{"role": "user", "content": content}])
    assert build(AlwaysDisaggMultimodalDecider).disaggregate(CycleState(), req, None) is expected
