"""The sync transport: ZMQ PUB/SUB for deltas, ROUTER/DEALER for a warm start's snapshot.

Each replica binds a PUB socket on ``--peer-port`` and a ROUTER on the port after it, and
connects one SUB to every peer's PUB (docs/decisions.md, "Cross-replica sync over ZMQ").
Queues are bounded both ways (SNDHWM, RCVHWM): a slow peer loses messages rather than
blocking this replica's event loop; the hub counts the loss (a refused send here, a
sender's sequence gap at the receiver).  A message larger than ``max_message_bytes`` is
counted and dropped by the hub; one more than twice that is cut off by ZMQ itself before it
is buffered (MAXMSGSIZE drops that connection; the SUB reconnects).

The transport knows nothing of plugins: it moves frames; ``hub.SyncHub`` decides what they
mean.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from time import monotonic as _monotonic
from typing import Final

import structlog
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from epp.sync.api import Frames
from epp.sync.peers import Peer

log = structlog.get_logger(__name__)

DEFAULT_HWM: Final = 1000  # messages per peer; at ~one batch per loop tick, a second's worth or more
DEFAULT_MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
# A warm start's snapshot is the whole view (a large prefix index), from a peer this replica
# chose to ask; requests to our ROUTER are a replica id.
SNAPSHOT_MAX_BYTES: Final = 512 * 1024 * 1024
REQUEST_MAX_BYTES: Final = 4096
SNAPSHOT_OFFSET: Final = 1  # the ROUTER listens on --peer-port + 1
# ``ride``: the least time between two reads riding on the loop's other wakes (an ext_proc read);
# the check is a clock compare, the read a ``ZMQ_EVENTS`` syscall when nothing is queued.
RIDE_EVERY: Final = 0.0005


class ZmqTransport:
    """One replica's sockets; ``bind`` before use, ``close`` at the end."""

    wants_rides = True  # a read riding on an ext_proc read saves the loop a wake (``ride``)

    def __init__(
        self,
        bind_host: str,
        port: int,
        *,
        hwm: int = DEFAULT_HWM,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        """``context``: a ZMQ context to share (one libzmq I/O thread for several transports, as
        bench/scaleout's replayed peers use); None: a context of its own, terminated by ``close``."""
        self.bind_host = bind_host or "*"
        self.port = port
        self.hwm = hwm
        self.max_message_bytes = max_message_bytes
        self.hard_limit = 2 * max_message_bytes
        self._own_context = context is None
        self._context = context if context is not None else zmq.asyncio.Context()
        self._pub: zmq.asyncio.Socket | None = None
        self._sub: zmq.asyncio.Socket | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._connected: dict[str, Peer] = {}
        self._pub_raw: zmq.Socket[bytes] | None = None
        self._sub_raw: zmq.Socket[bytes] | None = None
        # listen(): the reader callback's state
        self._handler: Callable[[list[Frames]], None] | None = None
        self._gap = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._watching = False
        self._found_at = -1e9  # loop time of the last read that found messages (any cause)
        self._prompt = False  # the handler found a message past its budget: leave the busy timer
        self._ride_after = 0.0  # monotonic: ``ride`` reads again from then on
        self._last_ride = -1e9  # monotonic: the last ride that read (or checked)
        self._fd = -1
        self.redials = 0
        # reads that found messages, by what ran them: the descriptor woke the loop, the busy
        # receiver's timer, the hub's send (``read_now``), or the loop's wake for a request
        # (``ride``); and messages read
        self.reads_woken = 0
        self.reads_timer = 0
        self.reads_riding = 0
        self.reads_routing = 0
        self.timer_wakes = 0  # the busy timer's callbacks, whether or not they found messages
        self.messages_read = 0

    # --- lifecycle -------------------------------------------------------------------
    def bind(self) -> int:
        """Bind PUB (and ROUTER on the next port); returns the PUB port (``port`` 0: any free pair)."""
        ctx = self._context
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, self.hwm)
        pub.setsockopt(zmq.LINGER, 0)
        router = snapshot_router(ctx)
        try:
            if self.port:
                pub.bind(self._address(self.port))
                router.bind(self._address(self.port + SNAPSHOT_OFFSET))
            else:  # tests: find a free consecutive pair
                self.port = self._bind_pair(pub, router)
        except zmq.ZMQError:
            pub.close(0)
            router.close(0)
            raise
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, self.hwm)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.MAXMSGSIZE, self.hard_limit)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._pub, self._sub, self._router = pub, sub, router
        # Plain (non-asyncio) views of the same sockets: a send or a NOBLOCK read through them
        # is one C call, where the asyncio wrapper makes a Future per message (~30 µs each).
        self._pub_raw = zmq.Socket.shadow(pub.underlying)
        self._sub_raw = zmq.Socket.shadow(sub.underlying)
        return self.port

    def _address(self, port: int) -> str:
        return zmq_address(self.bind_host, port)

    def _bind_pair(self, pub: zmq.asyncio.Socket, router: zmq.asyncio.Socket) -> int:
        for _ in range(50):
            port = pub.bind_to_random_port(self._address(0).rsplit(":", 1)[0], 20000, 60000)
            try:
                router.bind(self._address(port + SNAPSHOT_OFFSET))
            except zmq.ZMQError:
                pub.unbind(self._address(port))
                continue
            return port
        raise zmq.ZMQError(zmq.EADDRINUSE, "no free consecutive port pair for sync")

    def close(self, linger: float = 0.0) -> None:
        """Close the sockets; ``linger`` seconds for what the PUB still queues (a goodbye) to leave."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._watching and self._loop is not None:
            with contextlib.suppress(RuntimeError, ValueError, OSError):
                self._loop.remove_reader(self._fd)
        self._watching = False
        self._handler = None
        if self._pub is not None:
            self._pub.close(int(linger * 1000))
        for sock in (self._sub, self._router):
            if sock is not None:
                sock.close(0)
        self._pub = self._sub = self._router = None
        self._pub_raw = self._sub_raw = None
        if self._own_context:
            self._context.term()

    # --- peers -------------------------------------------------------------------------
    def set_peers(self, peers: Iterable[Peer]) -> None:
        """Connect the SUB to new peers' PUBs and disconnect from those gone."""
        sub = self._require(self._sub)
        wanted = {p.endpoint(): p for p in peers}
        for endpoint in set(self._connected) - set(wanted):
            with contextlib.suppress(zmq.ZMQError):
                sub.disconnect(endpoint)
            del self._connected[endpoint]
        for endpoint, peer in wanted.items():
            if endpoint not in self._connected:
                sub.connect(endpoint)
                self._connected[endpoint] = peer

    async def redial(self) -> None:
        """Reconnect to a peer whose connection ZMQ dropped for a protocol error, until cancelled.

        ZMQ re-dials a peer that went away by itself, but not one whose connection it cut for
        breaking the protocol (a message over MAXMSGSIZE): without this, one oversized batch
        would cut this replica off from that peer for good.
        """
        sub = self._require(self._sub)
        monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        try:
            while True:
                event = parse_monitor_message(await monitor.recv_multipart())
                endpoint = event["endpoint"].decode()
                if endpoint in self._connected and self._sub is not None:
                    with contextlib.suppress(zmq.ZMQError):
                        self._sub.disconnect(endpoint)
                    self._sub.connect(endpoint)
                    self.redials += 1
        finally:
            with contextlib.suppress(zmq.ZMQError):
                sub.disable_monitor()
            monitor.close(0)

    @property
    def has_peers(self) -> bool:
        return bool(self._connected)

    @property
    def peers(self) -> tuple[Peer, ...]:
        return tuple(self._connected.values())

    # --- deltas ------------------------------------------------------------------------
    def send(self, frame: bytes) -> bool:
        """Publish without blocking; False when the queue refused it (counted by the caller)."""
        pub = self._pub_raw
        if pub is None:
            raise RuntimeError("sync transport is not bound (or already closed)")
        try:
            pub.send(frame, zmq.NOBLOCK, copy=len(frame) < 64 * 1024)
        except zmq.Again:
            return False
        return True

    def listen(self, handler: Callable[[list[Frames]], None], gap: float = 0.0) -> None:
        """Call ``handler`` with every message queued on the SUB, from the loop's reader callback.

        No task, future or event per message: the SUB's ZMQ descriptor is registered with the
        loop and the callback reads until ZMQ's ``EVENTS`` says nothing is left (which also
        re-arms the descriptor: it only signals a change, so reading must go that far).  With
        ``gap`` > 0 a busy receiver reads at most once per ``gap`` seconds: when two reads find
        messages within ``gap`` (whatever ran them), it stops watching the descriptor and reads
        again ``gap`` later (on a timer), and goes back to the descriptor once a timer's read
        finds nothing.  Every read the loop runs for other reasons meanwhile (``ride``: a
        request's wake; ``read_now``: the hub's send) puts the timer off to ``gap`` after it, so
        the timer is a backstop that fires only when no such wake came within ``gap``.  So with
        many peers the loop wakes at most ~1/gap times a second for all of them instead of once
        per message, and none at all while it routes often enough, at the price of up to ``gap``
        of staleness; messages that come further apart than ``gap`` are each read at once (one
        wake each, never a second one for a timer that finds nothing), and an idle receiver
        costs nothing.  The handler may call ``prompt`` (the messages it got were already
        late): then the read that called it does not start or keep the timer, and the
        descriptor is watched again.  pyzmq's asyncio ``poll`` (a poller and futures per call)
        cost more than the batch it waited for (bench/scaleout, py-spy).
        """
        raw = self._sub_raw
        if raw is None:
            raise RuntimeError("sync transport is not bound (or already closed)")
        if self._handler is not None:
            raise RuntimeError("sync transport: already listening")
        self._handler = handler
        self._gap = gap
        self._loop = asyncio.get_running_loop()
        self._fd = int(raw.getsockopt(zmq.FD))
        self._watch()

    def _watch(self) -> None:
        assert self._loop is not None
        self._timer = None
        if not self._watching:
            self._loop.add_reader(self._fd, self._on_readable)
            self._watching = True
        if _events(self._sub_raw) & _POLLIN:  # arrived while nobody watched: no signal will come
            self._on_readable()

    def prompt(self) -> None:
        """Read at once again (from the handler): the messages just read had already spent the
        staleness budget, so holding the next ones for the busy timer's ``gap`` would add to a
        delay the machine has already made long (the hub's ``read_budget``)."""
        self._prompt = True

    def _on_readable(self) -> None:
        self._prompt = False
        if self.read_all():
            self.reads_woken += 1
            self._found()

    def _found(self) -> None:
        """A read found messages: on the timer, put it off (or leave it, late ones were read);
        watching, a second read with messages within ``gap`` means peers keep sending: stop
        watching the descriptor and read on the timer."""
        loop = self._loop
        if self._gap <= 0 or loop is None:
            return
        now = loop.time()
        busy, self._found_at = now - self._found_at < self._gap, now
        timer = self._timer
        if timer is not None:
            if self._prompt:
                timer.cancel()
                self._watch()
            else:
                self._put_off(timer, loop, now)
        elif busy and not self._prompt and self._watching:
            self._backstop(loop)

    def _put_off(self, timer: asyncio.TimerHandle, loop: asyncio.AbstractEventLoop, now: float) -> None:
        """Nothing is queued now: the timer need not read before ``gap`` from now.  Put off only
        once half a gap has passed (it then reads up to half a gap early): a new timer handle on
        every read riding on a request costs more, cold, than the reads it saves."""
        if timer.when() - now < self._gap / 2:
            timer.cancel()
            self._timer = loop.call_later(self._gap, self._on_timer)

    def _backstop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stop watching the descriptor; read on the timer (and on the loop's other wakes)."""
        loop.remove_reader(self._fd)
        self._watching = False
        self._timer = loop.call_later(self._gap, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.timer_wakes += 1
        if self._sub_raw is None:
            return
        self._prompt = False
        if self.read_all() and self._loop is not None:
            self.reads_timer += 1
            self._found_at = self._loop.time()
            if not self._prompt:
                self._timer = self._loop.call_later(self._gap, self._on_timer)
                return
        self._watch()

    def read_now(self) -> None:
        """Read what is queued while the loop is awake anyway (the hub calls it when it sends).

        A wake of the loop costs more than the messages it reads (bench/scaleout, part cost), so
        a read that rides on another wake puts the busy receiver's timer off by ``gap``.
        """
        self._prompt = False
        if self._handler is not None and self.read_all():
            self.reads_riding += 1
            self._found()

    def ride(self) -> None:
        """The loop woke for a request (an ext_proc read): read peers' messages in this wake.

        Called by the ext_proc edge on every read (the app wires it); at most once per
        ``RIDE_EVERY`` it costs more than a clock compare.  On the busy timer (the descriptor not
        watched): a ``ZMQ_EVENTS`` check, the read if something is queued, and the timer put off
        (nothing is queued now, so the backstop need not read before ``gap`` from now).
        Watching the descriptor: when the replica routes steadily (two rides within ``gap``)
        while peers send (a read found messages within two gaps), it stops watching and the
        timer becomes the backstop.  So while the replica routes more often than once per
        ``gap``, peers' messages are read in its requests' wakes and the loop wakes for none of
        them; staleness stays bounded by ``gap`` after arrival, since a read (ride, send or
        timer) follows every check within ``gap``.
        """
        now = _monotonic()
        if now < self._ride_after:
            return
        self._ride_after = now + RIDE_EVERY
        raw, loop = self._sub_raw, self._loop
        if raw is None or loop is None or self._handler is None or self._gap <= 0:
            return
        steady, self._last_ride = now - self._last_ride < self._gap, now
        timer = self._timer
        if timer is not None:  # on the backstop timer: read here what came since
            self._prompt = False
            if _events(raw) & _POLLIN and self.read_all():
                self.reads_routing += 1
                self._found()
            elif self._timer is timer:
                self._put_off(timer, loop, loop.time())
        # Watching the descriptor, a message that came during this wake is read in this loop
        # iteration or the next without a sleep: checking ``EVENTS`` here (a syscall) buys nothing.
        elif steady and self._watching and loop.time() - self._found_at < 2 * self._gap:
            # Routing steadily (two rides within gap) while peers send (a read found messages
            # lately): the next ride will most likely come before the read gap ends, so the
            # descriptor need not wake the loop for the next message; the timer is the backstop.
            self._backstop(loop)

    def read_all(self, limit: int = 4096) -> int:
        """Hand every queued message (up to ``limit``) to the handler in one call; how many."""
        raw = self._sub_raw
        handler = self._handler
        if raw is None or handler is None:
            return 0
        out: list[Frames] = []
        recv = raw.recv_multipart
        try:
            while len(out) < limit and _events(raw) & _POLLIN:
                out.append(recv(zmq.NOBLOCK))
        except zmq.Again:  # EVENTS said POLLIN but the message was not whole yet: next signal
            pass
        except zmq.ZMQError:  # closed under us
            return 0
        if out:
            self.messages_read += len(out)
            handler(out)
        return len(out)

    async def recv(self) -> Frames:
        frames: Frames = await self._require(self._sub).recv_multipart()
        return frames

    # --- warm start --------------------------------------------------------------------
    async def serve_snapshots(self, answer: Callable[[Frames], bytes | None]) -> None:
        """Answer snapshot requests on the ROUTER until cancelled (``answer`` None: no reply)."""
        await serve_snapshots(self._require(self._router), answer)

    async def request_snapshot(
        self, peers: Iterable[Peer], request: bytes, accept: Callable[[Frames], bool], *, deadline: float
    ) -> bool:
        """Ask peers in turn until ``accept`` takes a reply or the loop clock passes ``deadline``."""
        return await request_snapshot(self._context, peers, request, accept, deadline=deadline)

    @staticmethod
    def _require(sock: zmq.asyncio.Socket | None) -> zmq.asyncio.Socket:
        if sock is None:
            raise RuntimeError("sync transport is not bound (or already closed)")
        return sock


_EVENTS: Final = int(zmq.EVENTS)
_POLLIN: Final = int(zmq.POLLIN)  # plain ints: the enums' operators cost ~1 us a read (ride checks often)


def _events(sock: zmq.Socket[bytes] | None) -> int:
    """``ZMQ_EVENTS`` (reading it also re-arms the socket's descriptor)."""
    return 0 if sock is None else int(sock.getsockopt(_EVENTS))


def zmq_address(host: str, port: int) -> str:
    """``tcp://host:port`` for a bind (``*``: every interface; an IPv6 address in brackets)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"tcp://{host}:{port}"


# --- warm start: a snapshot over ROUTER/DEALER (the HTTP/2 transport serves it on its own port) --
def snapshot_router(context: zmq.asyncio.Context) -> zmq.asyncio.Socket:
    """The ROUTER that answers peers' snapshot requests (bound on the sync port + 1 by the caller)."""
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.MAXMSGSIZE, REQUEST_MAX_BYTES)
    router.setsockopt(zmq.ROUTER_MANDATORY, 0)
    return router


async def serve_snapshots(router: zmq.asyncio.Socket, answer: Callable[[Frames], bytes | None]) -> None:
    """Answer snapshot requests on ``router`` until cancelled (``answer`` None: no reply)."""
    while True:
        identity, *frames = await router.recv_multipart()
        reply = answer(frames)
        if reply is not None:
            with contextlib.suppress(zmq.ZMQError):
                await router.send_multipart([identity, reply], zmq.NOBLOCK)


async def request_snapshot(
    context: zmq.asyncio.Context,
    peers: Iterable[Peer],
    request: bytes,
    accept: Callable[[Frames], bool],
    *,
    deadline: float,
) -> bool:
    """Ask peers in turn until ``accept`` takes a reply or the loop clock passes ``deadline``."""
    loop = asyncio.get_running_loop()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.IMMEDIATE, 1)  # queue requests only to peers that are up
    dealer.setsockopt(zmq.MAXMSGSIZE, SNAPSHOT_MAX_BYTES)
    try:
        for peer in peers:
            dealer.connect(peer.endpoint(SNAPSHOT_OFFSET))
        while (left := deadline - loop.time()) > 0:
            with contextlib.suppress(zmq.Again):
                await dealer.send(request, zmq.NOBLOCK)
            try:
                while True:
                    frames = await asyncio.wait_for(dealer.recv_multipart(), min(left, 0.2))
                    if accept(frames):
                        return True
            except TimeoutError:
                continue
        return False
    finally:
        dealer.close(0)
