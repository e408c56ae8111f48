"""concurrency-detector: saturation and filter over in-flight load (requests or tokens)."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import INFLIGHT_LOAD, InFlightLoad
from epp.errors import ConfigError
from epp.flowcontrol.api import SaturationDetector
from epp.flowcontrol.detectors.concurrency import ConcurrencyDetector, InFlightLoadSource
from epp.plugin.base import PluginBase
from epp.plugin.state import CycleState
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
