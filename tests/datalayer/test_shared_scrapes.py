"""One scrape per pod (``--workers N``): worker 0 fetches the pages, the others reuse them within a bound."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from epp.datalayer.api import Endpoint, EndpointEvent, EndpointMetadata, SourceBinding
from epp.datalayer.runtime import DataLayerRuntime
from epp.datalayer.shared_scrapes import PERIODS, SHARE_ENV, ScrapeShare
from epp.datalayer.sources.metrics_http import MetricsDataSource
from epp.datastore.store import Datastore
from epp.errors import ConfigError
from epp.metrics.series import REGISTRY
from epp.testing.clock import ManualClock
from epp.testing.waiting import until
from tests.datalayer.conftest import FakeModelServer, make_extractor, make_source, vllm_page

INTERVAL = 0.05


def pages(outcome: str) -> float:
    return REGISTRY.get_sample_value("epp_scrape_pages_total", {"outcome": outcome}) or 0.0


async def pair(tmp_path: Path, clock: ManualClock | None = None) -> tuple[ScrapeShare, ScrapeShare]:
    """Both ends, subscribed: a SUB only hears what is published after its subscription reached
    the PUB (ZMQ's slow joiner), so probe until a page gets through."""
    address = f"ipc://{tmp_path / 'scrapes.pub'}"
    kw: dict[str, Any] = {} if clock is None else {"clock": clock}
    pub, sub = ScrapeShare("bind", address, **kw), ScrapeShare("connect", address, **kw)

    def probe() -> bool:
        pub.publish(b"probe", b"")
        return sub.fresh(b"probe", 10.0) is not None

    await until(probe, what="the sibling subscribed")
    return pub, sub


@dataclass
class Shared:
    """Worker 0's source and a sibling's, sharing pages of one model server ``ep`` (page ``key``)."""

    pub: ScrapeShare
    sub: ScrapeShare
    worker0: MetricsDataSource
    sibling: MetricsDataSource
    ep: Endpoint
    key: bytes


@asynccontextmanager
async def sharing(
    tmp_path: Path, srv: FakeModelServer, max_age: float, clock: ManualClock | None = None
) -> AsyncIterator[Shared]:
    pub, sub = await pair(tmp_path, clock)
    worker0, sibling = make_source(), make_source()
    worker0.share_scrapes(pub, max_age)
    sibling.share_scrapes(sub, max_age)
    key = f"metrics-data-source|127.0.0.1:{srv.port}".encode()
    await worker0.start()
    await sibling.start()
    try:
        yield Shared(pub, sub, worker0, sibling, srv.endpoint(), key)
    finally:
        await worker0.stop()
        await sibling.stop()
        pub.close()
        sub.close()


async def test_a_sibling_parses_worker_0s_page_and_does_not_scrape(
    tmp_path: Path, servers: Callable[[int], Any]
) -> None:
    (srv,) = await servers(1)
    srv.behaviour.body = vllm_page(waiting=11)
    ext = make_extractor()
    async with sharing(tmp_path, srv, 10.0) as sh:
        fetched, published = pages("fetched"), sh.pub.published
        await sh.worker0.poll(sh.ep)
        assert (srv.behaviour.requests, sh.pub.published - published, pages("fetched") - fetched) == (1, 1, 1)
        await until(
            lambda: sh.sub.fresh(sh.key, 10.0) is not None, what="worker 0's page reached the sibling"
        )
        fetched, shared = pages("fetched"), pages("shared")
        ext.extract(await sh.sibling.poll(sh.ep), sh.ep)
        assert srv.behaviour.requests == 1  # parsed from worker 0's page, not fetched
        assert sh.ep.metrics.waiting_queue_size == 11
        assert (pages("fetched") - fetched, pages("shared") - shared) == (0, 1)  # the pod's series


async def test_past_the_bound_the_sibling_scrapes_itself_until_pages_are_fresh_again(
    tmp_path: Path, servers: Callable[[int], Any]
) -> None:
    (srv,) = await servers(1)
    clock = ManualClock(0.0)  # so that now + max_age - stamp is max_age exactly
    max_age = PERIODS * INTERVAL
    async with sharing(tmp_path, srv, max_age, clock) as sh:
        sub, ep = sh.sub, sh.ep
        await sh.worker0.poll(ep)
        await until(
            lambda: sub.fresh(sh.key, max_age) is not None, what="worker 0's page reached the sibling"
        )
        clock.now += max_age  # exactly the bound: still used
        await sh.sibling.poll(ep)
        assert srv.behaviour.requests == 1
        clock.now += 0.001  # past it: worker 0 missed its polls (dead, restarting, or its scrape failed)
        stale = sub.stale
        await sh.sibling.poll(ep)
        assert srv.behaviour.requests == 2
        assert sub.stale == stale + 1
        await sh.worker0.poll(ep)  # worker 0 is back: its page is fresh again
        await until(lambda: sub.fresh(sh.key, 0.0) is not None, what="the new page reached the sibling")
        await sh.sibling.poll(ep)
        assert srv.behaviour.requests == 3  # worker 0's fetch only


async def test_a_departed_endpoints_page_is_dropped(tmp_path: Path, servers: Callable[[int], Any]) -> None:
    (srv,) = await servers(1)
    async with sharing(tmp_path, srv, 10.0) as sh:
        await sh.worker0.poll(sh.ep)
        await until(
            lambda: sh.sub.fresh(sh.key, 10.0) is not None, what="worker 0's page reached the sibling"
        )
        sh.sibling.endpoint_event(EndpointEvent("Delete", sh.ep))
        assert sh.sub.fresh(sh.key, 10.0) is None


@pytest.mark.parametrize("raw", ["listen:ipc:///x", "bind:", "connect"])
def test_a_bad_channel_names_the_variable(raw: str) -> None:
    with pytest.raises(ConfigError, match=SHARE_ENV):
        ScrapeShare.from_env({SHARE_ENV: raw})


def test_no_channel_without_workers() -> None:
    assert ScrapeShare.from_env({}) is None


async def test_workers_runtimes_scrape_once_and_the_sibling_takes_over_when_worker_0_stops(
    tmp_path: Path, servers: Callable[[int], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two data layers as two workers run them: while worker 0 scrapes, every GET the model
    server answers is worker 0's or a sibling's fallback, and the sibling's metrics come from
    worker 0's pages; once worker 0 stops, the sibling scrapes by itself and stays fresh."""
    srv: FakeModelServer = (await servers(1))[0]
    srv.behaviour.body = vllm_page(waiting=5)
    address = f"ipc://{tmp_path / 'scrapes.pub'}"

    def runtime() -> tuple[Datastore, DataLayerRuntime]:
        ds = Datastore()
        binding = SourceBinding(make_source(), (make_extractor(),))
        return ds, DataLayerRuntime(ds, [binding], refresh_interval=INTERVAL)

    ds0, rt0 = runtime()
    ds1, rt1 = runtime()
    name = f"default/pod-{srv.port}-rank-0"
    monkeypatch.setenv(SHARE_ENV, f"bind:{address}")
    await rt0.__aenter__()
    stopped = False
    try:
        monkeypatch.setenv(SHARE_ENV, f"connect:{address}")
        async with rt1:
            pub, sub = rt0.scrape_share, rt1.scrape_share
            assert pub is not None and pub.publishing
            assert sub is not None and not sub.publishing
            for ds in (ds0, ds1):
                ds.upsert(EndpointMetadata(name=name, address="127.0.0.1", port=srv.port))
            await until(lambda: sub.used >= 5, what="the sibling used 5 of worker 0's pages")
            accounted = pub.published + sub.stale  # worker 0's fetches and the sibling's own
            assert accounted <= srv.behaviour.requests <= accounted + 2  # + at most a poll in flight each
            assert ds1.get(name).metrics.waiting_queue_size == 5  # type: ignore[union-attr]
            await rt0.__aexit__(None, None, None)
            stopped = True
            own = sub.stale
            srv.behaviour.body = vllm_page(waiting=9)
            await until(lambda: sub.stale >= own + 3, what="the sibling scraping by itself")
            await until(
                lambda: ds1.get(name).metrics.waiting_queue_size == 9,  # type: ignore[union-attr]
                what="the sibling's own scrape updated its metrics",
            )
    finally:
        if not stopped:
            await rt0.__aexit__(None, None, None)
