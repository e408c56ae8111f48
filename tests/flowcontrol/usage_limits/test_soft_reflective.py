"""soft-reflective-ceiling-policy: llm-d-router's vectors (softreflectiveceiling/policy_test.go)."""

from __future__ import annotations

import pytest

from epp.flowcontrol.api import UsageLimitPolicy
from epp.flowcontrol.usage_limits.soft_reflective import SoftReflectiveCeilingPolicy
from epp.testing.plugins import build


def _policy() -> SoftReflectiveCeilingPolicy:
    policy: SoftReflectiveCeilingPolicy = build(SoftReflectiveCeilingPolicy)
    assert isinstance(policy, UsageLimitPolicy)
    return policy


@pytest.mark.parametrize("sat", [0.0, 0.5, 0.99, 1.0, 1.5])
def test_single_band_and_top_band_always_open(sat: float) -> None:
    assert list(_policy().compute_limits(sat, [7])) == [1.0]
    assert _policy().compute_limits(sat, [100, 0, -50])[0] == 1.0


def test_below_every_reflective_ceiling_all_open() -> None:
    assert list(_policy().compute_limits(0.3, [100, 0, -50])) == [1.0, 1.0, 1.0]


def test_saturated_blocks_all_but_the_top_band() -> None:
    assert list(_policy().compute_limits(1.0, [3, 2, 1, 0])) == [1.0, 0.0, 0.0, 0.0]


def test_discriminating_saturation_n4() -> None:
    got = _policy().compute_limits(0.7, [3, 2, 1, 0])
    assert got[:2] == [1.0, 1.0]  # band 1's reflective ceiling is 0.7667
    assert all(c in (0.0, 1.0) for c in got[2:])


@pytest.mark.parametrize(
    ("sat", "want"),
    [(0.7, [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]), (0.75, [0.0, 0.0, 1.0, 0.0, 0.0, 1.0])],
)
def test_alternation_period(sat: float, want: list[float]) -> None:
    policy = _policy()
    assert [policy.compute_limits(sat, [1, 0])[1] for _ in want] == want


def test_gated_bands_open_together_and_are_not_starved() -> None:
    policy = _policy()
    for _ in range(5):
        policy.compute_limits(0.6, [100, 0, -50])
    opened = 0
    for _ in range(100):
        got = policy.compute_limits(0.7, [100, 0, -50])
        assert got[1] == got[2] or got[2] == 0.0  # band 2 never open while band 1 is shut
        opened += got[2] == 1.0
    assert opened > 0


def test_takes_no_parameters() -> None:
    with pytest.raises(ValueError, match="threshold"):
        build(SoftReflectiveCeilingPolicy, threshold=0.5)
