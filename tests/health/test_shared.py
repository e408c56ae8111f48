"""Ejections shared between workers (epp.health.shared): one pool per process, the sync hub between."""

from __future__ import annotations

import time
from typing import Any

import pytest

from epp.health import EndpointHealth, HealthPool, Status
from epp.health.shared import HealthExchange
from epp.testing.waiting import until
from tests.sync.conftest import mesh


def _pool(*names: str) -> tuple[HealthPool, list[EndpointHealth]]:
    pool = HealthPool()
    members = [EndpointHealth(n, pool) for n in names]
    for m in members:
        m.join()
    return pool, members


def _status(h: EndpointHealth) -> Status:
    """Read anew (mypy keeps an asserted status narrowed across the calls that change it)."""
    return h.status


def _fail(h: EndpointHealth, times: int, now: float) -> None:
    """``times`` requests routed to ``h`` answered 500 (3 in a row eject by default)."""
    for _ in range(times):
        h.sent(now)
        h.headers(500, 0.01, now)


async def test_an_ejection_in_one_worker_reaches_the_other_over_the_sync_hub() -> None:
    async with mesh(["w0", "w1"]) as (a, b):
        pa, (a1, _) = _pool("ep1", "ep2")
        pb, (b1, b2) = _pool("ep1", "ep2")
        xa, xb = HealthExchange(pa), HealthExchange(pb)
        a.hub.bind([a.counter, xa])
        b.hub.bind([b.counter, xb])
        now = time.monotonic()
        _fail(a1, 3, now)
        assert a1.status is Status.EJECTED
        await until(lambda: b1.status is Status.EJECTED, 5, what="w1 adopts w0's ejection")
        assert b1.reason == "consecutive-5xx"
        assert not b1.available(time.monotonic())
        assert b1.ejected_until == pytest.approx(time.monotonic() + 10.0, abs=1.0)  # the base ejection time
        assert b2.status is Status.HEALTHY
        assert (xa.adopted, xb.adopted) == (0, 1)
        # the budget (50% of 2: one endpoint) is each process's own: w1 cannot eject ep2 now
        _fail(b2, 3, time.monotonic())
        assert _status(b2) is Status.DEGRADED


def test_an_adopted_ejection_is_not_sent_back_and_follows_the_same_probe() -> None:
    pool, (h, _) = _pool("ep1", "ep2")
    x = HealthExchange(pool, clock=lambda: 100.0)
    assert x.drain() == []  # recording starts at the first drain
    x.apply("w0", [["ep1", 4.0, "consecutive-gateway-failure", 2], ["gone", 1.0, "x", 1]])
    assert h.status is Status.EJECTED and h.ejections == 2
    assert x.drain() == []  # not echoed to the peers
    assert not h.available(103.9)
    assert h.available(104.1) and _status(h) is Status.PROBING  # as for its own ejection


def test_an_own_ejection_is_drained_once_with_the_seconds_left() -> None:
    pool, (h, _) = _pool("ep1", "ep2")
    x = HealthExchange(pool)
    x.drain()
    _fail(h, 3, 50.0)
    assert x.drain() == [["ep1", 10.0, "consecutive-5xx", 1]]
    assert x.drain() == []


def test_a_peers_ejection_is_capped_at_the_policys_longest() -> None:
    pool, (h, _) = _pool("ep1", "ep2")
    HealthExchange(pool, clock=lambda: 0.0).apply("w0", [["ep1", 1e9, "consecutive-5xx", 1]])
    assert h.ejected_until == pool.policy.max_ejection_time


def test_snapshot_carries_the_ejections_in_force_for_a_warm_start() -> None:
    pool, (h, _) = _pool("ep1", "ep2")
    x = HealthExchange(pool, clock=lambda: 52.0)
    x.drain()
    _fail(h, 3, 50.0)
    snap = x.snapshot()
    assert snap == [["ep1", 8.0, "consecutive-5xx", 1]]
    fresh_pool, (fresh, _) = _pool("ep1", "ep2")
    HealthExchange(fresh_pool, clock=lambda: 0.0).restore(snap)
    assert fresh.status is Status.EJECTED and fresh.ejected_until == 8.0


@pytest.mark.parametrize(
    "bad",
    [
        ["ep1", "soon", "r", 1],
        ["ep1", float("nan"), "r", 1],
        ["ep1", 1.0, "r"],
        [1, 1.0, "r", 1],
        ["ep1", True, "r", 1],
        {"ep1": 1},
    ],
)
def test_a_malformed_batch_is_refused_whole_naming_the_key(bad: Any) -> None:
    pool, (h, _) = _pool("ep1", "ep2")
    x = HealthExchange(pool)
    with pytest.raises(ValueError, match="epp/endpoint-health"):
        x.apply("w0", [["ep1", 1.0, "r", 1], bad])  # the good one first: nothing is applied
    assert h.status is Status.HEALTHY
    with pytest.raises(ValueError, match="epp/endpoint-health"):
        x.apply("w0", {"not": "a list"})  # type: ignore[arg-type]
