"""Peers' Publish connections read in the loop's other wakes while it routes
(``epp.server.quiet_reads``).

Each test drives a real hub on the HTTP/2 sync port from a raw publisher (a peer's
``StreamClient``) over loopback: the low-water mark is the kernel's, the reads are real reads of
the socket, and what they bring goes through the same HTTP/2 parsing as any read.  "Routing" is
the ext_proc edge's call after each of its reads, ``ride``, made here by the test.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from epp.server.h2.client import StreamClient
from epp.server.h2.connection import Connection
from epp.server.peering import H2Transport
from epp.server.quiet_reads import BUSY_WINDOW, BUSY_WINDOWS, QUIET_LOWAT, QuietReads
from epp.sync.wire import encode_batch
from epp.testing.waiting import until
from tests.server.test_peering import KEY, publisher
from tests.sync.conftest import Node, mesh


def transport(node: Node) -> H2Transport:
    t = node.hub.transport
    assert isinstance(t, H2Transport)
    return t


def queued(sock: socket.socket) -> int:
    """Bytes waiting in a socket's receive queue (FIONREAD), without reading them."""
    got: int = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
    return got


def low_water(sock: socket.socket) -> int:
    return int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT))


def on(quiet: QuietReads) -> bool:
    """Whether the connections are quiet (a call: mypy would narrow the attribute across calls)."""
    return quiet.quiet


def batch(seq: int, n: int) -> bytes:
    """A batch stamped now (one stamped long ago would make the hub ``prompt`` the next read)."""
    return encode_batch("p", seq, time.time(), {KEY: [["e", n]]})


def go_quiet(t: H2Transport) -> None:
    """Rides in ``BUSY_WINDOWS`` consecutive windows: the ext_proc edge of a routing replica."""
    quiet = t._quiet
    for _ in range(BUSY_WINDOWS):
        quiet._window -= BUSY_WINDOW  # the window this ride opens began a window ago
        t.ride()


@asynccontextmanager
async def one_publisher() -> AsyncIterator[tuple[Node, H2Transport, StreamClient, Connection, socket.socket]]:
    """A hub, a publisher whose first batch is applied (its Publish call open), and the server's
    side of that connection with the quiet reader's duplicate of its socket."""
    async with mesh(["b"], kind="h2") as (b,), publisher(b.hub.transport.port) as peer:
        t = transport(b)
        assert peer.send(batch(1, 1))
        await until(lambda: b.counter.learned.get("p") == {"e": 1}, 5, what="the first batch")
        ((conn, sock),) = t._quiet._socks.items()
        yield b, t, peer, conn, sock


async def test_a_replica_that_does_not_route_is_woken_per_message_as_before() -> None:
    async with one_publisher() as (b, t, peer, _, sock):
        woken = t.reads_woken
        assert not on(t._quiet) and low_water(sock) == 1
        assert peer.send(batch(2, 2))
        await until(lambda: b.counter.learned["p"] == {"e": 2}, 5, what="the second batch")
        assert t.reads_woken == woken + 1 and t.reads_timer == 0 and t._quiet._timer is None


async def test_while_routing_a_batch_waits_in_the_socket_for_a_ride_at_most_once_per_gap() -> None:
    async with one_publisher() as (b, t, peer, _, sock):
        quiet = t._quiet
        quiet.budget = 60.0  # the backstop far off: only rides read here
        go_quiet(t)
        assert on(quiet) and low_water(sock) == QUIET_LOWAT and quiet.switches == 1
        quiet.gap = 60.0  # and no second riding read within the gap
        woken = t.reads_woken
        assert peer.send(batch(2, 2))
        await until(lambda: queued(sock) > 0, 5, what="the batch waits in the socket")
        t.ride()  # the last read (going quiet) was less than the gap ago: nothing is read
        assert b.counter.learned["p"] == {"e": 1} and queued(sock) > 0
        t.prompt()  # the hub saw a late batch: the next ride reads at once
        routing = t.reads_routing
        t.ride()  # the read runs in this call, in this wake
        assert b.counter.learned["p"] == {"e": 2} and queued(sock) == 0
        assert t.reads_routing == routing + 1 and t.reads_woken == woken and t.reads_timer == 0
        quiet.gap = 0.0
        assert peer.send(batch(3, 3))
        await until(lambda: queued(sock) > 0, 5, what="the third batch waits")
        t.read_now()  # the hub's send: the loop is awake anyway
        assert b.counter.learned["p"] == {"e": 3} and t.reads_riding == 1


async def test_when_routing_stops_the_backstop_reads_what_waits_and_messages_wake_again() -> None:
    async with one_publisher() as (b, t, peer, _, sock):
        quiet = t._quiet
        quiet.budget = 60.0
        go_quiet(t)
        assert on(quiet)
        assert peer.send(batch(2, 2))
        await until(lambda: queued(sock) > 0, 5, what="the batch waits in the socket")
        quiet.budget = 0.0
        quiet._arm()  # no read for the budget (now 0): the loop stopped routing
        await until(lambda: b.counter.learned["p"] == {"e": 2}, 5, what="the backstop's read")
        assert t.reads_timer == 1 and not quiet.quiet and low_water(sock) == 1
        woken = t.reads_woken
        assert peer.send(batch(3, 3))
        await until(lambda: b.counter.learned["p"] == {"e": 3}, 5, what="woken again")
        assert t.reads_woken == woken + 1 and t.reads_timer == 1


async def test_a_message_above_the_low_water_mark_wakes_the_loop_and_arrives_whole() -> None:
    """A resend of a large view is not held back: past ``QUIET_LOWAT`` the socket wakes the loop
    (uvloop reads the bulk); the rest comes on the next ride or the backstop."""
    async with one_publisher() as (b, t, peer, conn, _):
        quiet = t._quiet
        go_quiet(t)
        assert on(quiet)
        key = "e" * (3 * QUIET_LOWAT)
        reads = conn._last_read
        assert peer.send(encode_batch("p", 2, time.time(), {KEY: [[key, 1]]}))
        await until(lambda: conn._last_read > reads, 5, what="the loop woken by the bulk")
        assert quiet.reads["timer"] + quiet.reads["routing"] == 0  # uvloop's read, not ours
        await until(lambda: b.counter.learned["p"].get(key) == 1, 5, what="applied whole")


async def test_a_closed_publish_connection_leaves_the_reader_and_its_duplicate_is_closed() -> None:
    async with mesh(["b"], kind="h2") as (b,):
        t = transport(b)
        async with publisher(b.hub.transport.port) as peer:
            assert peer.send(batch(1, 1))
            await until(lambda: b.counter.learned.get("p") == {"e": 1}, 5, what="applied")
            ((_, sock),) = t._quiet._socks.items()
            assert peer._transport is not None
            assert sock.getpeername() == peer._transport.get_extra_info("sockname")  # the publisher's
            go_quiet(t)
            assert on(t._quiet) and t._quiet._timer is not None
        # the publisher hung up: end of file wakes the loop whatever the low-water mark
        await until(lambda: not t._quiet._socks and not t._server.connections, 5, what="the connection gone")
        assert sock.fileno() == -1  # closed
        assert not on(t._quiet) and t._quiet._timer is None


async def test_rides_in_separate_windows_keep_waking_and_a_backstop_with_recent_rides_stays_quiet() -> None:
    """A replica routing a request every 4 ms or more is woken per message (its peers' batches
    mostly come between its requests); one whose backstop fires while it still routes stays quiet."""
    async with one_publisher() as (_, t, _peer, _conn, sock):
        quiet = t._quiet
        for _ in range(2 * BUSY_WINDOWS):
            quiet._window -= 2 * BUSY_WINDOW  # a window with no ride between this one and the last
            t.ride()
        assert not on(quiet) and low_water(sock) == 1
        go_quiet(t)
        assert on(quiet)
        quiet._on_timer()  # the backstop, a ride just now: reads, and stays quiet
        assert on(quiet) and low_water(sock) == QUIET_LOWAT and quiet._timer is not None
        quiet._last_ride -= 2 * quiet.budget
        quiet._on_timer()  # no ride for two budgets: per message again
        assert not on(quiet) and low_water(sock) == 1 and quiet._timer is None
