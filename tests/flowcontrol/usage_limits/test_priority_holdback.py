"""priority-holdback-policy: llm-d-router's vectors (priorityholdback/priority_holdback_test.go)."""

from __future__ import annotations

from typing import Any

import pytest

from epp.flowcontrol.usage_limits.priority_holdback import PriorityHoldbackPolicy
from epp.testing.plugins import build


def _limits(priorities: list[int], **params: Any) -> list[float]:
    return list(build(PriorityHoldbackPolicy, **params).compute_limits(0.5, priorities))


@pytest.mark.parametrize(
    ("priorities", "want"),
    [
        ([100, 10], [1.0, 0.5]),
        ([100, 50, 10], [1.0, 0.75, 0.5]),
        ([100, 75, 50, 10], [1.0, 0.8333333, 0.6666666, 0.5]),
    ],
)
def test_rank_domain_spreads_evenly(priorities: list[int], want: list[float]) -> None:
    assert _limits(priorities, minCeiling=0.5) == pytest.approx(want, abs=1e-6)


def test_value_domain_is_proportional_to_priority() -> None:
    got = _limits([100, 75, 10], minCeiling=0.3, maxCeiling=0.9, domain="value")
    assert got == pytest.approx([0.9, 0.3 + 65 / 90 * 0.6, 0.3])
    assert _limits([5, 5], minCeiling=0.3, maxCeiling=0.9, domain="value") == [0.9, 0.9]


@pytest.mark.parametrize("domain", ["rank", "value"])
def test_single_and_no_priority(domain: str) -> None:
    assert _limits([10], minCeiling=0.5, maxCeiling=0.9, domain=domain) == [0.9]
    assert _limits([], minCeiling=0.5, domain=domain) == []


def test_saturation_does_not_move_the_ceilings() -> None:
    policy = build(PriorityHoldbackPolicy, minCeiling=0.5)
    assert list(policy.compute_limits(0.1, [2, 1])) == list(policy.compute_limits(0.99, [2, 1]))


@pytest.mark.parametrize(
    "params",
    [
        {"domain": "rank"},  # minCeiling is required
        {"shape": "sigmoid", "minCeiling": 0.5},
        {"domain": "unknown", "minCeiling": 0.5},
        {"minCeiling": -0.1},
        {"minCeiling": 1.0},
        {"minCeiling": 0.5, "maxCeiling": 0.0},
        {"minCeiling": 0.5, "maxCeiling": 1.1},
        {"minCeiling": 0.5, "maxCeiling": 0.5},
        {"minCeiling": 0.8, "maxCeiling": 0.5},
    ],
)
def test_invalid_configs_are_refused(params: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each case fails on its own field
        build(PriorityHoldbackPolicy, **params)
