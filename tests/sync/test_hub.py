"""SyncHub over real ZMQ sockets on loopback: deltas, identity, silence, partitions, warm start."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import structlog
import zmq
import zmq.asyncio

from epp.director.producers.approx_prefix import ApproxPrefixCacheProducer
from epp.director.producers.inflight_load import InFlightLoadProducer
from epp.metrics.series import REGISTRY
from epp.scheduling.filters.session_affinity import SessionAffinityFilter
from epp.scheduling.scorers.precise_prefix import PrecisePrefixCacheScorer
from epp.scheduling.scorers.session_affinity import SessionAffinityScorer
from epp.server.h2.client import UnaryClient
from epp.server.peering import SNAPSHOT_PATH
from epp.sync.hub import DEFAULT_POLL, HOLD_CREDIT, SyncHub
from epp.sync.peers import Peer
from epp.sync.secret import PeerSecret
from epp.sync.transport import ZmqTransport
from epp.sync.wire import decode_batch, encode, encode_batch
from epp.testing.plugins import build
from epp.testing.replicated import SNAPSHOT_ORIGIN, PolledCounter, make_counter
from epp.testing.waiting import until
from tests.scheduling.scorers.test_precise_prefix import PARAMS as PRECISE
from tests.sync.conftest import Node, make_node, mesh


async def test_deltas_reach_every_peer_kept_apart_by_sender(kind: str) -> None:
    async with mesh(["a", "b", "c"], kind=kind) as (a, b, c):
        a.counter.count("e1", 3)
        b.counter.count("e1", 2)
        b.counter.count("e2")
        await until(lambda: c.counter.total("e1") == 5 and c.counter.total("e2") == 1, 5, what="c sees a+b")
        assert c.counter.learned == {"a": {"e1": 3}, "b": {"e1": 2, "e2": 1}}
        await until(lambda: a.counter.learned.get("b") == {"e1": 2, "e2": 1}, 5, what="a sees b")
        assert "a" not in a.counter.learned  # nothing echoes back to its origin
        assert a.hub.stats.sent >= 1 and c.hub.stats.received >= 2


async def test_changes_in_one_tick_go_out_as_one_batch(kind: str) -> None:
    async with mesh(["a", "b"], kind=kind) as (a, b):
        sent = a.hub.stats.sent
        for i in range(50):
            a.counter.count(f"e{i % 5}")
        await until(lambda: b.counter.total("e0") == 10, 5, what="b sees all 50")
        assert a.hub.stats.sent == sent + 1


async def test_a_change_waits_hold_for_the_next_and_carries_the_first_ones_time(kind: str) -> None:
    """Coalescing: changes made within ``hold`` of the first leave as one batch, stamped with the
    first change's wall clock, so the lag peers measure includes the wait (the issue's staleness)."""
    async with mesh(["a", "b"], kind=kind, hold=0.2) as (a, b):
        clock = [1000.0]
        a.hub._wall = lambda: clock[0]
        frames: list[bytes] = []
        send = a.hub.transport.send

        def capture(frame: bytes) -> bool:
            frames.append(frame)
            return send(frame)

        a.hub.transport.send = capture  # type: ignore[method-assign]
        sent = a.hub.stats.sent
        a.counter.count("e1")
        for _ in range(3):  # a few loop ticks later: the same request's release, say
            await asyncio.sleep(0)
        clock[0] = 1000.05
        a.counter.count("e2")
        await until(lambda: b.counter.total("e2") == 1, 5, what="b sees both")
        assert a.hub.stats.sent == sent + 1 and b.counter.total("e1") == 1
        batches = [decode_batch([f], 1 << 20) for f in frames]
        assert [(t, sorted(d)) for _, _, t, d in batches if d] == [(1000.0, ["test-routed-counter/counter"])]


async def test_a_change_from_a_later_wake_sends_the_held_batch_at_once(kind: str) -> None:
    """Holding waits for the next wake's changes, not for the timer: the second change (a
    request's release, the next request) rides along and the batch leaves in that wake."""
    async with mesh(["a", "b"], kind=kind, hold=0.4) as (a, b):
        a.hub._last_flush = -1e9  # the gap since the last batch has passed: only hold delays
        a.counter.count("e1")
        assert isinstance(a.hub._scheduled, asyncio.TimerHandle)
        a.counter.count("e1")  # the same wake: still held
        assert isinstance(a.hub._scheduled, asyncio.TimerHandle)
        loop = asyncio.get_running_loop()
        later = loop.time() + a.hub.hold / 4
        await until(lambda: loop.time() > later, 5, what="a later wake")
        a.counter.count("e2")
        assert type(a.hub._scheduled) is not asyncio.TimerHandle  # a plain call_soon handle
        await until(lambda: b.counter.total("e2") == 1, 5, what="b sees the batch")
        assert b.counter.total("e1") == 2


async def test_a_batch_waiting_for_the_gap_leaves_in_a_later_changes_wake_not_on_its_timer(kind: str) -> None:
    """A busy replica changes something every request: a batch that waits for the gap leaves at
    the end of the first wake with a change once the gap has passed, and its timer (``gap_slack``
    after the gap, here far off) never fires; it is the fallback for a replica that goes quiet."""
    async with mesh(["a", "b"], kind=kind) as (a, b):
        loop = asyncio.get_running_loop()
        a.hub.gap, a.hub.gap_slack = 0.5, 30.0
        await until(lambda: a.hub._scheduled is None, 5, what="the start-up batches sent")
        await until(lambda: loop.time() >= a.hub._last_flush + a.hub.gap, 5, what="the gap passed")
        a.counter.count("e0")  # past the gap: held a few ms at most
        await until(lambda: b.counter.total("e0") == 1 and a.hub._scheduled is None, 5, what="a batch sent")
        timers, joined = a.hub.stats.timer_flushes, a.hub.stats.gaps_joined
        a.counter.count("e1")  # within the gap of that batch: it waits
        assert isinstance(a.hub._scheduled, asyncio.TimerHandle)
        a.counter.count("e1")  # the same wake, the gap not yet over: still waiting
        assert isinstance(a.hub._scheduled, asyncio.TimerHandle)
        await until(lambda: loop.time() >= a.hub._last_flush + a.hub.gap, 5, what="the gap passed")
        assert b.counter.total("e1") == 0  # nothing left without a change
        a.counter.count("e2")  # a later wake's change: the batch goes at the end of this wake
        assert type(a.hub._scheduled) is not asyncio.TimerHandle
        await until(lambda: b.counter.total("e2") == 1, 5, what="b sees the batch")
        assert b.counter.total("e1") == 2
        assert a.hub.stats.timer_flushes == timers and a.hub.stats.gaps_joined == joined + 1
        a.hub.gap_slack = 0.0
        a.counter.count("e3")  # within the gap again, and no change follows: the timer sends it
        assert isinstance(a.hub._scheduled, asyncio.TimerHandle)
        await until(lambda: b.counter.total("e3") == 1, 5, what="the timer's batch")
        assert a.hub.stats.timer_flushes == timers + 1


async def test_holding_stops_while_the_hold_timer_buys_nothing_and_resumes_when_it_would(kind: str) -> None:
    """Responses slower than ``hold`` (LLM streams are seconds long): every held batch leaves on
    its timer, a wake of its own.  After ``HOLD_CREDIT`` of those the hub sends in the change's
    own wake; a change that then follows a batch within ``hold`` from a later wake (a hold
    would have merged them) brings holding back."""
    async with mesh(["a", "b"], kind=kind, hold=0.2) as (a, b):
        loop = asyncio.get_running_loop()
        a.hub._hold_credit = HOLD_CREDIT  # the mesh's start-up resync batch may have spent one
        timers = a.hub.stats.timer_flushes
        for i in range(HOLD_CREDIT):
            await until(lambda: loop.time() - a.hub._last_flush > a.hub.gap, 5, what="the gap passed")
            a.counter.count("e1")
            assert a.hub._holding
            await until(lambda: b.counter.total("e1") == i + 1, 5, what="b sees the held batch")  # noqa: B023
        assert a.hub.stats.timer_flushes - timers == HOLD_CREDIT and a.hub._hold_credit == 0
        await until(lambda: loop.time() - a.hub._last_flush > a.hub.gap, 5, what="the gap passed")
        a.counter.count("e1")
        assert not a.hub._holding and type(a.hub._scheduled) is not asyncio.TimerHandle
        await until(lambda: a.hub._scheduled is None and not a.hub._same_wake, 5, what="sent, wake over")
        a.counter.count("e2")  # a later wake, within hold of the batch just sent
        assert a.hub._hold_credit == HOLD_CREDIT
        await until(lambda: b.counter.total("e2") == 1, 5, what="b sees it")
        await until(lambda: loop.time() - a.hub._last_flush > a.hub.gap, 5, what="the gap passed")
        a.counter.count("e1")
        assert a.hub._holding


async def test_with_no_peers_changes_wait_for_the_tick(kind: str) -> None:
    """A lone replica (peers configured, none but itself) pays no timer or send per change;
    the heartbeat tick drains, so what a peer that lists us hears is at most a tick old."""
    async with mesh(["a"], kind=kind) as (a,):
        assert not a.hub.transport.has_peers
        a.counter.count("e1")
        assert a.hub._scheduled is None
        await until(lambda: not a.counter._changed, 5, what="drained by the tick")


def test_every_shipped_replicated_plugin_says_when_it_changed() -> None:
    """With only shipped plugins the hub needs no drain cadence: its tick is heartbeats and
    liveness (~10 a second), not a 5 ms poll that drains every plugin (bench/scaleout, cost)."""
    hub = SyncHub("x", ZmqTransport("127.0.0.1", 0))
    try:
        plugins = [
            build(InFlightLoadProducer, name="load"),
            build(ApproxPrefixCacheProducer, name="approx"),
            build(SessionAffinityFilter, name="pin", strategy="session_id"),
            build(SessionAffinityScorer, name="aff", algorithm="session_id_header"),
            build(PrecisePrefixCacheScorer, name="precise", **PRECISE),
        ]
        hub.bind(plugins)
        assert len(hub.plugins) == len(plugins)
        assert not hub._polled
        assert all(getattr(p, "sync_dirty", None) == hub.dirty for p in plugins)
    finally:
        hub.transport.close()


async def test_plugins_without_a_dirty_hook_are_drained_on_the_poll_cadence(kind: str) -> None:
    async with mesh(["a", "b"], kind=kind) as (a, b):
        pa, pb = PolledCounter("polled"), PolledCounter("polled")
        a.hub.bind([a.counter, pa])
        b.hub.bind([b.counter, pb])
        assert a.hub.poll == DEFAULT_POLL
        ticks = a.hub.ticks
        pa.count("e", 2)
        await until(lambda: pb.learned.get("a") == {"e": 2}, 5, what="b learns a's polled counter")
        assert a.hub.ticks > ticks  # drained by a tick, not by a dirty() call


async def test_interval_caps_the_batch_rate(kind: str) -> None:
    async with mesh(["a", "b"], kind=kind, interval=0.2) as (a, b):
        sent = a.hub.stats.sent
        loop = asyncio.get_running_loop()
        started = loop.time()
        while loop.time() - started < 0.5:  # changes every tick for half a second
            a.counter.count("e")
            await asyncio.sleep(0)
        await until(lambda: b.counter.total("e") == a.counter.own["e"], 5, what="b catches up")
        assert a.hub.stats.sent - sent <= 4  # ~0.5 s / 0.2 s, plus the one that caught up


async def test_silent_peer_is_forgotten_then_reapplied_when_back(kind: str) -> None:
    async with mesh(["a", "b"], kind=kind) as (a, b):
        a.counter.count("e1", 4)
        await until(lambda: b.counter.total("e1") == 4, 5, what="b learns a")
        port = a.hub.transport.port
        with structlog.testing.capture_logs() as logs:
            await a.hub.stop(goodbye=False)  # as a crash: no goodbye
            await until(lambda: "a" not in b.counter.learned, 5, what="b forgets silent a")
            assert b.hub.stats.forgotten == 1
            await until(lambda: b.hub.partitioned, 5, what="b partitioned")
            assert REGISTRY.get_sample_value("epp_sync_partitioned") == 1
            ticks = b.hub.ticks
            # several liveness checks while partitioned (the tick is 75-100 ms): still logged once
            await until(lambda: b.hub.ticks > ticks + 5, 10, what="more ticks while partitioned")
            again = make_node(
                "a", port=port, kind=kind
            )  # restarted under the same id: its sequence starts over
            again.peers.set([b.peer])
            await again.hub.start(again.peers)
            try:
                await until(lambda: not b.hub.partitioned, 5, what="partition healed")
                again.counter.count("e1", 7)
                await until(lambda: b.counter.learned.get("a") == {"e1": 7}, 5, what="a re-applied")
                # read before a stops again: its goodbye leaves b alone, partitioned anew (a second
                # log line when b applied it before the capture ended, as under a loaded suite)
                events = [e["event"] for e in logs]
            finally:
                await again.hub.stop()
        assert events.count("sync_partitioned") == 1
        assert events.count("sync_partition_healed") == 1


@contextlib.contextmanager
def lost_in_transit(node: Node) -> Iterator[list[bytes]]:
    """Every message ``node`` publishes meanwhile is lost after it leaves (its sequence moves on)."""
    transport = node.hub.transport
    lost: list[bytes] = []

    def drop(frame: bytes) -> bool:
        lost.append(frame)
        return True

    transport.send = drop  # type: ignore[method-assign]
    try:
        yield lost
    finally:
        del transport.send  # the instance attribute goes; the class's method is back


async def test_counts_lost_in_transit_come_back_whole_when_the_receiver_sees_the_gap(kind: str) -> None:
    """Deltas are idempotent per key, but a key whose delta was lost stays wrong on the peer until
    it changes again; the receiver sees the gap in the sender's sequence and asks it to resend."""
    async with mesh(["a", "b"], kind=kind) as (a, b):
        a.counter.count("e1")
        await until(lambda: b.counter.learned.get("a") == {"e1": 1}, 5, what="b learns a")
        resends = a.hub.stats.resends
        with lost_in_transit(a) as lost:
            a.counter.count("e1", 2)
            a.counter.count("e2")
            a.hub.flush()
        assert lost and b.counter.learned["a"] == {"e1": 1}
        a.counter.count("e3")  # arrives: b sees the gap, asks, a resends e1 and e2 too
        await until(lambda: b.counter.learned.get("a") == {"e1": 3, "e2": 1, "e3": 1}, 5, what="repaired")
        assert a.hub.stats.resends > resends and b.hub.stats.resyncs_asked >= 1
        assert a.hub.debug_state()["batches"]["resends"] == a.hub.stats.resends


async def test_a_returning_peers_unchanged_counts_come_back(kind: str) -> None:
    """A peer silent past the timeout is forgotten; when it is heard again, its counts that did
    not change meanwhile come back too (before, only the ones that changed did)."""
    async with mesh(["a", "b"], kind=kind) as (a, b):
        a.counter.count("e1", 4)
        await until(lambda: b.counter.learned.get("a") == {"e1": 4}, 5, what="b learns a")
        with lost_in_transit(a):
            await until(lambda: "a" not in b.counter.learned, 5, what="b forgets silent a")
        await until(lambda: b.counter.learned.get("a") == {"e1": 4}, 5, what="a's count back, unchanged")


async def test_resends_are_at_most_one_per_interval_and_the_last_request_is_honoured(kind: str) -> None:
    async with mesh(["a"], kind=kind) as (a,):
        await until(lambda: a.hub.stats.resends == 0, 1, what="no peer yet")
        a.hub._resend()
        a.hub._resend()  # within RESYNC_EVERY: put off, not dropped
        a.hub._resend()
        assert a.hub.stats.resends == 1
        await until(lambda: a.hub.stats.resends == 2, 5, what="the put-off resend")
        assert a.hub._resend_timer is None


async def test_a_replica_that_stops_cleanly_is_forgotten_at_once(kind: str) -> None:
    """A goodbye on stop: peers drop its in-flight contributions now, not after their liveness
    timeout (60 s here, so only the goodbye can explain it), and no longer list it as a peer."""
    async with mesh(["a", "b", "c"], kind=kind, timeout=60.0) as (a, b, c):
        a.counter.count("e1", 4)
        await until(lambda: b.counter.total("e1") == 4 and c.counter.total("e1") == 4, 5, what="b, c learn a")
        await until(lambda: set(b.hub.debug_state()["peers"]) == {"a", "c"}, 5, what="b hears a and c")
        with structlog.testing.capture_logs() as logs:
            await a.hub.stop()
            await until(
                lambda: "a" not in b.counter.learned and "a" not in c.counter.learned, 5, what="a forgotten"
            )
        assert b.hub.stats.goodbyes == 1 and c.hub.stats.goodbyes == 1
        assert b.hub.stats.rejected == {}  # the goodbye is not an unknown key
        state = b.hub.debug_state()
        assert "a" not in state["peers"] and "c" in state["peers"]
        assert state["batches"]["goodbyes"] == 1 and b.hub.connected == 1
        assert [e.get("reason") for e in logs if e["event"] == "sync_peer_forgotten"] == ["said goodbye"] * 2


async def test_debug_state_counts_batches_and_reads() -> None:
    async with mesh(["a", "b"]) as (a, b):
        before = b.hub.debug_state()
        a.counter.count("e1", 2)
        await until(lambda: b.counter.total("e1") == 2, 5, what="b learns a")
        after = b.hub.debug_state()
        assert after["replicaId"] == "b" and after["serving"] and not after["partitioned"]
        assert after["keys"] == ["test-routed-counter/counter"]
        assert after["batches"]["received"] == before["batches"]["received"] + 1
        reads = after["reads"]
        assert reads["messages"] > before["reads"]["messages"]  # heartbeats count too
        assert reads["woken"] + reads["timer"] + reads["riding"] >= 1
        assert after["peers"]["a"]["lastHeardSecondsAgo"] < 1.0 and not after["peers"]["a"]["silent"]
        sent = a.hub.debug_state()["batches"]
        assert sent["sent"] >= 1 and sent["holdsJoined"] + sent["timerFlushes"] >= 1


def _bytes(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def test_batch_bytes_are_counted_once_each_way(kind: str) -> None:
    """What a replica sent, its peer received: the same bytes on both sides (heartbeats in
    neither), in the hub's counts, its debug state and the process's counters."""
    sent0 = _bytes("epp_sync_batch_bytes_sent_total")
    received0 = _bytes("epp_sync_batch_bytes_received_total")
    async with mesh(["a", "b"], kind=kind) as (a, b):
        a.counter.count("e1", 2)
        b.counter.count("e2", 1)
        await until(lambda: b.counter.total("e1") == 2 and a.counter.total("e2") == 1, 5, what="both learn")
        sa, sb = a.hub.stats, b.hub.stats

        def settled() -> bool:  # checked in one go: a resync may still send a batch meanwhile
            sent = _bytes("epp_sync_batch_bytes_sent_total") - sent0
            received = _bytes("epp_sync_batch_bytes_received_total") - received0
            return (
                sa.bytes_sent == sb.bytes_received
                and sb.bytes_sent == sa.bytes_received
                and sent == received == sa.bytes_sent + sb.bytes_sent
            )

        await until(settled, 5, what="every batch sent arrived, counted alike")
        assert sa.bytes_sent > 0 and sb.bytes_sent > 0
        state = a.hub.debug_state()["batches"]
        assert (state["bytesSent"], state["bytesReceived"]) == (sa.bytes_sent, sa.bytes_received)


async def test_a_routing_receiver_applies_peers_deltas_without_its_read_timer_firing() -> None:
    """While a replica routes (the ext_proc edge calls ``ride`` on every read, here every 1 ms),
    a peer's deltas are applied in those wakes: after the two reads that find the peer busy, the
    descriptor is not watched and the read timer, put off by every ride, never fires (counted in
    the debug state, not timed).  Once routing stops, the timer is the backstop again."""
    gap = 0.2  # 200 rides per gap: only a loop stalled for 0.2 s could let the timer fire
    async with mesh(["a", "b"], read_gap=gap) as (a, b):
        b.hub.read_budget = 60.0  # a batch read late (slow machine) must not send b back to its descriptor
        routing = asyncio.Event()
        routing.set()

        async def route() -> None:
            while routing.is_set():
                b.hub.transport.ride()
                await asyncio.sleep(0.001)

        before = b.hub.debug_state()["reads"]
        task = asyncio.create_task(route())
        try:
            for i in range(60):
                a.counter.count("e1")
                await asyncio.sleep(0.004)  # a batch every ~4 ms: the peer keeps sending
                if i == 1:  # two reads with messages: b is busy from here on
                    await until(lambda: b.counter.total("e1") == 2, 5, what="b learns the first two")
            await until(lambda: b.counter.total("e1") == 60, 5, what="b learns every change")
            during = b.hub.debug_state()["reads"]
        finally:
            routing.clear()
            await task
        assert during["timerWakes"] == before["timerWakes"] == 0
        assert during["woken"] - before["woken"] <= 2  # only before b knew a was busy
        assert during["routing"] - before["routing"] >= 20  # the rest rode on b's requests' wakes
        a.counter.count("e1")  # b idle now: the timer (or the descriptor after it) still reads
        await until(lambda: b.counter.total("e1") == 61, 5, what="b learns the change while idle")
        assert b.hub.debug_state()["reads"]["timerWakes"] >= 1


async def test_warm_start_restores_a_serving_peers_view_before_serving(kind: str) -> None:
    async with mesh(["a", "b"], kind=kind) as (a, b):
        a.counter.count("e1", 2)
        b.counter.count("e2", 5)
        await until(lambda: a.counter.total("e2") == 5, 5, what="a learns b")
        c = make_node("c", warm_start_timeout=5, kind=kind)
        c.peers.set([a.peer])
        assert not c.counter.learned
        try:
            await c.hub.start(c.peers)
            assert c.hub.serving and c.hub.restored_from == "a"
            # restored before serving: no waiting for deltas
            assert c.counter.learned["b"] == {"e2": 5}
            assert c.counter.learned[SNAPSHOT_ORIGIN] == {"e1": 2}
        finally:
            await c.hub.stop()


def refused() -> float:
    return REGISTRY.get_sample_value("epp_sync_rejected_total", {"reason": "unauthenticated"}) or 0.0


async def test_a_snapshot_goes_only_to_a_replica_presenting_the_secret(kind: str) -> None:
    """The snapshot is the whole routing state: with a secret, a request without one of its
    secrets gets no answer (counted), so such a replica starts cold; one presenting it warms."""
    right, wrong = PeerSecret((b"right-secret-0123456789",)), PeerSecret((b"wrong-secret-0123456789",))
    async with mesh(["a"], kind=kind, secrets=[right]) as (a,):
        a.counter.count("e1", 2)
        for secret, restored in ((None, ""), (wrong, ""), (right, "a")):
            c = make_node("c", warm_start_timeout=0.5, kind=kind, secret=secret)
            c.peers.set([a.peer])
            before = refused()
            try:
                await c.hub.start(c.peers)
                assert c.hub.restored_from == restored, secret
                assert refused() > before or restored  # HTTP/2: the call refused; ZMQ: the request
                assert (SNAPSHOT_ORIGIN in c.counter.learned) == bool(restored)
            finally:
                await c.hub.stop(goodbye=False)


async def test_no_peer_reachable_starts_cold_within_the_bound(kind: str) -> None:
    lonely = make_node("x", warm_start_timeout=0.3, kind=kind)
    lonely.peers.set([lonely.peer.__class__(id="gone", host="127.0.0.1", port=1)])
    loop = asyncio.get_running_loop()
    started = loop.time()
    with structlog.testing.capture_logs() as logs:
        await lonely.hub.start(lonely.peers)
    try:
        assert lonely.hub.serving and not lonely.hub.restored_from
        assert 0.3 <= loop.time() - started < 2
        assert [e for e in logs if e["event"] == "sync_cold_start"]
    finally:
        await lonely.hub.stop()


async def test_full_queue_drops_are_counted_and_never_block_the_sender() -> None:
    tx = make_node("tx", hwm=2)
    rx = make_node("rx", hwm=2)
    tx.hub._tasks.append(asyncio.get_running_loop().create_task(asyncio.sleep(3600)))  # "running"
    rx.hub.transport.set_peers([tx.peer])
    try:
        await _until_subscribed(tx, rx)
        payload = "x" * 100_000
        for i in range(500):  # rx reads nothing meanwhile: its queue and the socket buffers fill up
            tx.counter.count(f"{payload}{i % 3}")
            tx.hub.flush()
        last = tx.hub._seq
        assert isinstance(rx.hub.transport, ZmqTransport)
        sub = rx.hub.transport._sub
        assert sub is not None
        while rx.hub._last_seq.get("tx", 0) <= last:  # rx catches up; tx's next message shows the gap
            if await sub.poll(50):
                rx.hub.on_frames(await rx.hub.transport.recv())
            else:
                tx.hub._publish({})
        assert rx.hub.stats.dropped > 0
        assert len(rx.counter.learned["tx"]) == 3  # what did arrive is applied
        tx.counter.count("final")
        tx.hub.flush()
        while "final" not in rx.counter.learned["tx"]:
            rx.hub.on_frames(await asyncio.wait_for(rx.hub.transport.recv(), 5))
    finally:
        for task in tx.hub._tasks:
            task.cancel()
        tx.hub._tasks.clear()
        await tx.hub.stop()
        await rx.hub.stop()


async def _until_subscribed(tx: Node, rx: Node) -> None:
    """Heartbeats until rx receives one (a PUB drops everything until the SUB has connected)."""
    assert isinstance(rx.hub.transport, ZmqTransport)
    sub = rx.hub.transport._sub
    assert sub is not None
    for _ in range(100):
        tx.hub._publish({})
        if await sub.poll(50):  # bounded wait for the probe, not a fixed sleep
            rx.hub.on_frames(await rx.hub.transport.recv())
            return
    raise AssertionError("rx never subscribed")


async def test_hostile_peer_frames_are_counted_and_ignored() -> None:
    async with mesh(["b"], max_message_bytes=4096) as (b,):
        ctx = zmq.asyncio.Context()
        evil = ctx.socket(zmq.PUB)
        evil.setsockopt(zmq.LINGER, 0)
        port = evil.bind_to_random_port("tcp://127.0.0.1")
        try:
            b.hub.transport.set_peers([*b.hub.transport.peers, b.peer.__class__("evil", "127.0.0.1", port)])
            seq = 0

            async def good(count: int) -> None:
                nonlocal seq
                seq += 1
                await evil.send(
                    encode_batch("evil", seq, 0.0, {"test-routed-counter/counter": [["e", count]]})
                )

            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5
            while b.counter.learned.get("evil") is None and loop.time() < deadline:
                await good(1)  # until the SUB has connected (PUB drops before)
                await asyncio.sleep(0.02)  # pacing the probe against the SUB's connect
            assert b.counter.learned["evil"] == {"e": 1}
            rejected = dict(b.hub.stats.rejected)
            await evil.send(b"\xc1 not msgpack")
            await evil.send(encode([1, 2, 3]))
            await evil.send(encode(["evil", "seq", 0.0, {}]))
            await evil.send_multipart([b"a", b"b"])
            await evil.send(encode(["evil", seq + 1, 0.0, {"nope": [1]}]))
            await evil.send(encode(["evil", seq + 2, 0.0, {"test-routed-counter/counter": [["e", "NaN"]]}]))
            await evil.send(b"\x00" * 6000)  # over max_message_bytes: counted
            seq += 2
            await until(
                lambda: sum(b.hub.stats.rejected.values()) - sum(rejected.values()) >= 7, 5, what="counted"
            )
            got = b.hub.stats.rejected
            for reason in ("decode", "type", "frames", "unknown_key", "apply", "too_large"):
                assert got.get(reason, 0) > rejected.get(reason, 0), reason
            await evil.send(b"\x00" * 20000)  # over twice that: ZMQ drops the connection
            deadline = loop.time() + 5
            while b.counter.learned.get("evil") != {"e": 9} and loop.time() < deadline:
                await good(9)  # still serving: a good batch applies after the garbage
                await asyncio.sleep(0.02)
            assert b.counter.learned["evil"] == {"e": 9}
            assert isinstance(b.hub.transport, ZmqTransport)
            assert b.hub.transport.redials >= 1  # the oversized frame cut the connection; re-dialled
        finally:
            evil.close(0)
            ctx.term()


async def test_hostile_snapshot_requests_are_ignored(kind: str) -> None:
    async with mesh(["b"], kind=kind) as (b,):
        if kind == "h2":  # a Snapshot call each on the sync port: refused with no message, or answered
            port, loop = b.hub.transport.port, asyncio.get_running_loop()
            replies = []
            for request in (b"garbage", encode(["someone"])):
                _, client = await loop.create_connection(
                    lambda: UnaryClient(SNAPSHOT_PATH, b"b", max_response=1 << 20), "127.0.0.1", port
                )
                assert client.send(request)
                replies.append(await asyncio.wait_for(client.response, 5))
                client.close()
            assert replies[0] is None and replies[1]
            assert sum(b.hub.stats.rejected.values()) == 1
            return
        ctx = zmq.asyncio.Context()
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(f"tcp://127.0.0.1:{b.hub.transport.port + 1}")
        try:
            await dealer.send(b"garbage")
            await dealer.send(encode(["someone"]))
            reply = await asyncio.wait_for(dealer.recv(), 5)  # only the well-formed one is answered
            assert reply
            assert sum(b.hub.stats.rejected.values()) == 1
        finally:
            dealer.close(0)
            ctx.term()


async def test_rebind_on_reload_keeps_a_surviving_keys_view(kind: str) -> None:
    async with mesh(["a", "b"], kind=kind) as (a, b):
        a.counter.count("e1", 3)
        await until(lambda: b.counter.total("e1") == 3, 5, what="b learns a")
        fresh = make_counter()  # the reload built a new instance under the same key
        b.hub.bind([fresh])
        assert fresh.learned["a"] == {"e1": 3}
        a.counter.count("e1", 1)
        await until(lambda: fresh.learned["a"] == {"e1": 4}, 5, what="deltas reach the new instance")


def test_bind_skips_plugins_configured_not_to_share_and_drains_the_rest_once() -> None:
    hub = SyncHub("x", ZmqTransport("127.0.0.1", 0))
    try:
        shared, private = make_counter("shared"), make_counter("private")
        private.replicated = False  # type: ignore[attr-defined]  # e.g. syncCrossReplicaState: false
        shared.count("e")  # before wiring: not a change to publish
        hub.bind([shared, private, object()])
        assert sorted(hub.plugins) == ["test-routed-counter/shared"]
        assert shared.drain() == []  # the hub's first drain started recording from here
    finally:
        hub.transport.close()


async def test_a_batch_read_past_the_read_budget_makes_the_receiver_prompt() -> None:
    """The hub asks its transport to read at once when a batch it applies is older than
    ``read_budget`` (decision -> read), and not when every batch is fresh."""
    node = make_node("rx")
    now = 1000.0
    node.hub._wall = lambda: now
    node.hub._loop = asyncio.get_running_loop()
    prompts: list[int] = []
    node.hub.transport.prompt = lambda: prompts.append(1)  # type: ignore[method-assign]
    try:
        key = node.counter.sync_key
        fresh = now - node.hub.read_budget / 2
        node.hub.on_messages([[encode_batch("tx", 1, fresh, {key: [["e1", 1]]})]])
        assert prompts == [] and node.counter.learned["tx"] == {"e1": 1}
        late = now - node.hub.read_budget * 2
        node.hub.on_messages(
            [
                [encode_batch("tx", 2, fresh, {key: [["e1", 2]]})],
                [encode_batch("tx", 3, late, {key: [["e1", 3]]})],
            ]
        )
        assert prompts == [1] and node.counter.learned["tx"] == {"e1": 3}
        node.hub.on_messages([[encode_batch("tx", 4, late, {})]])  # a heartbeat carries no decision
        assert prompts == [1]
    finally:
        node.hub.transport.close()


async def test_the_gap_is_the_siblings_while_every_peer_is_a_worker_of_this_pod() -> None:
    """Workers of one pod share its cores: between them alone a batch waits ``sibling_coalesce``;
    a peer from elsewhere (another pod, discovered later) brings the ordinary gap back."""
    sibling = Peer("w1", "127.0.0.1", 9006)
    other = Peer("pod-b", "10.0.0.2", 9004)
    transport = ZmqTransport("127.0.0.1", 0)
    hub = SyncHub("w0", transport, coalesce=0.003, sibling=lambda p: p == sibling, sibling_coalesce=0.006)
    transport.bind()
    try:
        hub._set_peers((sibling,))
        assert hub.gap == 0.006
        hub._set_peers((sibling, other))
        assert hub.gap == 0.003
        hub._set_peers(())
        assert hub.gap == 0.003  # nobody: nothing to coalesce for
        interval = SyncHub("w0", transport, interval=0.2, sibling=lambda p: True)
        interval._set_peers((sibling,))
        assert interval.gap == 0.2  # crossReplicaSyncInterval wins
    finally:
        transport.close()
