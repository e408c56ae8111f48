"""Passive endpoint health: unreachable from scrapes, ejected after consecutive 5xx, fail open."""

from __future__ import annotations

from epp.datalayer.health import (
    BASE_EJECTION,
    CONSECUTIVE_5XX,
    MAX_EJECTION,
    EndpointHealth,
    available_or_all,
)
from epp.testing.builders import make_endpoint as endpoint


def test_consecutive_5xx_eject_with_growing_backoff() -> None:
    h = EndpointHealth()
    for _ in range(CONSECUTIVE_5XX - 1):
        assert not h.response(503, 0.0)
    assert h.response(500, 0.0)
    assert not h.available(BASE_EJECTION - 0.01) and h.available(BASE_EJECTION)
    for _ in range(CONSECUTIVE_5XX):
        h.response(500, BASE_EJECTION)
    assert h.ejected_until == BASE_EJECTION + 2 * BASE_EJECTION  # second ejection lasts twice as long
    for n in range(20):
        t = 1000.0 * (n + 1)
        for _ in range(CONSECUTIVE_5XX):
            h.response(500, t)
        assert h.ejected_until - t <= MAX_EJECTION


def test_a_success_resets_the_streak_and_after_ejection_the_count() -> None:
    h = EndpointHealth()
    for _ in range(CONSECUTIVE_5XX - 1):
        h.response(502, 0.0)
    h.response(200, 0.0)
    for _ in range(CONSECUTIVE_5XX - 1):
        assert not h.response(502, 0.0)
    h.response(500, 0.0)  # ejected once
    h.response(200, 0.5)  # during the ejection: the count stays
    assert h.ejections == 1
    h.response(200, BASE_EJECTION + 1)
    assert h.ejections == 0


def test_4xx_is_the_clients_fault_not_the_replicas() -> None:
    h = EndpointHealth()
    for _ in range(10):
        h.response(429, 0.0)
        h.response(400, 0.0)
    assert h.available(0.0)


def test_unreachable_until_a_scrape_succeeds() -> None:
    h = EndpointHealth()
    h.scraped(False)
    assert not h.available(0.0)
    h.scraped(True)
    assert h.available(0.0)


def test_available_or_all_fails_open() -> None:
    a, b, c = endpoint(0), endpoint(1), endpoint(2)
    eps = [a, b, c]
    assert available_or_all(eps, 0.0) is eps  # nothing unavailable: no copy
    b.health.scraped(False)
    assert available_or_all(eps, 0.0) == [a, c]
    a.health.scraped(False)
    c.health.scraped(False)
    assert available_or_all(eps, 0.0) is eps  # none available: route anyway
