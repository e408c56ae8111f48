"""concurrency-detector: saturation and filter over in-flight load (requests or tokens)."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import INFLIGHT_LOAD, InFlightLoad
from epp.errors import ConfigError
from epp.flowcontrol.api import SaturationDetector, TransitAwareDetector
from epp.flowcontrol.detectors.concurrency import ConcurrencyDetector, InFlightLoadSource
from epp.plugin.base import PluginBase
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, estimate_tokens
from epp.scheduling.api import Filter
from epp.testing.plugins import FakeHandle, build
from tests.scheduling.builders import endpoint, request


class LoadTracker(PluginBase):
    """Stands in for the inflight-load producer's per-endpoint counters."""

    TYPE: ClassVar[str] = "test-load-tracker"

    def __init__(self, loads: dict[str, InFlightLoad]) -> None:
        super().__init__("tracker", None, None)  # type: ignore[arg-type]
        self.loads = loads

    def inflight_load(self, endpoint: Endpoint) -> InFlightLoad | None:
        return self.loads.get(endpoint.metadata.name)


def _detector(
    loads: dict[int, tuple[int, int]] | None, **params: Any
) -> tuple[ConcurrencyDetector, list[Endpoint]]:
    eps = [endpoint(i) for i in range(3)]
    plugins: list[Any] = []
    if loads is not None:
        tracker = LoadTracker(
            {eps[i].metadata.name: InFlightLoad(requests=r, tokens=t) for i, (r, t) in loads.items()}
        )
        assert isinstance(tracker, InFlightLoadSource)
        plugins.append(tracker)
    d: ConcurrencyDetector = build(ConcurrencyDetector, handle=FakeHandle(plugins), **params)
    plugins.append(d)
    return d, eps


@pytest.mark.parametrize(
    ("params", "loads", "expected"),
    [
        pytest.param({}, {0: (50, 0), 1: (100, 0), 2: (0, 0)}, 0.5, id="requests-mode"),
        pytest.param({"maxConcurrency": 10}, {0: (30, 0)}, 1.0, id="over-one-endpoint"),
        pytest.param(
            {"concurrencyMode": "tokens", "maxTokenConcurrency": 1000},
            {0: (1, 1500), 1: (1, 0), 2: (1, 1500)},
            1.0,
            id="tokens-mode",
        ),
        pytest.param({}, None, 0.0, id="no-load-source-sees-zero-as-gie"),
    ],
)
def test_saturation(
    params: dict[str, Any], loads: dict[int, tuple[int, int]] | None, expected: float
) -> None:
    """Total in-flight load over total capacity, read from the configured load source."""
    d, eps = _detector(loads, **params)
    assert isinstance(d, SaturationDetector)
    assert d.saturation(eps) == pytest.approx(expected)
    assert d.saturation([]) == 1.0


@pytest.mark.parametrize(
    ("params", "loads", "expected"),
    [
        pytest.param({"maxConcurrency": 10}, [9, 10, 11], [0], id="strict-limit"),
        pytest.param(
            {"maxConcurrency": 10, "headroom": 0.25}, [9, 11, 12], [0, 1], id="headroom-int-truncated"
        ),
        pytest.param({"maxConcurrency": 1}, [5, 5, 5], [], id="no-fail-open"),
    ],
)
def test_filter_reads_cycle_state(params: dict[str, Any], loads: list[int], expected: list[int]) -> None:
    """Keeps endpoints with load < int(capacity * (1 + headroom)), from the request's INFLIGHT_LOAD."""
    d, eps = _detector(None, **params)
    assert isinstance(d, Filter)
    state = CycleState()
    state.set_attributes(
        INFLIGHT_LOAD, {ep: InFlightLoad(requests=n, tokens=0) for ep, n in zip(eps, loads, strict=False)}
    )
    assert [eps.index(e) for e in d.filter(state, request(), eps)] == expected
    assert INFLIGHT_LOAD in ConcurrencyDetector.CONSUMES


def test_filter_falls_back_to_load_source() -> None:
    """Without INFLIGHT_LOAD in the CycleState the filter asks the load source; with neither, keeps all."""
    d, eps = _detector({0: (200, 0)})
    assert [eps.index(e) for e in d.filter(CycleState(), request(), eps)] == [1, 2]
    bare, eps2 = _detector(None)
    assert bare.filter(CycleState(), request(), eps2) == eps2


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({"maxConcurrency": 0}, "maxConcurrency must be strictly positive, got 0", id="max"),
        pytest.param(
            {"maxTokenConcurrency": -5}, "maxTokenConcurrency must be strictly positive, got -5", id="tokens"
        ),
        pytest.param(
            {"headroom": -1.0}, "headroom must be a non-negative value, got -1.000000", id="headroom"
        ),
        pytest.param({"concurrencyMode": "bytes"}, 'unsupported concurrencyMode: "bytes"', id="mode"),
    ],
)
def test_validation(params: dict[str, Any], message: str) -> None:
    """Invalid parameters fail with GIE's messages."""
    with pytest.raises(ConfigError, match="invalid concurrency detector configuration: " + message):
        build(ConcurrencyDetector, **params)


def test_inflight_load_producer_is_a_load_source() -> None:
    """The built-in inflight-load-producer is what saturation() finds among the configured plugins."""
    from epp.director.producers.inflight_load import InFlightLoadProducer

    producer = build(InFlightLoadProducer)
    d = build(ConcurrencyDetector, handle=FakeHandle([producer]))
    assert isinstance(producer, InFlightLoadSource)
    assert d.load_source() is producer
    assert d.saturation([endpoint(0)]) == 0.0


def _sized(size: int) -> InferenceRequest:
    r = InferenceRequest(request_id=f"t{size}", headers={})
    r.request_size_bytes = size
    return r


@pytest.mark.parametrize(
    ("params", "transit", "expected"),
    [
        # 150 of 300 in flight, two more on their way: (150 + 2) / 300
        pytest.param({}, [_sized(40), _sized(4000)], 152 / 300, id="requests-count-one-each"),
        # 3,000 tokens in flight; 40 bytes = 10 + 15 tokens, 4,000 bytes = 1,000 + 1,500
        pytest.param(
            {"concurrencyMode": "tokens", "maxTokenConcurrency": 1000},
            [_sized(40), _sized(4000)],
            (3000 + 25 + 2500) / 3000,
            id="tokens-count-their-estimate",
        ),
        pytest.param({}, [], 150 / 300, id="nothing-in-transit-is-saturation"),
    ],
)
def test_saturation_with_transit(
    params: dict[str, Any], transit: list[InferenceRequest], expected: float
) -> None:
    """Requests flow control let through and no endpoint counts yet weigh as what they will add."""
    d, eps = _detector({0: (50, 1500), 1: (100, 0), 2: (0, 1500)}, **params)
    assert isinstance(d, TransitAwareDetector)
    assert [estimate_tokens(r) for r in transit] == [25, 2500][: len(transit)]
    assert d.saturation_with_transit(eps, transit) == pytest.approx(expected)


def test_saturation_with_transit_without_a_load_source_stays_gies_zero() -> None:
    d, eps = _detector(None)
    assert d.saturation_with_transit(eps, [_sized(40)]) == 0.0
    assert d.saturation_with_transit([], [_sized(40)]) == 1.0
