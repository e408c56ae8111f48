"""The sync transport over the EPP's own HTTP/2: peers' batches as gRPC messages, on the loop.

Each replica serves ``/epp.sync.v1.Sync/Publish`` (a client-streaming call of raw batch frames)
on its ``--peer-port`` with the same HTTP/2 server as ext_proc, so a peer meets the same limits
as Envoy does; and it holds one connection to every peer's port (``StreamClient``), on which
each batch is one DATA frame written straight from the loop.  No thread sits between the loop
and the sockets: ZMQ's I/O thread cost a wake of a second thread on both sides of every message,
which on the bench machine cost more than the work (docs/decisions.md, "Sync over the EPP's own
HTTP/2").  A peer's message is handed to the hub in the read that brings it; while this replica
routes, that read runs in a wake the loop has anyway, and the peer's write does not wake it
(``epp.server.quiet_reads``).

A warm start's snapshot is a unary call on the same port, ``/epp.sync.v1.Sync/Snapshot``: the
starting replica asks every peer at once on connections of its own (``UnaryClient``) and takes
the first serving peer's answer; the answer is paced by the asker's windows like any response.
One port, one protocol, the same server's limits and the same secret as the deltas.

With a shared secret (``--peer-secret-file``, ``epp.sync.secret``) a Publish or Snapshot call
must carry ``authorization: Bearer <secret>``; the server checks it when the call opens, and a
change of the secrets drops every connection both ways so each call is checked again.

Connections: a link per peer dials, and re-dials with backoff when the connection drops or the
peer refuses it; a message for a peer not connected is dropped (as a ZMQ PUB does for a
subscriber not yet connected), and the peer's sequence numbers show the gap.  A peer whose
queue is full (it does not read) refuses the message; ``send`` says so and the hub counts it.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import partial
from typing import Any, Final

import structlog
import zmq
import zmq.asyncio

from epp.server.h2.calls import Call, Driver, Route, open_call
from epp.server.h2.client import StreamClient, UnaryClient
from epp.server.h2.connection import Connection
from epp.server.h2.frames import INVALID_ARGUMENT, UNAVAILABLE
from epp.server.h2.headers import HeaderList
from epp.server.h2.limits import DEFAULT_LIMITS, H2Limits
from epp.server.quiet_reads import QuietReads
from epp.sync import metrics
from epp.sync.api import Frames, Transport
from epp.sync.peers import Peer
from epp.sync.secret import PeerSecret
from epp.sync.transport import DEFAULT_HWM, DEFAULT_MAX_MESSAGE_BYTES, SNAPSHOT_MAX_BYTES, ZmqTransport

PUBLISH_PATH: Final = b"/epp.sync.v1.Sync/Publish"
SNAPSHOT_PATH: Final = b"/epp.sync.v1.Sync/Snapshot"
# A peer is asked for its snapshot again this long after it answered "starting too" or not at
# all (as the ZMQ dealer re-asked).
SNAPSHOT_RETRY: Final = 0.2
CONNECT_TIMEOUT: Final = 1.0
REDIAL_MIN: Final = 0.05  # first wait before dialling a peer again; doubles up to REDIAL_MAX
REDIAL_MAX: Final = 1.0

log = structlog.get_logger(__name__)


class _PublishDriver:
    """A peer's Publish call: every message goes to the transport's handler as it is read."""

    __slots__ = ("_call", "_deliver")

    def __init__(self, call: Call, deliver: Callable[[bytes], None]) -> None:
        self._call = call
        self._deliver = deliver

    def on_message(self, msg: Any) -> bool:
        self._deliver(msg)
        return False  # consumed: credited to the peer's window

    def on_end_stream(self) -> None:
        self._call.end()

    def cancel(self) -> None:
        pass


class _SnapshotDriver:
    """A starting peer's Snapshot call: its one request answered with the snapshot (``answer``),
    paced by the peer's windows, then the trailers; a request ``answer`` refuses (malformed, or
    without the secret) ends the call with no message."""

    __slots__ = ("_answer", "_call", "_task")

    def __init__(self, call: Call, answer: Callable[[Frames], bytes | None] | None) -> None:
        self._call = call
        self._answer = answer
        self._task: asyncio.Task[None] | None = None

    def on_message(self, msg: Any) -> bool:
        if self._task is not None or self._call.ended:
            return False  # one request a call: a second one is read and ignored
        reply = self._answer([msg]) if self._answer is not None else None
        if reply is None:
            self._call.end(UNAVAILABLE if self._answer is None else INVALID_ARGUMENT, "no snapshot")
            return False
        self._task = asyncio.get_running_loop().create_task(self._send(reply), name="sync-snapshot-reply")
        return False

    async def _send(self, reply: bytes) -> None:
        await self._call.send(reply)
        self._call.end()

    def on_end_stream(self) -> None:
        if self._task is None and not self._call.ended:
            self._call.end(INVALID_ARGUMENT, "a snapshot call carries one request")

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()


class _PublishServer:
    """The ``StreamServer`` of the sync port: two routes (Publish, Snapshot), no deferred work, no
    awake hook.

    With a ``secret``, a call must carry ``authorization: Bearer <one of its secrets>``; a call
    without is refused UNAUTHENTICATED, counted, and its connection told to go away (GOAWAY), so
    a peer with the wrong secret re-dials on its backoff (up to a second) instead of opening a
    refused stream per message."""

    after_reply = None

    def __init__(
        self, limits: H2Limits, deliver: Callable[[bytes], None], secret: PeerSecret | None = None
    ) -> None:
        self.awake: Callable[[], None] | None = None
        self.limits = limits
        self.connections: set[Connection] = set()
        self.stopping = False
        self._routes: dict[bytes, Route] = {
            PUBLISH_PATH: (bytes, self._driver),
            SNAPSHOT_PATH: (bytes, self._snapshot_driver),
        }
        self.answer: Callable[[Frames], bytes | None] | None = None  # the hub's, once it serves snapshots
        self._deliver = deliver
        self._secret = secret
        self.unauthenticated = 0  # calls refused for want of a secret
        self._warned = False
        self.quiet = QuietReads()  # Publish connections, read in the loop's other wakes

    def _driver(self, call: Call) -> Driver:
        self.quiet.add(call.conn)
        return _PublishDriver(call, self._deliver)

    def _snapshot_driver(self, call: Call) -> Driver:
        return _SnapshotDriver(call, self.answer)

    def open_stream(self, conn: Connection, stream_id: int, headers: HeaderList, size: int) -> Call | None:
        denied = self._secret is not None and not self._authorized(self._secret, headers)
        call = open_call(
            conn, stream_id, headers, size, self._routes, self.limits, stopping=self.stopping, denied=denied
        )
        if denied:
            conn.goaway()
        return call

    def _authorized(self, secret: PeerSecret, headers: HeaderList) -> bool:
        """Whether the call's ``authorization`` presents one of the secrets; a refusal is counted."""
        for name, value in headers:
            if name == b"authorization":
                if secret.accepts_authorization(value):
                    return True
                break
        self.unauthenticated += 1
        metrics.REJECTED.labels("unauthenticated").inc()
        if not self._warned:  # once: a misconfigured peer retries every second
            self._warned = True
            log.warning(
                "sync_peer_unauthenticated", counted='epp_sync_rejected_total{reason="unauthenticated"}'
            )
        return False

    def forget(self, conn: Connection) -> None:
        self.connections.discard(conn)
        self.quiet.remove(conn)


class _Link:
    """This replica's connection to one peer's sync port, re-dialled while the peer is wanted;
    each connection presents the secret current when it is dialled."""

    def __init__(self, peer: Peer, max_queued: int, secret: PeerSecret | None = None) -> None:
        self.peer = peer
        self.client: StreamClient | None = None
        self._max_queued = max_queued
        self._secret = secret
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"sync-link-{peer.id}")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        authority = f"{self.peer.host}:{self.peer.port}".encode()
        delay = REDIAL_MIN
        while True:
            authorization = self._secret.authorization if self._secret is not None else b""
            try:
                _, client = await asyncio.wait_for(
                    loop.create_connection(
                        partial(
                            StreamClient,
                            PUBLISH_PATH,
                            authority,
                            max_queued=self._max_queued,
                            authorization=authorization,
                        ),
                        self.peer.host,
                        self.peer.port,
                    ),
                    CONNECT_TIMEOUT,
                )
            except (OSError, TimeoutError):
                await asyncio.sleep(delay)
                delay = min(2 * delay, REDIAL_MAX)
                continue
            self.client = client
            since = loop.time()
            try:
                await client.closed
            finally:
                self.client = None
            # a connection that lasted starts the backoff over; one dropped at once doubles it, so
            # a peer that accepts and hangs up is not dialled in a loop
            delay = REDIAL_MIN if loop.time() - since > REDIAL_MAX else min(2 * delay, REDIAL_MAX)
            await asyncio.sleep(delay)

    def close(self) -> None:
        self._task.cancel()
        if self.client is not None:
            self.client.close()


class H2Transport:
    """The hub's ``Transport`` over HTTP/2 (module docstring); ``bind`` before use, ``close`` at the end."""

    def __init__(
        self,
        bind_host: str,
        port: int,
        *,
        hwm: int = DEFAULT_HWM,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        limits: H2Limits = DEFAULT_LIMITS,
        secret: PeerSecret | None = None,
    ) -> None:
        self.bind_host = bind_host.strip("[]")
        self.secret = secret
        self.port = port
        self.hwm = hwm
        self.max_message_bytes = max_message_bytes
        # the hub drops a batch over max_message_bytes; the server refuses one over twice that unread
        self.limits = replace(limits, max_message_bytes=2 * max_message_bytes)
        self._server = _PublishServer(self.limits, self._deliver, secret)
        if secret is not None:
            secret.on_change(self._reauthenticate)
        self._sock: socket.socket | None = None
        self._listening: asyncio.Server | None = None
        self._serving: asyncio.Task[None] | None = None
        self._links: dict[Peer, _Link] = {}
        self._handler: Callable[[list[Frames]], None] | None = None
        self._quiet = self._server.quiet
        self.reads_woken = 0  # messages uvloop's own reads delivered (a wake each, unless the loop was up)
        self.messages_read = 0

    # --- lifecycle ---------------------------------------------------------------------
    def bind(self) -> int:
        """Bind the sync port (``port`` 0: any free one); it serves deltas and snapshots both."""
        sock = self._listen_socket(self.port)
        self._sock, self.port = sock, int(sock.getsockname()[1])
        return self.port

    def _listen_socket(self, port: int) -> socket.socket:
        host = self.bind_host or "0.0.0.0"  # every interface, as ZMQ's "*"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=128)
        sock.setblocking(False)
        return sock

    def close(self, linger: float = 0.0) -> None:
        """Close the links (what they wrote still leaves) and the server."""
        for link in self._links.values():
            link.close()
        self._links.clear()
        self._handler = None
        self._server.stopping = True
        if self._serving is not None:
            self._serving.cancel()
        if self._listening is not None:
            self._listening.close()  # the listening socket with it
        elif self._sock is not None:
            self._sock.close()
        self._sock = None
        for conn in list(self._server.connections):
            conn.abort()
        self._quiet.close()

    def _reauthenticate(self) -> None:
        """The secrets changed: every call was authenticated against the old set, and every link
        presents the old first secret.  Drop both; peers' links re-dial, ours re-dial with the new."""
        for conn in list(self._server.connections):
            conn.goaway()
        for link in self._links.values():
            if link.client is not None:
                link.client.close()
        log.info("sync_secret_changed", peers=len(self._links), connections=len(self._server.connections))

    @property
    def unauthenticated(self) -> int:
        """Peers' calls refused for want of a secret."""
        return self._server.unauthenticated

    # --- peers ---------------------------------------------------------------------------
    def set_peers(self, peers: Iterable[Peer]) -> None:
        wanted = {p: None for p in peers}
        for peer in [p for p in self._links if p not in wanted]:
            self._links.pop(peer).close()
        for peer in wanted:
            if peer not in self._links:
                self._links[peer] = _Link(peer, self.hwm, self.secret)

    @property
    def has_peers(self) -> bool:
        return bool(self._links)

    @property
    def peers(self) -> tuple[Peer, ...]:
        return tuple(self._links)

    @property
    def connected(self) -> int:
        """Peers whose sync port this replica holds a connection to."""
        return sum(1 for link in self._links.values() if link.client is not None and link.client.connected)

    async def redial(self) -> None:
        """Each link re-dials by itself; this only waits to be cancelled (the hub's task list)."""
        await asyncio.get_running_loop().create_future()

    # --- deltas ---------------------------------------------------------------------------
    def send(self, frame: bytes) -> bool:
        """Write ``frame`` to every connected peer now; False when a peer's queue refused it."""
        ok = True
        for link in self._links.values():
            client = link.client
            if client is not None and client.connected and not client.send(frame):
                ok = False
        return ok

    def listen(self, handler: Callable[[list[Frames]], None], gap: float = 0.0) -> None:
        """Serve the sync port and hand every message to ``handler`` in the read that brings it
        (``gap`` is ZMQ's: a read here costs no wake of its own)."""
        if self._sock is None:
            raise RuntimeError("sync transport is not bound (or already closed)")
        if self._handler is not None:
            raise RuntimeError("sync transport: already listening")
        self._handler = handler
        self._start_serving()

    def _start_serving(self) -> None:
        """Accept peers' connections (once): for snapshots from the start, for deltas once listening."""
        if self._serving is None and self._sock is not None:
            self._serving = asyncio.get_running_loop().create_task(
                self._serve(self._sock), name="sync-server"
            )

    async def _serve(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        server = self._server
        self._listening = await loop.create_server(lambda: Connection(server), sock=sock)

    def _deliver(self, msg: bytes) -> None:
        handler = self._handler
        if handler is not None:
            self.messages_read += 1
            if not self._quiet.cause:
                self.reads_woken += 1
            handler([[msg]])

    # Publish connections are read in the loop's other wakes (``epp.server.quiet_reads``): the
    # ext_proc edge calls ``ride`` after each of its reads, the hub ``read_now`` after its sends.
    wants_rides = True

    def prompt(self) -> None:
        self._quiet.prompt()

    def read_now(self) -> None:
        self._quiet.ride("riding")

    def ride(self) -> None:
        self._quiet.ride("routing")

    @property
    def reads_riding(self) -> int:
        return self._quiet.reads["riding"]

    @property
    def reads_routing(self) -> int:
        return self._quiet.reads["routing"]

    @property
    def reads_timer(self) -> int:
        return self._quiet.reads["timer"]

    @property
    def timer_wakes(self) -> int:
        return self._quiet.timer_wakes

    # --- warm start ----------------------------------------------------------------------
    async def serve_snapshots(self, answer: Callable[[Frames], bytes | None]) -> None:
        """Answer peers' Snapshot calls on the sync port until cancelled (the server starts now,
        before this replica's own warm start: a peer starting beside it may ask it)."""
        if self._sock is None:
            raise RuntimeError("sync transport is not bound (or already closed)")
        self._server.answer = answer
        self._start_serving()
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            self._server.answer = None

    async def request_snapshot(
        self, peers: Iterable[Peer], request: bytes, accept: Callable[[Frames], bool], *, deadline: float
    ) -> bool:
        """Ask every peer at once, each again ``SNAPSHOT_RETRY`` after its answer (a peer starting
        too, or none), until ``accept`` takes a reply or ``deadline`` (loop clock) passes.
        ``accept`` sees the replies one at a time, as they come; a peer that hangs holds up only
        its own asking."""
        loop = asyncio.get_running_loop()
        replies: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def keep_asking(peer: Peer) -> None:
            while (left := deadline - loop.time()) > 0:
                replies.put_nowait(await self._ask(peer, request, left))
                await asyncio.sleep(max(0.0, min(SNAPSHOT_RETRY, deadline - loop.time())))

        asking = [loop.create_task(keep_asking(p), name=f"sync-snapshot-ask-{p.id}") for p in peers]
        try:
            while asking and (left := deadline - loop.time()) > 0:
                try:
                    reply = await asyncio.wait_for(replies.get(), left)
                except TimeoutError:
                    break
                if reply is not None and accept([reply]):
                    return True
            return False
        finally:
            for task in asking:
                task.cancel()
            await asyncio.gather(*asking, return_exceptions=True)

    async def _ask(self, peer: Peer, request: bytes, timeout: float) -> bytes | None:
        """One Snapshot call to ``peer`` on a connection of its own; None: no snapshot from it."""
        loop = asyncio.get_running_loop()
        authority = f"{peer.host}:{peer.port}".encode()
        authorization = self.secret.authorization if self.secret is not None else b""
        client: UnaryClient | None = None
        try:
            async with asyncio.timeout(timeout):
                _, client = await loop.create_connection(
                    partial(
                        UnaryClient,
                        SNAPSHOT_PATH,
                        authority,
                        max_response=SNAPSHOT_MAX_BYTES,
                        authorization=authorization,
                    ),
                    peer.host,
                    peer.port,
                )
                if not client.send(request):
                    return None
                return await client.response
        except (OSError, TimeoutError):
            return None
        finally:
            if client is not None:
                client.close()


def transport_for(
    kind: str,
    bind_host: str,
    port: int,
    *,
    hwm: int = DEFAULT_HWM,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    context: zmq.asyncio.Context | None = None,
    secret: PeerSecret | None = None,
) -> Transport:
    """The transport ``--peer-transport`` names: ``h2`` (this module) or ``zmq`` (``context``: a
    ZMQ context to share, ZMQ only).  ``secret``: what a peer's Publish call must present (h2; a
    ZMQ receiver dials its publishers, so no one can publish to it uninvited, but what its PUB
    sends can be read: docs/scale-out.md)."""
    if kind == "h2":
        return H2Transport(bind_host, port, hwm=hwm, max_message_bytes=max_message_bytes, secret=secret)
    if kind == "zmq":
        return ZmqTransport(bind_host, port, hwm=hwm, max_message_bytes=max_message_bytes, context=context)
    raise ValueError(f"unknown sync transport {kind!r}: expected h2 or zmq")
