"""endpoint-attribute-scorer: llm-d-router's vectors (endpointattribute_test.go)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from epp.plugin.state import CycleState
from epp.scheduling.scorers.endpoint_attribute import EndpointAttributeScorer, EndpointAttributeScorerParams
from epp.testing.builders import make_endpoint, make_request
from epp.testing.plugins import FakeHandle, build
from tests.scheduling.attribute_producer import AttributeProducer

KEY = "custom.queue_depth"
LOWER = "linear_lower_is_better"
HIGHER = "linear_higher_is_better"


@pytest.mark.parametrize(
    "algorithm",
    [
        pytest.param({"type": LOWER}, id="defaulted-adaptive"),
        pytest.param({"type": HIGHER, "normalization": {"adaptiveRange": {}}}, id="explicit-adaptive"),
        pytest.param({"type": LOWER, "normalization": {"fixedRange": {"min": 0, "max": 1}}}, id="fixed"),
    ],
)
def test_valid_parameters(algorithm: dict[str, Any]) -> None:
    s = build(EndpointAttributeScorer, "test-scorer", attributeKey=KEY, algorithm=algorithm)
    assert (s.typed_name.type, s.typed_name.name) == ("endpoint-attribute-scorer", "test-scorer")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({"algorithm": {"type": LOWER}}, "attributeKey\n  Field required", id="no-key"),
        pytest.param({"attributeKey": KEY}, "algorithm\n  Field required", id="no-algorithm"),
        pytest.param(
            {"attributeKey": KEY, "algorithm": {"type": "log_lower_is_better"}}, "algorithm.type", id="log"
        ),
        pytest.param(
            {
                "attributeKey": KEY,
                "algorithm": {
                    "type": LOWER,
                    "normalization": {"fixedRange": {"min": 0, "max": 1}, "adaptiveRange": {}},
                },
            },
            "at most one normalization strategy",
            id="both",
        ),
        pytest.param(
            {
                "attributeKey": KEY,
                "algorithm": {"type": LOWER, "normalization": {"fixedRange": {"min": 1, "max": 1}}},
            },
            "min < max",
            id="empty-range",
        ),
    ],
)
def test_invalid_parameters_name_the_field(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        EndpointAttributeScorerParams.model_validate(params)


def _scores(values: list[float | None], kind: str, fixed: tuple[float, float] | None = None) -> list[float]:
    eps = [make_endpoint(i) for i in range(len(values))]
    producer = AttributeProducer(KEY, {ep: v for ep, v in zip(eps, values, strict=True) if v is not None})
    algorithm: dict[str, Any] = {"type": kind}
    if fixed is not None:
        algorithm["normalization"] = {"fixedRange": {"min": fixed[0], "max": fixed[1]}}
    s = build(EndpointAttributeScorer, handle=FakeHandle([producer]), attributeKey=KEY, algorithm=algorithm)
    return list(s.score(CycleState(), make_request(), eps))


@pytest.mark.parametrize(
    ("values", "kind", "want"),
    [
        pytest.param([10, 5, 0], LOWER, [0.0, 0.5, 1.0], id="lower"),
        pytest.param([10, 5, 0], HIGHER, [1.0, 0.5, 0.0], id="higher"),
        pytest.param([7, 7], LOWER, [1.0, 1.0], id="equal-neutral"),
        pytest.param([10, None, 0], LOWER, [0.0, 0.0, 1.0], id="missing-zero"),
        pytest.param([None, None], LOWER, [0.0, 0.0], id="all-missing"),
    ],
)
def test_adaptive_range(values: list[float | None], kind: str, want: list[float]) -> None:
    assert _scores(values, kind) == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize(
    ("values", "kind", "want"),
    [
        pytest.param([10, 5, 0], LOWER, [0.0, 0.5, 1.0], id="lower"),
        pytest.param([10, 5, 0], HIGHER, [1.0, 0.5, 0.0], id="higher"),
        pytest.param([7, 7], LOWER, [0.3, 0.3], id="equal-by-position"),
        pytest.param([15, -5], LOWER, [0.0, 1.0], id="clamped"),
        pytest.param([10, None], HIGHER, [1.0, 0.0], id="missing-zero"),
    ],
)
def test_fixed_range(values: list[float | None], kind: str, want: list[float]) -> None:
    """Range [0, 10]."""
    assert _scores(values, kind, (0, 10)) == pytest.approx(want, abs=1e-4)
