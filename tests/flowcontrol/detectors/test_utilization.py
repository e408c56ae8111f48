"""utilization-detector: roofline saturation, staleness, filter with headroom and fail-open."""

from __future__ import annotations

from typing import Any

import pytest

from epp.datalayer.api import Endpoint
from epp.errors import ConfigError
from epp.flowcontrol.api import SaturationDetector
from epp.flowcontrol.detectors.utilization import UtilizationDetector
from epp.plugin.registry import Registry
from epp.plugin.state import CycleState
from epp.scheduling.api import Filter
from epp.testing.plugins import FakeHandle, build
from epp.units import parse_go_duration
from tests.scheduling.builders import endpoint, request


def _eps(specs: list[tuple[int, float, bool]]) -> list[Endpoint]:
    return [endpoint(i, queue=q, kv=kv, fresh=fresh) for i, (q, kv, fresh) in enumerate(specs)]


@pytest.mark.parametrize(
    ("specs", "expected"),
    [
        pytest.param([], 1.0, id="no-endpoints-saturated"),
        pytest.param([(0, 0.0, True)], 0.0, id="idle"),
        pytest.param([(5, 0.4, True)], 1.0, id="queue-at-threshold"),
        pytest.param([(1, 0.4, True)], 0.5, id="kv-dominates"),
        pytest.param([(10, 0.0, True), (0, 0.0, True)], 1.0, id="mean-of-endpoints"),
        pytest.param([(10, 0.0, False), (0, 0.0, True)], 0.0, id="stale-left-out-of-mean"),
        pytest.param([(0, 0.0, False), (0, 0.0, False)], 0.0, id="all-stale-fails-open"),
        pytest.param([(20, 1.0, True)], 4.0, id="over-saturated-not-capped"),
    ],
)
def test_saturation(specs: list[tuple[int, float, bool]], expected: float) -> None:
    """mean(stale ? 1 : max(q / 5, kv / 0.8)) with the default thresholds; no endpoints → 1."""
    d = build(UtilizationDetector)
    assert isinstance(d, SaturationDetector)
    assert d.saturation(_eps(specs)) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("params", "specs", "expected"),
    [
        pytest.param({}, [(4, 0.79, True), (5, 0.1, True), (0, 0.8, True)], [0], id="strict-limits"),
        pytest.param(
            {"headroom": 0.2}, [(5, 0.9, True), (6, 0.1, True), (0, 0.96, True)], [0], id="headroom-relaxes"
        ),
        pytest.param({}, [(0, 0.0, False), (1, 0.1, True)], [1], id="stale-dropped"),
        pytest.param({}, [(9, 0.0, True), (0, 0.0, False)], [0, 1], id="all-dropped-fail-open"),
    ],
)
def test_filter(params: dict[str, Any], specs: list[tuple[int, float, bool]], expected: list[int]) -> None:
    """Keeps fresh endpoints under Threshold * (1 + headroom); returns the input if none is left."""
    d = build(UtilizationDetector, **params)
    assert isinstance(d, Filter)
    eps = _eps(specs)
    assert [eps.index(e) for e in d.filter(CycleState(), request(), eps)] == expected


def test_staleness_uses_monotonic_clock() -> None:
    """An endpoint becomes stale (unknown: left out of the mean) once the clock passes update_time + threshold."""
    d = build(UtilizationDetector, metricsStalenessThreshold="1s")
    busy, idle = endpoint(0, queue=10), endpoint(1, queue=0)
    now = busy.metrics.update_time
    d.clock = lambda: now + 0.999
    assert d.saturation([busy, idle]) == 1.0  # mean of 2.0 and 0.0
    idle.metrics = type(idle.metrics)(update_time=now + 0.5)
    d.clock = lambda: now + 1.001
    assert d.saturation([busy, idle]) == 0.0  # busy is stale now: only idle counts


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param(
            {"queueDepthThreshold": 0}, "queueDepthThreshold must be strictly positive, got 0", id="queue"
        ),
        pytest.param(
            {"kvCacheUtilThreshold": 0.0},
            r"kvCacheUtilThreshold must be in \(0.0, 1.0\], got 0.000000",
            id="kv-zero",
        ),
        pytest.param(
            {"kvCacheUtilThreshold": 1.5},
            r"kvCacheUtilThreshold must be in \(0.0, 1.0\], got 1.500000",
            id="kv-high",
        ),
        pytest.param(
            {"metricsStalenessThreshold": "0s"},
            "metricsStalenessThreshold must be strictly positive, got 0s",
            id="stale-zero",
        ),
        pytest.param(
            {"metricsStalenessThreshold": "fast"},
            'metricsStalenessThreshold: time: invalid duration "fast"',
            id="stale-garbage",
        ),
        pytest.param(
            {"headroom": -0.1}, "headroom must be a non-negative value, got -0.100000", id="headroom"
        ),
        pytest.param(
            {"queueDepthThreshold": -1, "headroom": -1},
            "queueDepthThreshold must be strictly positive, got -1; headroom must be",
            id="aggregated",
        ),
    ],
)
def test_validation(params: dict[str, Any], message: str) -> None:
    """Every invalid parameter is reported, prefixed like GIE."""
    with pytest.raises(ConfigError, match="invalid utilization detector configuration: " + message):
        build(UtilizationDetector, **params)


def test_registry_params() -> None:
    """GIE parameter names are accepted; the staleness string is parsed to seconds."""
    d = Registry([UtilizationDetector]).build(
        name="u",
        type_name="utilization-detector",
        parameters={
            "queueDepthThreshold": 3,
            "kvCacheUtilThreshold": 0.5,
            "metricsStalenessThreshold": "1m30s",
            "headroom": 0.1,
        },
        handle=FakeHandle(),
        path="plugins[0]",
    )
    assert isinstance(d, UtilizationDetector)
    assert (
        d.queue_depth_threshold,
        d.kv_cache_util_threshold,
        d.metrics_staleness_threshold,
        d.headroom,
    ) == (3, 0.5, 90.0, 0.1)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("200ms", 0.2, id="ms"),
        pytest.param("1.5s", 1.5, id="fraction"),
        pytest.param("1h2m3s", 3723.0, id="compound"),
        pytest.param("250us", 0.00025, id="us"),
        pytest.param("250\u00b5s", 0.00025, id="micro-sign"),
        pytest.param("10ns", 1e-8, id="ns"),
        pytest.param("-2s", -2.0, id="negative"),
        pytest.param("0", 0.0, id="bare-zero"),
    ],
)
def test_parse_go_duration(text: str, seconds: float) -> None:
    """Go duration strings convert to seconds."""
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("", 'time: invalid duration ""', id="empty"),
        pytest.param("5", 'time: missing unit in duration "5"', id="missing-unit"),
        pytest.param("5x", 'time: unknown unit "x" in duration "5x"', id="unknown-unit"),
        pytest.param("s", 'time: invalid duration "s"', id="no-number"),
    ],
)
def test_parse_go_duration_errors(text: str, message: str) -> None:
    """Malformed durations fail with Go's messages."""
    with pytest.raises(ValueError, match=message):
        parse_go_duration(text)
