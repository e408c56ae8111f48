"""utilization-filter: llm-d-router's vectors (scheduling/filter/utilization/filter_test.go)."""

from __future__ import annotations

from typing import Any

import pytest

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import INFLIGHT_LOAD, InFlightLoad
from epp.plugin.state import CycleState
from epp.scheduling.filters.utilization import UtilizationFilter
from epp.testing.builders import make_endpoint, make_request
from epp.testing.plugins import build


def cap(metric: str, value: float) -> dict[str, Any]:
    return {"metric": metric, "maxValue": value}


def _run(
    conditions: list[dict[str, Any]], eps: list[Endpoint], loads: dict[int, int] | None = None, **kw: Any
) -> list[int]:
    state = CycleState()
    for i, n in (loads or {}).items():
        state.put_attribute(INFLIGHT_LOAD, eps[i], InFlightLoad(requests=n, tokens=0))
    f = build(UtilizationFilter, conditions=conditions, **kw)
    return [eps.index(ep) for ep in f.filter(state, make_request(), eps)]


def test_active_requests_caps_and_missing_load_is_zero() -> None:
    eps = [make_endpoint(i) for i in range(3)]
    assert _run([cap("active-requests", 2)], eps, {0: 1, 1: 2, 2: 3}) == [0, 1]
    assert _run([cap("active-requests", 0)], eps[:2], {1: 1}) == [0]


@pytest.mark.parametrize(
    ("condition", "a", "b"),
    [
        (cap("running-requests", 4), {"running": 4}, {"running": 5}),
        (cap("waiting-queue", 0), {"queue": 0}, {"queue": 1}),
        (cap("kv-cache-utilization", 0.8), {"kv": 0.8}, {"kv": 0.81}),
    ],
)
def test_model_server_readings_keep_at_or_below_cap(condition: dict[str, Any], a: Any, b: Any) -> None:
    assert _run([condition], [make_endpoint(0, **a), make_endpoint(1, **b)]) == [0]


def test_any_exceeded_cap_drops_and_fallback_keeps_everyone() -> None:
    eps = [make_endpoint(0, running=10, queue=0), make_endpoint(1, running=50), make_endpoint(2, queue=2)]
    conds = [cap("running-requests", 40), cap("waiting-queue", 0)]
    assert _run(conds, eps) == [0]
    full = [make_endpoint(0, kv=0.9), make_endpoint(1, kv=0.95)]
    assert _run([cap("kv-cache-utilization", 0.5)], full) == []
    assert _run([cap("kv-cache-utilization", 0.5)], full, fallbackOnEmpty=True) == [0, 1]


def test_only_active_requests_consumes_the_in_flight_load() -> None:
    assert {INFLIGHT_LOAD} == build(UtilizationFilter, conditions=[cap("active-requests", 1)]).CONSUMES
    for metric in ("running-requests", "waiting-queue", "kv-cache-utilization"):
        assert frozenset() == build(UtilizationFilter, conditions=[cap(metric, 1)]).CONSUMES


@pytest.mark.parametrize(
    "conditions",
    [
        [],
        [{"maxValue": 1}],
        [cap("unknown", 1)],
        [{"metric": "active-requests"}],
        [cap("active-requests", -1)],
        [cap("kv-cache-utilization", 80)],
    ],
)
def test_invalid_conditions_are_refused(conditions: list[dict[str, Any]]) -> None:
    with pytest.raises(ValueError, match="conditions"):
        build(UtilizationFilter, conditions=conditions)
