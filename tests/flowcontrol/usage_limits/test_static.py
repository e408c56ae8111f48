"""static-usage-limit-policy: one ceiling for every priority, validated at build."""

from __future__ import annotations

from typing import Any

import pytest

from epp.app.registry import default_registry
from epp.errors import ConfigError
from epp.flowcontrol.api import UsageLimitPolicy
from epp.testing.plugins import FakeHandle


def _build(**params: Any) -> Any:
    return default_registry(entry_points=False).build(
        name="limits", type_name="static-usage-limit-policy", parameters=params, handle=FakeHandle(), path="p"
    )


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        pytest.param({}, [1.0, 1.0, 1.0], id="default-1"),
        pytest.param({"threshold": 0.8}, [0.8, 0.8, 0.8], id="headroom"),
    ],
)
def test_limits(params: dict[str, Any], expected: list[float]) -> None:
    """Every priority gets the threshold, whatever the saturation."""
    policy = _build(**params)
    assert isinstance(policy, UsageLimitPolicy)
    assert list(policy.compute_limits(0.5, [10, 0, -1])) == expected
    assert list(policy.compute_limits(0.5, [3])) == expected[:1]


@pytest.mark.parametrize("threshold", [0.0, -1.0])
def test_non_positive_threshold_is_rejected(threshold: float) -> None:
    """A ceiling <= 0 would block every band forever: a startup error."""
    with pytest.raises(ConfigError, match="threshold must be strictly positive"):
        _build(threshold=threshold)
