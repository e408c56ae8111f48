"""The sync transport over HTTP/2 (``epp.server.peering.H2Transport``): what ZMQ did for the hub.

The hub's own behaviour on this transport (deltas, silence, goodbye, warm start, reloads) is
tests/sync/test_hub.py, run on both transports; here: what only this transport does — a
hostile peer on the sync port, a peer that stops reading, re-dialling, dropped peers, the
shared secret a peer must present (``--peer-secret-file``), and a large snapshot on the sync port.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from epp.server.h2.client import StreamClient
from epp.server.peering import PUBLISH_PATH, H2Transport
from epp.sync.peers import Peer
from epp.sync.secret import PeerSecret
from epp.sync.wire import encode, encode_batch
from epp.testing.replicated import SNAPSHOT_ORIGIN
from epp.testing.waiting import until
from tests.sync.conftest import Node, make_node, mesh

KEY = "test-routed-counter/counter"


@contextlib.asynccontextmanager
async def publisher(port: int, authorization: bytes = b"") -> AsyncIterator[StreamClient]:
    """A raw client of a node's sync port: what a hostile (or broken) peer can send."""
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(
        lambda: StreamClient(PUBLISH_PATH, b"evil", authorization=authorization), "127.0.0.1", port
    )
    try:
        yield client
    finally:
        client.close()


def transport(node: Node) -> H2Transport:
    t = node.hub.transport
    assert isinstance(t, H2Transport)
    return t


async def test_hostile_peer_messages_are_counted_and_a_good_one_still_applies() -> None:
    async with (
        mesh(["b"], kind="h2", max_message_bytes=4096) as (b,),
        publisher(b.hub.transport.port) as evil,
    ):
        assert evil.send(encode_batch("evil", 1, 0.0, {KEY: [["e", 1]]}))
        await until(lambda: b.counter.learned.get("evil") == {"e": 1}, 5, what="a good batch applied")
        rejected = dict(b.hub.stats.rejected)
        for garbage in (
            b"\xc1 not msgpack",
            encode([1, 2, 3]),
            encode(["evil", "seq", 0.0, {}]),
            encode(["evil", 2, 0.0, {"nope": [1]}]),
            encode(["evil", 3, 0.0, {KEY: [["e", "NaN"]]}]),
            b"\x00" * 6000,  # over max_message_bytes: the hub counts it
        ):
            assert evil.send(garbage)
        await until(
            lambda: sum(b.hub.stats.rejected.values()) - sum(rejected.values()) >= 6, 5, what="counted"
        )
        got = b.hub.stats.rejected
        for reason in ("decode", "type", "unknown_key", "apply", "too_large"):
            assert got.get(reason, 0) > rejected.get(reason, 0), reason
        # Over twice max_message_bytes: the server ends the call unread (RESOURCE_EXHAUSTED); the
        # peer's next message opens a new call on the same connection and is applied.
        assert evil.send(b"\x00" * 9000)
        await until(lambda: not evil.in_call, 5, what="the server ended the call")
        assert evil.send(encode_batch("evil", 4, 0.0, {KEY: [["e", 9]]}))
        await until(lambda: b.counter.learned.get("evil") == {"e": 9}, 5, what="applied after the refusal")
        assert evil.calls == 2 and evil.connected


async def test_a_peer_that_stops_reading_never_blocks_the_sender_and_its_losses_are_counted() -> None:
    """A server that accepts and never reads: the socket's buffer fills, then the client's queue,
    then ``send`` refuses and the hub counts the drops; nothing blocks and memory stays bounded."""
    stalled: list[asyncio.Transport] = []

    class Mute(asyncio.Protocol):
        def connection_made(self, t: asyncio.BaseTransport) -> None:
            assert isinstance(t, asyncio.Transport)
            t.pause_reading()
            stalled.append(t)

    loop = asyncio.get_running_loop()
    server = await loop.create_server(Mute, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    tx = make_node("tx", kind="h2", hwm=4)
    tx.hub._tasks.append(loop.create_task(asyncio.sleep(3600)))  # "running": flush publishes
    tx.hub.transport.set_peers([Peer("mute", "127.0.0.1", port)])
    try:
        await until(lambda: transport(tx).connected == 1, 5, what="dialled")
        payload = "x" * 50_000
        i = 0
        while tx.hub.stats.dropped == 0 and i < 2000:
            tx.counter.count(f"{payload}{i}")
            tx.hub.flush()
            i += 1
        assert tx.hub.stats.dropped > 0, "a peer that never reads must make sends refuse"
        link = transport(tx)._links[Peer("mute", "127.0.0.1", port)]
        assert link.client is not None and link.client.refused > 0
        assert len(link.client._queue) <= 4  # the queue is bounded by hwm
    finally:
        for task in tx.hub._tasks:
            task.cancel()
        tx.hub._tasks.clear()
        await tx.hub.stop(goodbye=False)
        server.close()
        for t in stalled:
            t.close()


async def test_a_dropped_peer_is_hung_up_on_and_a_returning_one_redialled() -> None:
    async with mesh(["a", "b"], kind="h2") as (a, b):
        ta = transport(a)
        await until(lambda: ta.connected == 1, 5, what="a dialled b")
        a.hub.transport.set_peers([])
        assert not ta.has_peers and ta.connected == 0
        await until(lambda: not transport(b)._server.connections, 5, what="b sees a hang up")
        a.hub.transport.set_peers([b.peer])
        await until(lambda: ta.connected == 1, 5, what="a dialled b again")
        a.counter.count("e1", 2)
        await until(lambda: b.counter.learned.get("a") == {"e1": 2}, 5, what="deltas flow again")


async def test_a_message_to_a_peer_not_yet_up_is_dropped_not_queued() -> None:
    """As a ZMQ PUB: nothing waits for a peer that is not connected (its sequence shows the gap)."""
    tx = make_node("tx", kind="h2")
    loop = asyncio.get_running_loop()
    tx.hub._tasks.append(loop.create_task(asyncio.sleep(3600)))
    tx.hub.transport.set_peers([Peer("down", "127.0.0.1", 9)])  # discard port: nobody listens
    try:
        assert tx.hub.transport.send(b"anything")  # not refused: there is no connection to queue on
        assert transport(tx).connected == 0
    finally:
        for task in tx.hub._tasks:
            task.cancel()
        tx.hub._tasks.clear()
        await tx.hub.stop(goodbye=False)


S1 = b"first-secret-0123456789"
S2 = b"second-secret-0123456789"


async def test_with_a_secret_only_a_peer_presenting_one_publishes() -> None:
    """Replicas sharing a secret sync; a caller without it, or with another, is refused
    UNAUTHENTICATED, counted, told to go away, and nothing it sent is applied."""
    async with mesh(["a", "b"], kind="h2", secrets=[PeerSecret((S1,)), PeerSecret((S1,))]) as (a, b):
        a.counter.count("e1", 2)
        await until(lambda: b.counter.learned.get("a") == {"e1": 2}, 5, what="peers with the secret sync")
        tb = transport(b)
        for authorization in (b"", b"Bearer " + S2, S1, b"Bearer " + S1[:-1]):
            before = tb.unauthenticated
            async with publisher(tb.port, authorization) as evil:
                await until(lambda: evil.connected, 5, what="connected")
                assert evil.send(encode_batch("evil", 1, 0.0, {KEY: [["e", 1]]}))
                await until(lambda e=evil: not e.connected, 5, what="refused and sent away")  # type: ignore[misc]
            assert tb.unauthenticated == before + 1, authorization
        assert "evil" not in b.counter.learned
        assert b.hub.stats.rejected.get("unauthenticated", 0) == 0  # the transport counts calls, not the hub
        async with publisher(tb.port, b"Bearer " + S1) as friend:
            assert friend.send(encode_batch("friend", 1, 0.0, {KEY: [["e", 7]]}))
            await until(
                lambda: b.counter.learned.get("friend") == {"e": 7}, 5, what="a caller with it publishes"
            )
            assert friend.connected and friend.calls == 1


async def test_a_rotated_secret_reauthenticates_every_connection() -> None:
    """Add the new secret everywhere, present it, drop the old: no step partitions the pair, and
    a dropped secret stops working at once (its calls were authenticated against the old set)."""
    sa, sb = PeerSecret((S1,)), PeerSecret((S1,))
    async with mesh(["a", "b"], kind="h2", secrets=[sa, sb]) as (a, b):
        ta, tb = transport(a), transport(b)
        sent = 0

        async def flows() -> None:
            nonlocal sent
            sent += 1
            a.counter.count("e", 1)
            await until(lambda: b.counter.learned.get("a") == {"e": sent}, 5, what=f"delta {sent} applied")

        await flows()
        for step in ((S1, S2), (S2, S1), (S2,)):  # add, present, drop: b then a at each step
            sb.set(step)
            sa.set(step)
            await until(lambda: ta.connected == 1, 5, what=f"a re-dialled b at {step}")
            await flows()
        assert tb.unauthenticated == 0  # every step kept a secret both sides accept
        sb.set((S1,))  # b alone goes back to the dropped secret: a's open call is cut at once
        await until(lambda: tb.unauthenticated > 0, 5, what="a's next call refused")
        a.counter.count("e", 1)
        await until(lambda: ta.connected == 0 or tb.unauthenticated > 1, 5, what="a refused again")
        assert b.counter.learned.get("a") in (None, {"e": sent})  # never sent + 1 (None: a forgotten, silent)


async def test_a_snapshot_of_megabytes_comes_whole_over_the_sync_port() -> None:
    """The warm start's snapshot is a unary call on the sync port: an answer far beyond the
    default windows and frame size arrives whole, paced by the asker's credits."""
    async with mesh(["a"], kind="h2") as (a,):
        for i in range(60_000):
            a.counter.own[f"endpoint-{i:06d}"] = i  # no deltas: the snapshot alone carries them
        c = make_node("c", kind="h2", warm_start_timeout=10)
        c.peers.set([a.peer])
        try:
            await c.hub.start(c.peers)
            assert c.hub.restored_from == "a"
            assert c.counter.learned[SNAPSHOT_ORIGIN] == a.counter.own
        finally:
            await c.hub.stop(goodbye=False)


async def test_a_peer_that_hangs_holds_up_only_its_own_asking() -> None:
    """A starting replica asks a peer that accepts and never answers, and one starting too:
    it still sees the second say "starting" twice and starts cold after the grace, not at the
    warm-start deadline."""
    accepted: list[asyncio.StreamWriter] = []

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # reads nothing, answers nothing

    hung = await asyncio.start_server(mute, "127.0.0.1", 0)
    hung_port = hung.sockets[0].getsockname()[1]
    starting = make_node("starting", kind="h2", warm_start_timeout=10)
    starting.peers.set([Peer("hung", "127.0.0.1", hung_port)])
    warming = asyncio.create_task(starting.hub.start(starting.peers))  # not serving for 10 s
    c = make_node("c", kind="h2", warm_start_timeout=10)
    c.peers.set([Peer("hung", "127.0.0.1", hung_port), starting.peer])
    loop = asyncio.get_running_loop()
    began = loop.time()
    try:
        await c.hub.start(c.peers)
        assert c.hub.serving and not c.hub.restored_from
        assert loop.time() - began < 3  # the grace (0.3 s) and a retry, far from the 10 s deadline
        assert accepted  # the hung peer was asked
    finally:
        await c.hub.stop(goodbye=False)
        warming.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await warming
        await starting.hub.stop(goodbye=False)
        hung.close()
        for w in accepted:
            w.close()
