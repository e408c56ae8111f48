"""probabilistic-admitter: llm-d-router's vectors (probabilisticadmitter/plugin_test.go)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from epp.datalayer.api import Endpoint
from epp.director.admitters.probabilistic import ProbabilisticAdmitter
from epp.plugin.state import CycleState
from epp.testing.builders import make_endpoint, make_request
from epp.testing.plugins import build


def _admit(eps: list[Endpoint], rand: float, priority: int = -1, **params: Any) -> str | None:
    admitter = build(ProbabilisticAdmitter, **params)
    admitter.rand = lambda: rand
    result: str | None = admitter.admit_request(CycleState(), make_request(priority=priority), eps)
    return result


@pytest.mark.parametrize(
    ("queues_kvs", "rand", "refused"),
    [
        pytest.param([(100, 0.0)], 0.0, True, id="high-saturation"),
        pytest.param([(0, 0.0)], 0.0, False, id="zero-saturation"),
        pytest.param([(10, 0.0), (0, 0.0)], 0.0, True, id="mean-of-two-is-1"),
        pytest.param([(0, 0.272)], 0.999, True, id="quintic-0.34-is-certain"),
        pytest.param([(0, 0.16)], 0.9, False, id="0.096-admits-at-0.9"),
        pytest.param([(0, 0.16)], 0.0, True, id="0.096-refuses-at-0"),
        pytest.param([(5, 0.8)], 0.0, True, id="saturation-1"),
    ],
)
def test_upstream_vectors(queues_kvs: list[tuple[int, float]], rand: float, refused: bool) -> None:
    eps = [make_endpoint(i, queue=q, kv=kv) for i, (q, kv) in enumerate(queues_kvs)]
    reason = _admit(eps, rand)
    assert (reason is not None) is refused
    if reason is not None:
        assert reason.startswith("probabilistic-admitter: rejected, saturation=")


def test_probability_formula() -> None:
    admitter = build(ProbabilisticAdmitter)
    sat = admitter.saturation([make_endpoint(0, kv=0.16)])
    assert sat == pytest.approx(0.2)
    assert min(sat**5 * 300, 1.0) == pytest.approx(0.096)
    assert math.isclose(admitter.saturation([make_endpoint(0, queue=10), make_endpoint(1)]), 1.0)


def test_never_scraped_counts_as_saturated() -> None:
    admitter = build(ProbabilisticAdmitter)
    stale = make_endpoint(0)
    stale.metrics = type(stale.metrics)()  # update_time 0: no reading yet
    assert admitter.saturation([stale]) == 1.0


def test_critical_requests_and_no_candidates_are_admitted() -> None:
    assert _admit([make_endpoint(0, queue=100)], 0.0, priority=0) is None
    assert _admit([], 0.0) is None


@pytest.mark.parametrize("field", ["queueDepthThreshold", "kvCacheUtilThreshold", "power", "k"])
def test_non_positive_parameters_are_refused(field: str) -> None:
    params: dict[str, Any] = {field: 0}
    with pytest.raises(ValueError, match=field):
        build(ProbabilisticAdmitter, **params)
