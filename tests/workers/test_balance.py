"""``epp.workers.balance``: where a worker's accepted connection goes, and the handover itself.

The handover runs on real sockets: a TCP connection accepted in one place crosses a Unix
datagram socket as a descriptor and is served by the other side, bytes and all.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.server.h2 import H2GrpcServer
from epp.server.health import HealthServicer
from epp.workers.balance import CLOSED, SLOTS_FILE, STALE_NS, ConnectionBalance, Slots, should_retire, target
from epp.workers.role import WorkerRole
from tests.server.test_h2grpc import EchoServicer, raw_stream


def test_target_is_the_worker_holding_the_fewest_and_itself_on_a_tie() -> None:
    assert target([0, 0], 0) == 0
    assert target([1, 0], 0) == 1
    assert target([1, 1], 1) == 1
    assert target([3, 1, 2], 2) == 1
    assert target([2, 1, 1], 0) == 1  # the first of the least loaded
    assert target([1, 1, 0], 1) == 2


def test_between_workers_holding_as_many_the_markedly_quieter_one_gets_it() -> None:
    assert target([1, 1], 0, [1000, 500]) == 1  # half the streams a second
    assert target([1, 1], 0, [1000, 900]) == 0  # within 20%: no handover for noise
    assert target([1, 1, 1], 2, [300, 100, 1000]) == 1
    assert target([2, 1], 0, [10, 5000]) == 1  # the count first: fewer connections win
    assert target([1, 2], 0, [1000, 0]) == 0
    assert target([1, CLOSED], 0, [500, 0]) == 0


def test_target_never_picks_a_worker_that_takes_no_connections() -> None:
    assert target([2, CLOSED], 0) == 0  # restarting or draining
    assert target([CLOSED, 5, 7], 2) == 1


def test_should_retire_only_the_most_loaded_and_only_two_above_the_least() -> None:
    assert not should_retire([1, 0], 0)  # moving one would only swap the excess
    assert should_retire([2, 0], 0)
    assert not should_retire([2, 0], 1)
    assert not should_retire([3, 3, 0], 1)  # worker 0 gives one up, not both
    assert should_retire([3, 3, 0], 0)
    assert not should_retire([4, CLOSED], 0)  # no sibling takes connections
    assert should_retire([5, CLOSED, 3], 0)


def test_slots_are_shared_through_the_file(tmp_path: Path) -> None:
    supervisor = Slots.create(tmp_path / SLOTS_FILE, 3)
    worker = Slots(tmp_path / SLOTS_FILE, 3)
    assert worker.read() == [CLOSED] * 3
    worker.write(1, 4)
    worker.beat(1)  # its loop is alive
    assert supervisor.read() == [CLOSED, 4, CLOSED]
    supervisor.write(1, CLOSED)  # the worker died
    assert worker.read() == [CLOSED] * 3
    supervisor.close()
    worker.close()


class Holder:
    """The server side of ``placement.Holder``: what one process serves, recorded."""

    def __init__(self) -> None:
        self.adopted: asyncio.Queue[socket.socket] = asyncio.Queue()
        self.retire_calls = 0
        self.can_retire = True

    def adopt(self, sock: socket.socket) -> None:
        self.adopted.put_nowait(sock)

    def retire_one(self) -> bool:
        self.retire_calls += 1
        return self.can_retire


@pytest.fixture
async def pod(tmp_path: Path) -> AsyncIterator[tuple[Slots, list[ConnectionBalance], list[Holder]]]:
    slots = Slots.create(tmp_path / SLOTS_FILE, 2)
    # the tests call ``rebalance`` themselves: the timer's first step is an hour away
    balances = [ConnectionBalance(WorkerRole(i, 2, tmp_path, "pod"), rebalance_every=3600) for i in range(2)]
    holders = [Holder(), Holder()]
    for b, h in zip(balances, holders, strict=True):
        b.start(h)
        b.held(0)
    yield slots, balances, holders
    for b in balances:
        b.stop()
    slots.close()


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    """A real loopback TCP connection: (the client's end, the end a listener accepted)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
    return client, accepted


async def test_a_connection_accepted_by_the_busier_worker_is_served_by_the_other(
    pod: tuple[Slots, list[ConnectionBalance], list[Holder]],
) -> None:
    slots, (w0, w1), (_, h1) = pod
    w0.held(1)
    client, accepted = _tcp_pair()
    with client:
        client.sendall(b"PRI * HTTP/2.0")  # sent before the handover: it waits in the socket
        assert w0.place(accepted)
        accepted.close()  # the server closes its copy; the connection lives on in worker 1's
        async with asyncio.timeout(5):
            served = await h1.adopted.get()
        with served:
            assert served.recv(64) == b"PRI * HTTP/2.0"
            served.sendall(b"SETTINGS")
            assert client.recv(64) == b"SETTINGS"
        assert (w0.handed, w1.received) == (1, 1)
        assert slots.read() == [1, 0]  # worker 1 counts it once its server adopts it (``held``)


async def test_a_burst_accepted_by_one_worker_is_split_before_the_sibling_has_read_any(
    pod: tuple[Slots, list[ConnectionBalance], list[Holder]],
) -> None:
    """Worker 1's loop does not run while worker 0 places four connections: the ones on their way
    count as worker 1's, so worker 0 keeps every other one instead of handing all but the first."""
    slots, (w0, w1), (_, h1) = pod
    pairs = [_tcp_pair() for _ in range(4)]
    kept = 0
    for _, accepted in pairs:
        if w0.place(accepted):
            accepted.close()
        else:
            kept += 1
            w0.held(kept)  # what the server does when it adopts a connection
    assert (kept, w0.handed) == (2, 2)
    assert slots.read() == [2, 2]  # two served, two on their way
    async with asyncio.timeout(5):
        served = [await h1.adopted.get() for _ in range(2)]
    assert slots.read() == [2, 0]  # received (this test's holder does not report them as held)
    w1.held(2)
    assert slots.read() == [2, 2]
    for sock in served:
        sock.close()
    for client, accepted in pairs:
        client.close()
        accepted.close()


async def test_what_was_on_its_way_to_a_dead_worker_is_forgotten_when_it_restarts(tmp_path: Path) -> None:
    slots = Slots.create(tmp_path / SLOTS_FILE, 2)
    try:
        slots.write(0, 1)
        slots.write(1, 0)
        slots.beat(0)
        slots.beat(1)
        slots.handed(0, 1)  # in the dead worker's socket queue: closed with it
        assert slots.read() == [1, 1]
        slots.write(1, CLOSED)  # the supervisor reaps it
        assert slots.read() == [1, CLOSED]
        slots.settle(1)  # its next life, before binding its socket
        slots.write(1, 0)
        assert slots.read() == [1, 0]
    finally:
        slots.close()


async def test_a_tie_or_a_fuller_sibling_keeps_the_connection(
    pod: tuple[Slots, list[ConnectionBalance], list[Holder]],
) -> None:
    _, (w0, w1), _ = pod
    client, accepted = _tcp_pair()
    with client, accepted:
        assert not w0.place(accepted)  # 0 and 0
        w0.held(1)
        w1.held(2)
        assert not w0.place(accepted)
        assert w0.handed == 0


async def test_a_handover_to_a_sibling_that_is_gone_keeps_the_connection(
    pod: tuple[Slots, list[ConnectionBalance], list[Holder]],
) -> None:
    slots, (w0, w1), _ = pod
    w0.held(2)
    w1.stop()
    slots.write(1, 0)  # a stale slot: the supervisor has not reaped worker 1 yet
    client, accepted = _tcp_pair()
    with client, accepted:
        assert not w0.place(accepted)
        assert w0.handover_failed == 1


async def test_a_stopped_worker_is_handed_nothing(
    pod: tuple[Slots, list[ConnectionBalance], list[Holder]],
) -> None:
    slots, (w0, w1), _ = pod
    w0.held(3)
    w1.stop()
    assert slots.read() == [3, CLOSED]
    w1.held(0)  # a late count from the draining server changes nothing
    assert slots.read() == [3, CLOSED]
    client, accepted = _tcp_pair()
    with client, accepted:
        assert not w0.place(accepted)
        assert w0.handover_failed == 0  # not even tried


async def test_each_worker_publishes_its_stream_rate_for_the_others(tmp_path: Path) -> None:
    slots = Slots.create(tmp_path / SLOTS_FILE, 2)
    opened = [0]
    balance = ConnectionBalance(WorkerRole(1, 2, tmp_path, "pod"), opened=lambda: opened[0])
    try:
        balance.measure(100.0)  # the first heartbeat only starts the count
        assert slots.rates() == [0, 0]
        opened[0] = 1500
        balance.measure(101.5)
        assert slots.rates() == [0, 1000]
    finally:
        balance.stop()
        slots.close()


def test_a_worker_whose_loop_stopped_beating_is_handed_nothing(tmp_path: Path) -> None:
    slots = Slots.create(tmp_path / SLOTS_FILE, 2)
    try:
        slots.write(0, 3)
        slots.write(1, 0)
        assert slots.read() == [CLOSED, CLOSED]  # started, never beaten: not yet taking any
        now = 10 * STALE_NS
        slots.beat(0, now)
        slots.beat(1, now)
        assert slots.read(now + STALE_NS) == [3, 0]
        slots.beat(0, now + 2 * STALE_NS)  # worker 1's loop hangs; worker 0 goes on beating
        counts = slots.read(now + 2 * STALE_NS)
        assert counts == [3, CLOSED]
        assert target(counts, 0) == 0
        assert not should_retire(counts, 0)
    finally:
        slots.close()


async def test_the_most_loaded_worker_retires_a_connection_then_waits(
    pod: tuple[Slots, list[ConnectionBalance], list[Holder]],
) -> None:
    _, (w0, w1), (h0, h1) = pod
    w0.held(2)
    assert not w1.rebalance(100.0)  # the least loaded gives nothing up
    assert w0.rebalance(100.0)
    assert not w0.rebalance(104.9)  # within the retire gap: its replacement is still being placed
    assert w0.rebalance(105.0)
    h0.can_retire = False  # every connection is a prober's or retiring already
    assert not w0.rebalance(200.0)
    assert (w0.retired, h0.retire_calls, h1.retire_calls) == (2, 3, 0)
    w0.held(1)
    assert not w0.rebalance(300.0)  # 1 against 0: moving one would only swap the excess


async def test_two_servers_on_one_port_serve_two_connections_each_and_not_the_probers(tmp_path: Path) -> None:
    """Two h2 servers in this process stand for two workers: both listen on one port with
    SO_REUSEPORT, each with its worker's balance.  Four clients connecting one after another are
    served two by each, whichever accepted them, and a health prober's connection is not counted."""
    slots = Slots.create(tmp_path / SLOTS_FILE, 2)
    balances = [ConnectionBalance(WorkerRole(i, 2, tmp_path, "pod")) for i in range(2)]
    servers = [H2GrpcServer(EchoServicer(), HealthServicer(lambda: True)) for _ in range(2)]  # type: ignore[arg-type]
    port = await servers[0].start("127.0.0.1", 0, None, reuse_port=True, placement=balances[0])
    await servers[1].start("127.0.0.1", port, None, reuse_port=True, placement=balances[1])
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) for _ in range(5)]
    try:
        probe = health_pb2_grpc.HealthStub(channels[0]).Check
        assert (await probe(health_pb2.HealthCheckRequest())).status == health_pb2.HealthCheckResponse.SERVING
        for ch in channels[1:]:
            call = raw_stream(ch)()
            await call.write(b"hello")
            await call.done_writing()
            assert [m async for m in call] == [b"hello"]
        assert slots.read() == [2, 2]
        assert [s.held for s in servers] == [2, 2]
        assert sum(len(s.connections) for s in servers) == 5  # the prober's is served, not counted
        assert balances[0].handed + balances[1].handed == balances[0].received + balances[1].received
    finally:
        for ch in channels:
            await ch.close()
        for s in servers:
            await s.stop(0.0)
        slots.close()
    assert slots_closed(tmp_path) == [CLOSED, CLOSED]


def slots_closed(run_dir: Path) -> list[int]:
    """The slots as the supervisor would read them once both servers stopped."""
    slots = Slots(run_dir / SLOTS_FILE, 2)
    try:
        return slots.read()
    finally:
        slots.close()
