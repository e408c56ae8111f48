"""DataLayerRuntime: loops follow endpoints, failures stay local, deadlines, overruns, lifecycle."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from structlog.testing import capture_logs

from epp.datalayer.api import Endpoint, EndpointEvent, EndpointMetadata, GroupVersionKind, SourceBinding
from epp.datalayer.runtime import LOOPS_PER_SLOT, DataLayerRuntime, _Loop
from epp.datalayer.sources.notifications import (
    EndpointNotificationSource,
    K8sNotificationSource,
    K8sNotificationSourceParams,
)
from epp.datastore.store import Datastore
from epp.errors import ConfigError
from epp.plugin.base import NoParams, PluginBase
from epp.testing.waiting import until
from tests.datalayer.conftest import HANDLE, FakeModelServer, make_extractor, make_source
from tests.datalayer.sources.test_notifications import EndpointRecorder

INTERVAL = 0.02


def metadata(name: str, port: int = 1) -> EndpointMetadata:
    return EndpointMetadata(name=name, address="127.0.0.1", port=port)


class FakeSource(PluginBase):
    """A polled source whose poll is scripted by the test."""

    TYPE: ClassVar[str] = "fake-source"
    OUTPUT: ClassVar[type] = object

    def __init__(self, name: str = "fake", poll: Callable[[Endpoint], Any] | None = None) -> None:
        super().__init__(name, NoParams(), HANDLE)
        self._poll = poll
        self.calls: list[tuple[str, float]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.log: list[str] | None = None

    async def poll(self, endpoint: Endpoint) -> Any:
        self.calls.append((endpoint.name, asyncio.get_running_loop().time()))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._poll(endpoint) if self._poll else None
        finally:
            self.in_flight -= 1

    async def start(self) -> None:
        if self.log is not None:
            self.log.append(f"start {self.typed_name.name}")

    async def stop(self) -> None:
        if self.log is not None:
            self.log.append(f"stop {self.typed_name.name}")


class NullExtractor(PluginBase):
    TYPE: ClassVar[str] = "null-extractor"
    INPUT: ClassVar[type] = object

    def __init__(self) -> None:
        super().__init__("null", NoParams(), HANDLE)

    def extract(self, data: Any, endpoint: Endpoint) -> None:
        pass


def scraping(**source_params: Any) -> list[SourceBinding]:
    return [SourceBinding(make_source(**source_params), (make_extractor(),))]


async def test_loops_follow_endpoint_churn(servers: Callable[[int], Any]) -> None:
    """One loop per endpoint as endpoints come and go; nothing is left running afterwards."""
    fleet: list[FakeModelServer] = await servers(5)
    ds = Datastore()
    before = asyncio.all_tasks()
    bindings = scraping()
    source = bindings[0].source
    rng = random.Random(7)
    async with DataLayerRuntime(ds, bindings, refresh_interval=INTERVAL) as runtime:
        for _ in range(40):
            for srv in fleet:
                name = f"default/pod-{srv.port}-rank-0"
                if rng.random() < 0.5:
                    ds.upsert(metadata(name, srv.port))
                else:
                    ds.remove(name)
            await asyncio.sleep(0)
            await until(lambda: runtime.active_loops == len(ds.endpoints()))
        live = ds.endpoints()  # every live endpoint is really being scraped
        await until(lambda: all(ep.metrics.update_time > 0 for ep in live))
        ds.clear()
        await until(lambda: runtime.active_loops == 0)
        assert source.idle_connections() == 0  # type: ignore[attr-defined]
    assert asyncio.all_tasks() - before == set()


@pytest.mark.parametrize(
    "failure",
    ["status-500", "hang", "garbage", "oversized", "vanished"],
)
async def test_a_bad_server_does_not_delay_the_others(servers: Callable[[int], Any], failure: str) -> None:
    """A server that errors, hangs, serves junk or vanishes only affects its own endpoint."""
    good, bad = await servers(2)
    ds = Datastore()
    bindings = scraping(timeout="100ms", maxBodyBytes=64_000)
    if failure == "status-500":
        bad.behaviour.status = 500
    elif failure == "hang":
        bad.behaviour.hang = True
    elif failure == "garbage":
        bad.behaviour.body = bytes(random.Random(1).randbytes(20_000))
    elif failure == "oversized":
        bad.behaviour.body = b"# padding\n" * 10_000
    with capture_logs() as logs:
        async with DataLayerRuntime(ds, bindings, refresh_interval=INTERVAL) as runtime:
            if failure == "vanished":
                await bad.stop()
            good_ep, bad_ep = ds.upsert(metadata("good", good.port)), ds.upsert(metadata("bad", bad.port))
            await until(lambda: good_ep.metrics.update_time > 0)
            await until(lambda: (s := runtime.stats(bad_ep)) is not None and s.failures >= 3)
            good_stats = runtime.stats(good_ep)
            assert good_stats is not None
            start = good_stats.ticks
            window = 0.4
            await asyncio.sleep(window)  # the measurement window itself
            ticks = good_stats.ticks - start
            bad_stats = runtime.stats(bad_ep)
            assert bad_stats is not None
    assert ticks >= 0.5 * window / INTERVAL, f"healthy endpoint only ticked {ticks} times"
    assert good_stats.failures == 0
    assert bad_ep.metrics.update_time == 0.0  # never extracted: stale
    assert bad_stats.failing
    failed = [e for e in logs if e["event"] == "endpoint_data_failed"]
    assert [e["endpoint"] for e in failed] == ["bad"]  # logged once, on the transition
    expected = {
        "status-500": "unexpected status code 500",
        "hang": "timed out after 0.1s",
        "garbage": "metric family 'vllm:num_requests_waiting' not found",
        "oversized": "exceeds the limit of 64000",
        "vanished": "connect to 127.0.0.1",
    }[failure]
    assert expected in failed[0]["error"]


async def test_recovery_is_logged_once(servers: Callable[[int], Any]) -> None:
    """fail→ok is logged as recovered and metrics are fresh again."""
    (srv,) = await servers(1)
    srv.behaviour.status = 500
    ds = Datastore()
    with capture_logs() as logs:
        async with DataLayerRuntime(ds, scraping(), refresh_interval=INTERVAL) as runtime:
            ep = ds.upsert(metadata("e", srv.port))
            await until(lambda: (s := runtime.stats(ep)) is not None and s.failures >= 3)
            srv.behaviour.status = 200
            await until(lambda: ep.metrics.update_time > 0)
            await until(lambda: not runtime.stats(ep).failing)  # type: ignore[union-attr]
    events = [e["event"] for e in logs if e.get("endpoint") == "e"]
    assert events.count("endpoint_data_failed") == 1
    assert events.count("endpoint_data_recovered") == 1


async def test_server_that_vanishes_and_returns(servers: Callable[[int], Any]) -> None:
    """A server that goes away goes stale; when it comes back on its port the endpoint recovers."""
    (srv,) = await servers(1)
    port = srv.port
    ds = Datastore()
    async with DataLayerRuntime(ds, scraping(), refresh_interval=INTERVAL) as runtime:
        ep = ds.upsert(metadata("e", port))
        await until(lambda: ep.metrics.update_time > 0)
        assert ep.health.available(0.0)
        await srv.stop()
        await until(lambda: runtime.stats(ep).failing)  # type: ignore[union-attr]
        assert ep.health.unreachable  # refused connections: not picked any more, long before staleness
        stale_since = ep.metrics.update_time
        revived = FakeModelServer()
        from tests.datalayer.sources.test_metrics_http import _restart_on

        if not await _restart_on(revived, port):
            pytest.skip("the port was taken in between")
        try:
            revived.behaviour.body = revived.behaviour.body.replace(b"} 3", b"} 9", 1)
            await until(lambda: ep.metrics.update_time > stale_since)
            assert not runtime.stats(ep).failing  # type: ignore[union-attr]
            assert not ep.health.unreachable
        finally:
            await revived.stop()


async def test_overrun_skips_ticks_without_overlap() -> None:
    """A poll slower than the interval never overlaps itself; missed ticks are skipped, not queued."""

    async def slow(endpoint: Endpoint) -> None:
        await asyncio.sleep(INTERVAL * 2.5)  # a slow model server

    source = FakeSource(poll=slow)
    ds = Datastore()
    async with DataLayerRuntime(
        ds, [SourceBinding(source, (NullExtractor(),))], refresh_interval=INTERVAL
    ) as rt:
        ep = ds.upsert(metadata("e"))
        await until(lambda: len(source.calls) >= 4)
        stats = rt.stats(ep)
    assert source.max_in_flight == 1
    assert stats is not None
    assert stats.skipped >= 3
    gaps = [b[1] - a[1] for a, b in zip(source.calls, source.calls[1:], strict=False)]
    assert min(gaps) >= INTERVAL * 2.5 * 0.9  # back-to-back at most, never bunched up


async def test_watchdog_times_out_a_hung_poll_and_the_loop_goes_on() -> None:
    """A poll that never returns is cut at its deadline, counted as a failure, and polling continues."""
    never = asyncio.Event()

    async def hang(endpoint: Endpoint) -> None:
        await never.wait()

    source = FakeSource(poll=hang)
    ds = Datastore()
    binding = SourceBinding(source, (NullExtractor(),))
    async with DataLayerRuntime(ds, [binding], refresh_interval=INTERVAL, poll_timeout=0.05) as rt:
        ep = ds.upsert(metadata("e"))
        await until(lambda: (s := rt.stats(ep)) is not None and s.failures >= 3)
        stats = rt.stats(ep)
        assert stats is not None
        assert "poll timed out after 0.05s" in stats.last_error
        assert rt.active_loops == 1
        ds.remove("e")  # removal while a poll hangs ends the loop (the cancel is not absorbed)
        await until(lambda: rt.active_loops == 0)


async def test_external_cancel_racing_the_watchdog_is_not_swallowed() -> None:
    """If the watchdog and someone else both cancel, the loop still ends."""
    runtime = DataLayerRuntime(Datastore(), [SourceBinding(FakeSource(), (NullExtractor(),))])
    lp = _Loop(Endpoint(metadata("e")))
    absorbed: list[bool] = []

    async def body() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            absorbed.append(runtime._timed_out(lp))
            raise

    lp.task = asyncio.create_task(body())
    await asyncio.sleep(0)
    lp.timed_out = True
    lp.task.cancel()  # the watchdog
    lp.task.cancel()  # endpoint removal
    with pytest.raises(asyncio.CancelledError):
        await lp.task
    assert absorbed == [False]


async def test_large_pool_spreads_over_the_interval() -> None:
    """Past ``LOOPS_PER_SLOT`` endpoints the polls take more slots: groups of that size, each
    in its own wake-up, not all in one."""
    source = FakeSource()
    ds = Datastore()
    interval = 0.2
    binding = SourceBinding(source, (NullExtractor(),))
    runtime = DataLayerRuntime(ds, [binding], refresh_interval=interval, rng=random.Random(3))
    async with runtime:
        for i in range(3 * LOOPS_PER_SLOT):
            ds.upsert(metadata(f"e{i}"))
        await until(lambda: len({name for name, _ in source.calls}) == 3 * LOOPS_PER_SLOT)
        assert sorted(n for n in runtime._slot_loops if n) == [LOOPS_PER_SLOT] * 3
    assert runtime._slot_loops == [0] * len(runtime._slot_loops)  # every loop gave its slot back


def _runtime_with_dues(
    ds: Datastore, interval: float, slot: float, timeout: float
) -> tuple[DataLayerRuntime, dict[str, float]]:
    """A runtime whose source records each endpoint's first tick's due time."""
    dues: dict[str, float] = {}
    runtime: DataLayerRuntime

    async def poll(endpoint: Endpoint) -> None:
        lp = runtime._loops[endpoint]
        dues.setdefault(endpoint.name, lp.deadline - timeout)  # the tick's due time

    source = FakeSource(poll=poll)
    binding = SourceBinding(source, (NullExtractor(),))
    runtime = DataLayerRuntime(
        ds, [binding], refresh_interval=interval, poll_timeout=timeout, rng=random.Random(5), slot=slot
    )
    return runtime, dues


async def test_polls_share_phase_slots() -> None:
    """Every loop ticks on one of interval/slot phases of one shared grid, a slot filled to
    ``LOOPS_PER_SLOT`` before the next opens, so polls batch per slot."""
    ds = Datastore()
    interval, slot, timeout = 0.2, 0.02, 1.0
    runtime, dues = _runtime_with_dues(ds, interval, slot, timeout)
    n = 2 * LOOPS_PER_SLOT + 5
    async with runtime:
        for i in range(n):
            ds.upsert(metadata(f"e{i}"))
        await until(lambda: len(dues) == n)
    phases = {round((due - runtime._epoch) / slot, 6) for due in dues.values()}
    assert all(p == int(p) for p in phases)  # on the grid
    by_slot: dict[float, int] = {}
    for due in dues.values():
        k = round((due - runtime._epoch) / slot) % round(interval / slot)
        by_slot[k] = by_slot.get(k, 0) + 1
    assert sorted(by_slot.values()) == [5, LOOPS_PER_SLOT, LOOPS_PER_SLOT]


async def test_small_pool_polls_in_one_wake() -> None:
    """A pool smaller than ``LOOPS_PER_SLOT`` ticks in one slot: one timer wake-up an interval;
    a slot freed by a removed endpoint is the one a new endpoint joins."""
    ds = Datastore()
    interval, slot, timeout = 0.2, 0.02, 1.0
    runtime, dues = _runtime_with_dues(ds, interval, slot, timeout)
    async with runtime:
        for i in range(4):
            ds.upsert(metadata(f"e{i}"))
        await until(lambda: len(dues) == 4)
        assert len({round((d - runtime._epoch) / slot) % round(interval / slot) for d in dues.values()}) == 1
        (used,) = [i for i, n in enumerate(runtime._slot_loops) if n]
        assert runtime._slot_loops[used] == 4
        ds.remove("e0")
        await until(lambda: runtime._slot_loops[used] == 3)
        ds.upsert(metadata("e9"))
        await until(lambda: "e9" in dues)
        assert runtime._slot_loops[used] == 4
        assert round((dues["e9"] - runtime._epoch) / slot) % round(interval / slot) == used


async def test_lifecycle_order_and_failed_start() -> None:
    """Sources start in order and stop in reverse; if one fails to start, the started ones are stopped."""
    log: list[str] = []
    a, b = FakeSource("a"), FakeSource("b")
    a.log = b.log = log
    bindings = [SourceBinding(a, (NullExtractor(),)), SourceBinding(b, (NullExtractor(),))]
    async with DataLayerRuntime(Datastore(), bindings):
        assert log == ["start a", "start b"]
    assert log == ["start a", "start b", "stop b", "stop a"]

    class Broken(FakeSource):
        async def start(self) -> None:
            raise RuntimeError("no")

    log.clear()
    bindings = [SourceBinding(a, (NullExtractor(),)), SourceBinding(Broken("c"), (NullExtractor(),))]
    with pytest.raises(RuntimeError, match="no"):
        async with DataLayerRuntime(Datastore(), bindings):
            pass
    assert log == ["start a", "stop a"]


async def test_endpoint_events_reach_notification_sources() -> None:
    """Known and later endpoints are announced (AddOrUpdate) and their removal too (Delete)."""
    ds = Datastore()
    ds.upsert(metadata("early"))
    source = EndpointNotificationSource("ens", NoParams(), HANDLE)
    recorder = EndpointRecorder("rec")
    async with DataLayerRuntime(ds, [SourceBinding(source, (recorder,))]) as rt:  # type: ignore[arg-type]
        ds.upsert(metadata("late"))
        ds.remove("early")
        assert rt.active_loops == 0  # no polled source: no loops
    assert recorder.events == [("AddOrUpdate", "early"), ("AddOrUpdate", "late"), ("Delete", "early")]


@pytest.mark.parametrize(
    ("bindings", "message"),
    [
        pytest.param(lambda: [], "data layer enabled but no data sources configured", id="no-sources"),
        pytest.param(
            lambda: [SourceBinding(object(), ())],  # type: ignore[arg-type]
            "is neither polled nor a notification source",
            id="unknown-source",
        ),
        pytest.param(
            lambda: [SourceBinding(FakeSource(), (object(),))],  # type: ignore[arg-type]
            "is not a fwkdl.Extractor",
            id="not-an-extractor",
        ),
        pytest.param(
            lambda: [
                SourceBinding(
                    K8sNotificationSource(n, K8sNotificationSourceParams(version="v1", kind="Pod"), HANDLE),  # type: ignore[arg-type]
                    (),
                )
                for n in ("a", "b")
            ],
            "duplicate notification source GVK /v1, Kind=Pod: already used by source a/k8s-notification",
            id="duplicate-gvk",
        ),
    ],
)
def test_configuration_errors(bindings: Callable[[], list[SourceBinding]], message: str) -> None:
    """Invalid wiring is refused when the runtime is built, before anything starts."""
    with pytest.raises(ConfigError, match=message):
        DataLayerRuntime(Datastore(), bindings())


def test_k8s_sources_are_exposed_and_timeouts_resolved() -> None:
    """The Kubernetes layer finds the sources to feed; a source's own timeout beats the default."""
    pods = K8sNotificationSource("pods", K8sNotificationSourceParams(version="v1", kind="Pod"), HANDLE)
    http = make_source(timeout="3s")
    rt = DataLayerRuntime(
        Datastore(),
        [SourceBinding(pods, ()), SourceBinding(http, (make_extractor(),))],  # type: ignore[arg-type]
        refresh_interval=0,
    )
    assert rt.k8s_sources == (pods,)
    assert pods.gvk == GroupVersionKind("", "v1", "Pod")
    assert rt.refresh_interval == 0.05  # <= 0 means the 50 ms default, as GIE
    assert rt._polled[0].timeout == 3.0
    assert EndpointEvent("Delete", Endpoint(metadata("x"))).type == "Delete"
