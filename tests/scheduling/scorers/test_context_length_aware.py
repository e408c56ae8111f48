"""context-length-aware: llm-d-router's vectors (context_length_aware_test.go)."""

from __future__ import annotations

from typing import Any

import pytest

from epp.datalayer.api import Endpoint
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, prompt_tokens
from epp.scheduling.scorers.context_length_aware import (
    DEFAULT_LABEL,
    ContextLengthAware,
    parse_range,
    range_score,
)
from epp.testing.builders import make_endpoint, make_request
from epp.testing.plugins import build


def ep(i: int, rng: str | None) -> Endpoint:
    return make_endpoint(i, labels={} if rng is None else {DEFAULT_LABEL: rng})


def _plugin(**params: Any) -> ContextLengthAware:
    plugin: ContextLengthAware = build(ContextLengthAware, **params)
    return plugin


def _request(tokens: int) -> InferenceRequest:
    """A request whose shared prompt estimate is ``tokens`` (4 bytes a token)."""
    req = make_request(prompt="x" * (4 * tokens))
    req.request_size_bytes = 4 * tokens
    assert prompt_tokens(req) == tokens
    return req


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0-100", (0, 100)), (" 5 - 7 ", (5, 7))],
)
def test_parse_range(text: str, expected: tuple[int, int]) -> None:
    assert parse_range(text) == expected


@pytest.mark.parametrize("text", ["", "0-100-200", "100-50", "abc-100"])
def test_parse_range_errors(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each upstream case has its own message
        parse_range(text)


def test_filter_keeps_ranges_holding_the_length_and_unlabelled() -> None:
    eps = [ep(0, "0-100"), ep(1, "100-500"), ep(2, "0-2000"), ep(3, None), ep(4, "bad")]
    kept = _plugin(enableFiltering=True).filter(CycleState(), _request(50), eps)
    assert kept == [eps[0], eps[2], eps[3]]
    assert _plugin().filter(CycleState(), _request(50), eps) == eps  # scoring only by default


def test_score_orders_tight_wide_miss_and_unlabelled() -> None:
    eps = [ep(0, "0-20"), ep(1, "0-10000"), ep(2, "500-1000"), ep(3, None), ep(4, "x-1")]
    tight, wide, miss, none, bad = _plugin().score(CycleState(), _request(1), eps)
    assert tight > wide > 0.3 > miss > 0.0
    assert (none, bad) == (0.5, 0.0)


def test_range_score_fallbacks() -> None:
    assert range_score(9000, 0, 8192) > range_score(9000, 0, 2048)  # exceeds: larger max wins
    assert range_score(50, 100, 1024) > range_score(50, 500, 2048)  # below: smaller min wins
    assert range_score(14999, 0, 15000) > 0.3 > range_score(14999, 15001, 20000)
    assert range_score(7, 7, 7) == 1.0
    # in range: 0.3 + 0.7 * (0.7 / (1 + 100/10000) + 0.3 * 50/100)
    assert range_score(50, 0, 100) == pytest.approx(0.3 + 0.7 * (0.7 / 1.01 + 0.15))


def test_empty_label_is_refused() -> None:
    with pytest.raises(ValueError, match="'label' must be specified"):
        _plugin(label="")
