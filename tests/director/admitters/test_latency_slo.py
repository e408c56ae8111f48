"""latency-slo-admitter: shed sheddable requests no endpoint can serve within their SLO (§4.7)."""

from __future__ import annotations

import pytest

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import LATENCY_PREDICTION, LatencyPredictionInfo
from epp.director.admitters.latency_slo import LatencySloAdmitter
from epp.director.api import Admitter
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.testing.plugins import build
from tests.scheduling.builders import endpoint, request


def busy(i: int) -> Endpoint:
    return endpoint(i, running=3, kv=0.5)


def state_with(eps: list[Endpoint], infos: list[LatencyPredictionInfo]) -> CycleState:
    s = CycleState()
    s.set_attributes(LATENCY_PREDICTION, dict(zip(eps, infos, strict=True)))
    return s


def pred(ttft_h: float, tpot_h: float = 1.0, valid: bool = True) -> LatencyPredictionInfo:
    return LatencyPredictionInfo(valid, valid, ttft_h, tpot_h, 100 - ttft_h, 10 - tpot_h, 1)


def req(priority: int, **headers: str) -> InferenceRequest:
    r = request(headers={k.replace("_", "-"): v for k, v in headers.items()})
    r.priority = priority
    return r


def test_is_an_admitter() -> None:
    assert isinstance(build(LatencySloAdmitter), Admitter)


def test_denies_sheddable_when_nobody_meets_the_slo() -> None:
    a = build(LatencySloAdmitter)
    eps = [busy(0), busy(1)]
    reason = a.admit_request(state_with(eps, [pred(-5), pred(-1)]), req(-1, x_slo_ttft_ms="10"), eps)
    assert reason is not None and "SLO" in reason and "ttft slo 10 ms" in reason


@pytest.mark.parametrize(
    ("priority", "headers", "infos", "eps"),
    [
        pytest.param(0, {"x_slo_ttft_ms": "10"}, [pred(-5)], [busy(0)], id="not-sheddable"),
        pytest.param(-1, {}, [pred(-5)], [busy(0)], id="no-slo-header"),
        pytest.param(-1, {"x_slo_ttft_ms": "0"}, [pred(-5)], [busy(0)], id="zero-slo"),
        pytest.param(-1, {"x_slo_ttft_ms": "10"}, [pred(-5), pred(2)], [busy(0), busy(1)], id="one-meets-it"),
        pytest.param(-1, {"x_slo_ttft_ms": "10"}, [pred(-5)], [endpoint(0, running=0, kv=0.5)], id="idle"),
        pytest.param(-1, {"x_slo_ttft_ms": "10"}, [pred(-5)], [endpoint(0, running=4, kv=0.01)], id="cold"),
        # a TTFT-only SLO ignores TPOT headroom
        pytest.param(-1, {"x_slo_ttft_ms": "10"}, [pred(1, -3)], [busy(0)], id="tpot-not-asked"),
    ],
)
def test_admits(
    priority: int, headers: dict[str, str], infos: list[LatencyPredictionInfo], eps: list[Endpoint]
) -> None:
    a = build(LatencySloAdmitter)
    assert a.admit_request(state_with(eps, infos), req(priority, **headers), eps) is None


def test_no_predictions_admits() -> None:
    a = build(LatencySloAdmitter)
    eps = [busy(0)]
    assert a.admit_request(CycleState(), req(-1, x_slo_ttft_ms="1"), eps) is None


def test_tpot_slo() -> None:
    a = build(LatencySloAdmitter)
    eps = [busy(0)]
    assert a.admit_request(state_with(eps, [pred(5, -1)]), req(-2, x_slo_tpot_ms="9"), eps) is not None
    assert a.admit_request(state_with(eps, [pred(-5, 1)]), req(-2, x_slo_tpot_ms="9"), eps) is None
