"""What the data layer tells endpoint health: refused scrapes, timeouts, and scrapes that hang."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from epp.datalayer.api import EndpointMetadata, SourceBinding
from epp.datalayer.runtime import DataLayerRuntime
from epp.datastore.store import Datastore
from epp.health import HEALTH, Status
from epp.testing.waiting import until
from tests.datalayer.conftest import FakeModelServer, make_extractor, make_source

INTERVAL = 0.05


def metadata(name: str, port: int) -> EndpointMetadata:
    return EndpointMetadata(name=name, address="127.0.0.1", port=port)


def scraping(**source_params: Any) -> list[SourceBinding]:
    return [SourceBinding(make_source(**source_params), (make_extractor(),))]


async def test_a_hung_endpoint_is_ejected_and_its_peers_are_not(servers: Callable[[int], Any]) -> None:
    """/metrics stops answering while a request routed there waits for headers: ejected as hung
    within a few scrape intervals; the endpoints that answer stay healthy; every one is a peer."""
    fleet: list[FakeModelServer] = await servers(3)
    ds = Datastore()
    async with DataLayerRuntime(ds, scraping(), refresh_interval=INTERVAL) as runtime:
        eps = [ds.upsert(metadata(f"hung-{i}", s.port)) for i, s in enumerate(fleet)]
        for ep in eps:
            await until(lambda ep=ep: ep.health.scrape_usual > 0)  # type: ignore[misc]
        assert all(ep.health in HEALTH.members for ep in eps)
        hung = eps[0]
        fleet[0].behaviour.hang = True
        t0 = time.monotonic()
        hung.health.sent(t0)  # a request routed to it now waits for its headers
        await until(lambda: not hung.health.available(time.monotonic()), timeout=2.0)
        assert (hung.health.status, hung.health.reason) == (Status.EJECTED, "scrape-hang")
        assert runtime.stats(hung) is not None
        for ep in eps[1:]:
            assert ep.health.available(time.monotonic()) and ep.health.status is Status.HEALTHY
        fleet[0].behaviour.hang = False
    assert not any(ep.health in HEALTH.members for ep in eps)  # the runtime's exit: no longer peers


async def test_a_refused_scrape_makes_it_unreachable_until_one_succeeds(
    servers: Callable[[int], Any],
) -> None:
    (srv,) = await servers(1)
    ds = Datastore()
    async with DataLayerRuntime(ds, scraping(), refresh_interval=INTERVAL):
        ep = ds.upsert(metadata("refused", srv.port))
        await until(lambda: ep.metrics.update_time > 0)
        await srv.stop()
        await until(lambda: ep.health.unreachable)
        assert ep.health.reason == "connection-refused"
        assert not ep.health.available(time.monotonic())


async def test_a_timed_out_scrape_is_counted(servers: Callable[[int], Any]) -> None:
    (srv,) = await servers(1)
    ds = Datastore()
    async with DataLayerRuntime(ds, scraping(), refresh_interval=INTERVAL, poll_timeout=0.1):
        ep = ds.upsert(metadata("slow", srv.port))
        await until(lambda: ep.metrics.update_time > 0)
        srv.behaviour.hang = True
        await until(lambda: ep.health.scrape_timeouts >= 2)
        assert ep.health.status is Status.HEALTHY  # no request waits on it: nothing says it is hung
        srv.behaviour.hang = False
        await until(lambda: ep.health.scrape_timeouts == 0)
