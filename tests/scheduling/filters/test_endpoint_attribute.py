"""endpoint-attribute-filter: llm-d-router's vectors (filter_test.go) and the DCGM attribute key."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from epp.datalayer.api import Endpoint
from epp.plugin.state import CycleState
from epp.scheduling.filters.endpoint_attribute import EndpointAttributeFilter, EndpointAttributeFilterParams
from epp.testing.builders import make_endpoint, make_request
from epp.testing.plugins import FakeHandle, build
from tests.scheduling.attribute_producer import AttributeProducer

KEY = "num_requests_running"


def _threshold(operator: str, value: float) -> dict[str, Any]:
    return {"type": "threshold", "threshold": {"operator": operator, "value": value}}


@pytest.mark.parametrize(
    "params",
    [
        pytest.param({"attribute": KEY, "algorithm": _threshold("LessThan", 10)}, id="defaulted-onMissing"),
        pytest.param(
            {
                "attribute": KEY,
                "onMissing": "Fail",
                "fallbackOnEmpty": True,
                "algorithm": _threshold("GreaterThanOrEqual", 0.5),
            },
            id="explicit-policies",
        ),
    ],
)
def test_valid_parameters(params: dict[str, Any]) -> None:
    f = build(EndpointAttributeFilter, "test-filter", **params)
    assert (f.typed_name.type, f.typed_name.name) == ("endpoint-attribute-filter", "test-filter")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param(
            {"algorithm": _threshold("LessThan", 10)}, "attribute\n  Field required", id="no-attribute"
        ),
        pytest.param(
            {"attribute": "", "algorithm": _threshold("LessThan", 10)}, "non-empty attribute", id="empty"
        ),
        pytest.param(
            {"attribute": KEY, "onMissing": "Maybe", "algorithm": _threshold("LessThan", 10)},
            "onMissing",
            id="onMissing",
        ),
        pytest.param({"attribute": KEY}, "algorithm\n  Field required", id="no-algorithm"),
        pytest.param(
            {"attribute": KEY, "algorithm": {"type": "percentile"}}, "algorithm.type", id="percentile"
        ),
        pytest.param(
            {"attribute": KEY, "algorithm": {"type": "threshold"}}, "algorithm.threshold", id="no-threshold"
        ),
        pytest.param(
            {"attribute": KEY, "algorithm": _threshold("Around", 10)},
            "algorithm.threshold.operator",
            id="operator",
        ),
    ],
)
def test_invalid_parameters_name_the_field(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        EndpointAttributeFilterParams.model_validate(params)


def _run(values: list[float | None], operator: str, value: float, **params: Any) -> list[int]:
    eps = [make_endpoint(i) for i in range(len(values))]
    producer = AttributeProducer(KEY, {ep: v for ep, v in zip(eps, values, strict=True) if v is not None})
    f = build(
        EndpointAttributeFilter,
        handle=FakeHandle([producer]),
        attribute=KEY,
        algorithm=_threshold(operator, value),
        **params,
    )
    kept = f.filter(CycleState(), make_request(), eps)
    return [eps.index(ep) for ep in kept]


@pytest.mark.parametrize(
    ("values", "operator", "params", "kept"),
    [
        pytest.param([5, 10, 15], "LessThan", {}, [0], id="LessThan"),
        pytest.param([5, 10, 15], "LessThanOrEqual", {}, [0, 1], id="LessThanOrEqual"),
        pytest.param([5, 10, 15], "GreaterThan", {}, [2], id="GreaterThan"),
        pytest.param([5, 10, 15], "GreaterThanOrEqual", {}, [1, 2], id="GreaterThanOrEqual"),
        pytest.param([5, 10], "Equal", {}, [1], id="Equal"),
        pytest.param([5, 10], "NotEqual", {}, [0], id="NotEqual"),
        pytest.param([15, None], "LessThan", {"onMissing": "Pass"}, [1], id="missing-passes"),
        pytest.param([5, None], "LessThan", {"onMissing": "Fail"}, [0], id="missing-fails"),
        pytest.param([15, 20], "LessThan", {}, [], id="empty-without-fallback"),
        pytest.param([15, 20], "LessThan", {"fallbackOnEmpty": True}, [0, 1], id="fallback-on-empty"),
        pytest.param([5, 20], "LessThan", {"fallbackOnEmpty": True}, [0], id="fallback-not-needed"),
    ],
)
def test_threshold_vectors(
    values: list[float | None], operator: str, params: dict[str, Any], kept: list[int]
) -> None:
    """Upstream's table, threshold 10."""
    assert _run(values, operator, 10, **params) == kept


def test_key_spellings_and_no_producer() -> None:
    """v0.10's ``Attribute/Producer`` and the later split spelling name one key; no producer: all missing."""
    eps: list[Endpoint] = [make_endpoint(0), make_endpoint(1)]
    producer = AttributeProducer("GPUUtilization/dcgm-extractor", {eps[0]: 0.95, eps[1]: 0.2})
    algorithm = _threshold("LessThanOrEqual", 0.9)
    for spelling in (
        {"attribute": "GPUUtilization/dcgm-extractor"},
        {"attribute": "GPUUtilization", "producer": "dcgm-extractor"},
    ):
        f = build(EndpointAttributeFilter, handle=FakeHandle([producer]), algorithm=algorithm, **spelling)
        assert list(f.filter(CycleState(), make_request(), eps)) == [eps[1]]
    orphan = build(EndpointAttributeFilter, attribute="GPUUtilization", onMissing="Fail", algorithm=algorithm)
    assert list(orphan.filter(CycleState(), make_request(), eps)) == []
