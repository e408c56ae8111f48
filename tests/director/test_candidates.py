"""Candidate endpoints from Envoy's subset hint (GIE §3.4, hermetic cases 10-12)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp.datalayer.api import Endpoint, is_stale
from epp.director.candidates import SUBSET_KEY, SUBSET_NAMESPACE, locate, usable
from epp.health.state import EJECTED, HEALTHY, UNREACHABLE
from epp.testing.builders import make_endpoint

EPS = [make_endpoint(i) for i in range(3)]


def hint(*values: Any) -> dict[str, Any]:
    return {SUBSET_NAMESPACE: {SUBSET_KEY: list(values)}}


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        pytest.param({}, [0, 1, 2], id="no-metadata"),
        pytest.param({SUBSET_NAMESPACE: "x"}, [0, 1, 2], id="namespace-not-a-map"),
        pytest.param({SUBSET_NAMESPACE: {SUBSET_KEY: "x"}}, [0, 1, 2], id="key-not-a-list"),
        pytest.param(hint(), [], id="empty-list-means-none"),
        pytest.param(hint("192.168.1.3:8000"), [2], id="partial"),
        pytest.param(hint("192.168.1.1:9999", 5), [0], id="port-ignored-non-strings-skipped"),
        pytest.param(hint("192.168.1.99:8000"), [], id="none-match"),
    ],
)
def test_locate(metadata: dict[str, Any], expected: list[int]) -> None:
    """Only the IP of each hint entry matters; a present but empty hint selects nothing."""
    assert [EPS.index(e) for e in locate(EPS, metadata)] == expected


def test_disabled_filter_ignores_hint() -> None:
    """--disable-endpoint-subset-filter returns every endpoint."""
    assert list(locate(EPS, hint("192.168.1.3:8000"), subset_filter=False)) == EPS


def test_ipv6_hint() -> None:
    """Bracketed IPv6 hints match endpoints by address."""
    ep = make_endpoint(0, address="fd00::1")
    assert list(locate([ep], hint("[fd00::1]:8000"))) == [ep]


def fresh_or_all(endpoints: Sequence[Endpoint], now: float, threshold: float) -> Sequence[Endpoint]:
    """The reference first step: the endpoints with fresh metrics, or all when none is."""
    fresh = [ep for ep in endpoints if not is_stale(ep.metrics, now, threshold)]
    return endpoints if not fresh or len(fresh) == len(endpoints) else fresh


def available_or_all(endpoints: Sequence[Endpoint], now: float) -> Sequence[Endpoint]:
    """The reference second step: the available endpoints, or all when none is."""
    available = [ep for ep in endpoints if ep.health.available(now)]
    return endpoints if not available or len(available) == len(endpoints) else available


@pytest.mark.parametrize(
    ("times", "kept"),
    [
        pytest.param([99.0, 50.0], [0], id="stale-dropped"),
        pytest.param([50.0, 0.0], [0, 1], id="all-stale-fail-open"),
        pytest.param([99.0, 99.5], [0, 1], id="all-fresh"),
        pytest.param([], [], id="empty"),
    ],
)
def test_usable_keeps_fresh_endpoints(times: list[float], kept: list[int]) -> None:
    """Fresh endpoints only, unless none is fresh: then all of them (never fail closed)."""
    eps = [make_endpoint(i) for i in range(len(times))]
    for ep, t in zip(eps, times, strict=True):
        ep.metrics = replace(ep.metrics, update_time=t)
    assert [eps.index(e) for e in usable(eps, 100.0, 2.0)] == kept


@st.composite
def fleets(draw: st.DrawFn) -> list[Endpoint]:
    """Endpoints with never-scraped, stale and fresh metrics, some unreachable or ejected."""
    out = []
    for i in range(draw(st.integers(0, 12))):
        ep = make_endpoint(i)
        ep.metrics = replace(ep.metrics, update_time=draw(st.sampled_from([0.0, 1.0, 95.0, 99.0, 100.0])))
        ejected_until = draw(st.sampled_from([0.0, 50.0, 150.0]))
        ep.health.ejected_until = ejected_until
        ep.health.status = UNREACHABLE if draw(st.booleans()) else EJECTED if ejected_until else HEALTHY
        ep.health.requiet()
        out.append(ep)
    return out


@given(fleets(), st.sampled_from([0.0, -1.0, 2.0, 10.0]), st.booleans())
def test_usable_is_fresh_then_available_in_one_pass(
    eps: list[Endpoint], threshold: float, as_tuple: bool
) -> None:
    """Differential: the one pass equals the two fail-open steps it replaced, order included."""
    candidates: Sequence[Endpoint] = tuple(eps) if as_tuple else eps
    now = 100.0
    fresh = fresh_or_all(candidates, now, threshold) if threshold > 0 else candidates
    expected = available_or_all(fresh, now)
    got = usable(candidates, now, threshold)
    assert list(got) == list(expected)
    if expected is candidates:
        assert got is candidates  # the common case builds no list
