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
from typing import Final

import structlog
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from epp.sync.peers import Peer

log = structlog.get_logger(__name__)

DEFAULT_HWM: Final = 1000  # messages per peer; at ~one batch per loop tick, a second's worth or more
DEFAULT_MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
# A warm start's snapshot is the whole view (a large prefix index), from a peer this replica
# chose to ask; requests to our ROUTER are a replica id.
SNAPSHOT_MAX_BYTES: Final = 512 * 1024 * 1024
REQUEST_MAX_BYTES: Final = 4096
SNAPSHOT_OFFSET: Final = 1  # the ROUTER listens on --peer-port + 1

Frames = list[bytes]


class ZmqTransport:
    """One replica's sockets; ``bind`` before use, ``close`` at the end."""

    def __init__(
        self,
        bind_host: str,
        port: int,
        *,
        hwm: int = DEFAULT_HWM,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.bind_host = bind_host or "*"
        self.port = port
        self.hwm = hwm
        self.max_message_bytes = max_message_bytes
        self.hard_limit = 2 * max_message_bytes
        self._context = zmq.asyncio.Context()
        self._pub: zmq.asyncio.Socket | None = None
        self._sub: zmq.asyncio.Socket | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._connected: dict[str, Peer] = {}
        self._pub_raw: zmq.Socket[bytes] | None = None
        self._sub_raw: zmq.Socket[bytes] | None = None
        self._readable: asyncio.Event | None = None  # the SUB's descriptor said "look" (recv_many)
        self._fd = -1
        self.redials = 0

    # --- lifecycle -------------------------------------------------------------------
    def bind(self) -> int:
        """Bind PUB (and ROUTER on the next port); returns the PUB port (``port`` 0: any free pair)."""
        ctx = self._context
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, self.hwm)
        pub.setsockopt(zmq.LINGER, 0)
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.MAXMSGSIZE, REQUEST_MAX_BYTES)
        router.setsockopt(zmq.ROUTER_MANDATORY, 0)
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
        host = self.bind_host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"tcp://{host}:{port}"

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

    def close(self) -> None:
        if self._readable is not None:
            with contextlib.suppress(RuntimeError, ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self._fd)
            self._readable = None
        for sock in (self._pub, self._sub, self._router):
            if sock is not None:
                sock.close(0)
        self._pub = self._sub = self._router = None
        self._pub_raw = self._sub_raw = None
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

    async def recv(self) -> Frames:
        frames: Frames = await self._require(self._sub).recv_multipart()
        return frames

    async def recv_many(self, limit: int = 256) -> list[Frames]:
        """Wait for a message, then take every one already queued (up to ``limit``) in one go.

        The wait is the SUB's ZMQ file descriptor, registered with the loop once: pyzmq's
        asyncio ``poll`` adds and removes the reader and builds a poller and futures on every
        call, which cost more than the batch it waited for (bench/scaleout, py-spy).  ZMQ's
        descriptor only says "look": reading until EAGAIN consumes its signal, and EVENTS is
        asked once before sleeping so a message that arrived meanwhile is not missed.
        """
        raw = self._sub_raw
        if raw is None:
            raise RuntimeError("sync transport is not bound (or already closed)")
        if self._readable is None:
            self._readable = asyncio.Event()
            self._fd = int(raw.getsockopt(zmq.FD))
            asyncio.get_running_loop().add_reader(self._fd, self._on_readable)
        while True:
            out: list[Frames] = []
            while len(out) < limit:
                try:
                    out.append(raw.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
            if out:
                return out
            self._readable.clear()
            if _events(raw) & zmq.POLLIN:  # arrived between the read and clear()
                continue
            await self._readable.wait()

    def _on_readable(self) -> None:
        # Only a hint: recv_many reads until EAGAIN (which also consumes ZMQ's signal) and
        # asks EVENTS itself before it sleeps, so a spurious wake costs one empty read.
        if self._readable is not None:
            self._readable.set()

    # --- warm start --------------------------------------------------------------------
    async def serve_snapshots(self, answer: Callable[[Frames], bytes | None]) -> None:
        """Answer snapshot requests on the ROUTER until cancelled (``answer`` None: no reply)."""
        router = self._require(self._router)
        while True:
            identity, *frames = await router.recv_multipart()
            reply = answer(frames)
            if reply is not None:
                with contextlib.suppress(zmq.ZMQError):
                    await router.send_multipart([identity, reply], zmq.NOBLOCK)

    async def request_snapshot(
        self, peers: Iterable[Peer], request: bytes, accept: Callable[[Frames], bool], *, deadline: float
    ) -> bool:
        """Ask peers in turn until ``accept`` takes a reply or the loop clock passes ``deadline``."""
        loop = asyncio.get_running_loop()
        dealer = self._context.socket(zmq.DEALER)
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

    @staticmethod
    def _require(sock: zmq.asyncio.Socket | None) -> zmq.asyncio.Socket:
        if sock is None:
            raise RuntimeError("sync transport is not bound (or already closed)")
        return sock


def _events(sock: zmq.Socket[bytes]) -> int:
    """``ZMQ_EVENTS`` (reading it also re-arms the socket's descriptor)."""
    return int(sock.getsockopt(zmq.EVENTS))
