"""ZmqTransport.listen: messages read from the loop's reader callback, a busy receiver on a timer."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import zmq
import zmq.asyncio

from epp.sync.api import Frames
from epp.sync.peers import Peer
from epp.sync.transport import ZmqTransport
from epp.testing.waiting import until


@contextlib.asynccontextmanager
async def _linked() -> AsyncIterator[tuple[zmq.asyncio.Socket, ZmqTransport]]:
    """A PUB and a receiving transport that has it as its one peer (the test starts listening)."""
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    rx = ZmqTransport("127.0.0.1", 0)
    rx.bind()
    try:
        rx.set_peers([Peer("tx", "127.0.0.1", port)])
        yield pub, rx
    finally:
        rx.close()
        pub.close(0)
        ctx.term()


async def _connected(pub: zmq.asyncio.Socket, got: list[Frames]) -> None:
    """Probes until one arrives: a PUB drops messages until the SUB has connected."""
    for _ in range(200):
        await pub.send(b"probe")
        if await _polled(lambda: bool(got)):
            return
    raise AssertionError("the SUB never connected")


async def _queued(pub: zmq.asyncio.Socket, rx: ZmqTransport, what: bytes) -> None:
    """Sends ``what`` and waits until it is queued in ``rx``'s SUB (ZMQ's ``EVENTS``), unread."""
    sub = rx._sub_raw
    assert sub is not None
    await pub.send(what)
    await until(lambda: bool(int(sub.getsockopt(zmq.EVENTS)) & zmq.POLLIN), 5, what=f"{what!r} queued")


def _prompting(rx: ZmqTransport, got: list[Frames]) -> Callable[[list[Frames]], None]:
    """A handler that keeps what it reads in ``got`` and, as the hub does with messages past its
    read budget, calls ``rx.prompt()`` when a ``late`` message is among them."""

    def handler(messages: list[Frames]) -> None:
        got.extend(messages)
        if [b"late"] in messages:
            rx.prompt()

    return handler


async def test_a_busy_receiver_reads_on_its_timer_or_when_awake_anyway() -> None:
    got: list[Frames] = []
    async with _linked() as (pub, rx):
        rx.listen(got.extend, gap=3600.0)  # once busy, the timer would not fire during the test
        await _connected(pub, got)  # quiet receiver: read at once, from the descriptor's callback
        assert got[-1] == [b"probe"]
        if len(got) == 1:  # (two probes arriving in two wakes would already be "busy")
            assert _state(rx) == (False, True)
        got.clear()
        await pub.send(b"second")  # a second wake within gap: the peers are busy
        await until(lambda: got == [[b"second"]], 5, what="the descriptor's callback reads the second")
        assert _state(rx) == (True, False)  # busy now: reads wait for the timer
        got.clear()
        await _queued(pub, rx, b"third")
        assert got == []  # nobody watches the descriptor until the timer
        timer = _due_soon(rx)
        rx.read_now()  # the hub was awake anyway (it sent): read, and put the timer off
        assert got == [[b"third"]]
        assert _state(rx) == (True, False) and rx._timer is not timer
        rx._on_timer()  # the timer finds nothing queued: back to the descriptor
        assert _state(rx) == (False, True)
        got.clear()
        await pub.send(b"fourth")
        await until(lambda: got == [[b"fourth"]], 5, what="the descriptor's callback reads the fourth")


async def test_a_late_message_sends_a_busy_receiver_back_to_the_descriptor() -> None:
    """``prompt`` from the handler (the hub's read budget): the read that found late messages does
    not start or keep the busy timer, so the next message is read when it arrives, not a gap later."""
    got: list[Frames] = []
    async with _linked() as (pub, rx):
        rx.listen(_prompting(rx, got), gap=3600.0)
        await _connected(pub, got)
        await pub.send(b"late")  # a second wake within gap would make it busy, but it was late
        await until(lambda: [b"late"] in got, 5, what="the late message read")
        assert _state(rx) == (False, True)
        await pub.send(b"fresh")  # busy now: two wakes within gap, neither late
        await until(lambda: [b"fresh"] in got, 5, what="the fresh message read")
        assert _state(rx) == (True, False)
        await _queued(pub, rx, b"late")
        got.clear()
        rx._on_timer()  # the busy timer reads a late one: back to the descriptor, no timer kept
        assert got == [[b"late"]] and _state(rx) == (False, True)
        await pub.send(b"fresh")
        await until(lambda: got[-1:] == [[b"fresh"]], 5, what="read at once from the descriptor")
        assert _state(rx) == (True, False)  # a fresh wake within gap of the last: busy again
        await _queued(pub, rx, b"late")
        rx.read_now()  # a riding read that finds a late one drops the timer too
        assert got[-1] == [b"late"] and _state(rx) == (False, True)


async def test_a_ride_reads_in_a_wake_the_loop_had_and_puts_the_busy_timer_off() -> None:
    """``ride`` (the ext_proc edge calls it on every read): at most once per ``RIDE_EVERY`` it reads
    what is queued and puts the busy timer off by ``gap`` (found or not: nothing is queued now);
    a late message sends the receiver back to the descriptor, as from any other read."""
    got: list[Frames] = []
    async with _linked() as (pub, rx):
        rx.listen(_prompting(rx, got), gap=3600.0)
        await _connected(pub, got)
        await pub.send(b"second")  # two reads with messages within gap: busy, on the timer
        await until(lambda: [b"second"] in got, 5, what="the descriptor's callback reads the second")
        assert _state(rx) == (True, False)
        got.clear()
        await _queued(pub, rx, b"third")
        timer = _due_soon(rx)
        rx._ride_after = 0.0
        rx.ride()  # a request's wake: read here, and the timer put off
        assert got == [[b"third"]] and rx.reads_routing == 1
        assert _state(rx) == (True, False) and rx._timer is not timer
        await _queued(pub, rx, b"fourth")
        rx._ride_after = time.monotonic() + 60.0
        rx.ride()  # within RIDE_EVERY of the last ride: a clock compare, nothing read
        assert got == [[b"third"]] and rx.reads_routing == 1
        rx._ride_after = 0.0
        rx.ride()
        assert got[-1] == [b"fourth"] and rx.reads_routing == 2
        kept = rx._timer
        rx._ride_after = 0.0
        rx.ride()  # nothing queued, and more than half a gap left on the backstop: left as it is
        assert rx.reads_routing == 2 and _state(rx) == (True, False) and rx._timer is kept
        timer = _due_soon(rx)
        rx._ride_after = 0.0
        rx.ride()  # nothing queued now: the backstop need not read before a gap from now
        assert rx.reads_routing == 2 and _state(rx) == (True, False) and rx._timer is not timer
        assert rx._timer is not None and rx._timer.when() > asyncio.get_running_loop().time() + 3000.0
        assert rx.timer_wakes == 0
        await _queued(pub, rx, b"late")
        rx._ride_after = 0.0
        rx.ride()  # a late message: no timer kept, the descriptor watched again
        assert got[-1] == [b"late"] and _state(rx) == (False, True)


async def _polled(cond: Callable[[], bool]) -> bool:
    """Whether ``cond`` holds within 50 ms (a bounded wait for one probe)."""
    try:
        await until(cond, 0.05, what="probe")
    except AssertionError:
        return False
    return True


def _due_soon(t: ZmqTransport) -> asyncio.TimerHandle:
    """The busy timer replaced by one due in a minute (of a gap of an hour): as if most of the gap
    had passed, so a read now puts it off (one with more than half a gap left is kept)."""
    assert t._timer is not None and t._loop is not None
    t._timer.cancel()
    t._timer = t._loop.call_later(60.0, t._on_timer)
    return t._timer


def _state(t: ZmqTransport) -> tuple[bool, bool]:
    """(a read timer is armed, the descriptor is watched)."""
    return t._timer is not None, t._watching
