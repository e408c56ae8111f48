"""ext_proc (and grpc.health.v1) served by the EPP's own HTTP/2 framing: the ``h2`` transport."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable
from functools import partial
from typing import Any

import structlog
from grpc_health.v1 import health_pb2

from epp.director.after_reply import AfterReply
from epp.server import responses
from epp.server.extproc import SERVICE_NAME, ExtProcServicer
from epp.server.h2.calls import Call, Driver, Route, open_call
from epp.server.h2.connection import Connection
from epp.server.h2.drivers import GrpcError, Inbox, SessionDriver, TaskDriver
from epp.server.h2.frames import UNIMPLEMENTED
from epp.server.h2.headers import HeaderList
from epp.server.h2.limits import DEFAULT_LIMITS, H2Limits
from epp.server.health import HealthServicer
from epp.server.placement import Placement
from epp.server.tls import CertReloader, load_into, ssl_context

log = structlog.get_logger(__name__)

BACKLOG = 1024
ACCEPTS_PER_WAKE = 64  # a connect flood still leaves the loop to the streams between its wakes
ACCEPT_PAUSE = 1.0  # out of descriptors (EMFILE): accept again after this, as asyncio's server does


class H2GrpcServer:
    """Serves ext_proc (and optionally grpc.health.v1) until ``stop``."""

    def __init__(
        self,
        servicer: ExtProcServicer,
        health: HealthServicer | None = None,
        limits: H2Limits = DEFAULT_LIMITS,
        awake: Callable[[], None] | None = None,
    ) -> None:
        """``awake``: called after every read of a connection (the sync hub's piggyback read)."""
        self._servicer = servicer
        self.limits = limits
        self.awake = awake
        # The director's queue of work that may follow a reply: this transport runs it after
        # each read's replies are written, so it turns it on (a no-op servicer has none).
        self.after_reply: AfterReply | None = getattr(servicer, "after_reply", None)
        if self.after_reply is not None:
            self.after_reply.enabled = True
        self.routes: dict[bytes, Route] = {  # by :path
            f"/{SERVICE_NAME}/Process".encode(): (servicer.decode, self._ext_proc_driver),
        }
        if health is not None:
            self._health = health
            check, listing = health_pb2.HealthCheckRequest.FromString, health_pb2.HealthListRequest.FromString
            self.routes[b"/grpc.health.v1.Health/Check"] = (check, partial(TaskDriver, handler=self._check))
            self.routes[b"/grpc.health.v1.Health/List"] = (listing, partial(TaskDriver, handler=self._list))
            self.routes[b"/grpc.health.v1.Health/Watch"] = (check, partial(TaskDriver, handler=_watch))
        self.connections: set[Connection] = set()
        self.stopping = False
        self._server: asyncio.Server | None = None
        self._all_closed: asyncio.Future[None] | None = None
        self._reload: asyncio.Task[None] | None = None
        # With a placement (``--workers N``) the server accepts itself and may hand connections on
        self._placement: Placement | None = None
        self._listeners: list[socket.socket] = []
        self._ssl: ssl.SSLContext | None = None
        self._adopting = 0  # accepted, not yet connected (a TLS handshake in progress)
        self._adoptions: set[asyncio.Task[None]] = set()

    def forget(self, conn: Connection) -> None:
        self.connections.discard(conn)
        if self._placement is not None:
            self._publish()
        if not self.connections and self._all_closed is not None and not self._all_closed.done():
            self._all_closed.set_result(None)

    def open_stream(self, conn: Connection, stream_id: int, headers: HeaderList, size: int) -> Call | None:
        """A client opened a stream: the gRPC call its headers route to, or None (refused)."""
        return open_call(conn, stream_id, headers, size, self.routes, self.limits, stopping=self.stopping)

    def _ext_proc_driver(self, call: Call) -> Driver:
        return SessionDriver(call, self._servicer.open(), responses.serialize)

    def _probed(self, call: Call) -> None:
        """A health call opened the connection: a prober's (Envoy's health checker has its own
        connection), which carries no routing and does not count toward the worker's share."""
        conn = call.conn
        if call.id == 1 and not conn.health_only:
            conn.health_only = True
            if self._placement is not None:
                self._publish()

    async def _check(self, call: Call, inbox: Inbox) -> None:
        self._probed(call)
        req = await inbox.one()
        service = req.service if req is not None else ""
        resp = health_pb2.HealthCheckResponse(status=self._health.status(service))
        await call.send(resp.SerializeToString())

    async def _list(self, call: Call, inbox: Inbox) -> None:
        self._probed(call)
        await inbox.one()
        resp = await self._health.List(health_pb2.HealthListRequest(), None)
        await call.send(resp.SerializeToString())

    async def start(
        self, host: str, port: int, tls: Any, *, reuse_port: bool = False, placement: Placement | None = None
    ) -> int:
        """Listen; with ``placement`` (``--workers N``), accept here and let it place each connection."""
        ctx = None
        if tls is not None:
            ctx = await asyncio.to_thread(ssl_context, tls.cert_path)
            if tls.reload and tls.cert_path:
                reloader = await asyncio.to_thread(CertReloader, tls.cert_path)
                self._reload = asyncio.create_task(_reload_certs(ctx, reloader))
        loop = asyncio.get_running_loop()
        if placement is not None:
            return self._listen(loop, host, port, ctx, placement)
        self._server = await loop.create_server(
            lambda: Connection(self),
            host.strip("[]") or None,
            port,
            ssl=ctx,
            reuse_address=True,
            reuse_port=reuse_port,
        )
        return int(self._server.sockets[0].getsockname()[1])

    def _listen(
        self,
        loop: asyncio.AbstractEventLoop,
        host: str,
        port: int,
        ctx: ssl.SSLContext | None,
        placement: Placement,
    ) -> int:
        """The listening sockets the event loop's server would open (one per address of ``host``,
        SO_REUSEPORT), read by ``_accept``: the placement must see a connection before TLS or
        HTTP/2 does, so that the process it hands it to can start both afresh."""
        self._ssl, self._placement = ctx, placement
        infos = socket.getaddrinfo(
            host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
                sock.listen(BACKLOG)
                sock.setblocking(False)
            except OSError:
                sock.close()
                self._close_listeners(loop)
                raise
            self._listeners.append(sock)
            loop.add_reader(sock.fileno(), self._accept, sock)
        placement.start(self)
        self._publish()
        return int(self._listeners[0].getsockname()[1])

    def _accept(self, listener: socket.socket) -> None:
        placement = self._placement
        assert placement is not None
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of descriptors or buffers: pause rather than spin on the reader
                log.warning("ext_proc_accept_failed", error=str(e), retry_in_seconds=ACCEPT_PAUSE)
                loop = asyncio.get_running_loop()
                loop.remove_reader(listener.fileno())
                loop.call_later(ACCEPT_PAUSE, self._resume_accept, listener)
                return
            if not self.stopping and placement.place(sock):
                sock.close()  # the sibling holds its own descriptor of the connection
            else:
                self.adopt(sock)

    def _resume_accept(self, listener: socket.socket) -> None:
        if not self.stopping and listener.fileno() >= 0:
            asyncio.get_running_loop().add_reader(listener.fileno(), self._accept, listener)

    def adopt(self, sock: socket.socket) -> None:
        """Serve ``sock``: accepted here, or handed over by a sibling (``placement.Holder``)."""
        if self.stopping:
            sock.close()  # the proxy connects again, to a worker that is not draining
            return
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as the loop's own server does
        self._adopting += 1
        self._publish()
        task = asyncio.get_running_loop().create_task(self._connect(sock))
        self._adoptions.add(task)
        task.add_done_callback(self._adoptions.discard)

    async def _connect(self, sock: socket.socket) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: Connection(self), sock, ssl=self._ssl
            )
        except (OSError, ssl.SSLError, EOFError) as e:  # a failed handshake, a peer gone already
            log.debug("ext_proc_connection_failed", error=str(e))
            with contextlib.suppress(OSError):
                sock.close()
        finally:
            self._adopting -= 1
            self._publish()

    def retire_one(self) -> bool:
        """Move the proxy's least busy connection elsewhere (``Connection.retire``): the placement's
        rebalancing, when this process holds more connections than a sibling can take."""
        live = [c for c in self.connections if c.proxied]
        for conn in sorted(live, key=lambda c: c.streams_open):
            if conn.retire():
                self._publish()
                return True
        return False

    @property
    def held(self) -> int:
        """The proxy's connections this process serves (probers' and retiring ones not counted)."""
        return self._adopting + sum(1 for c in self.connections if c.proxied)

    def _publish(self) -> None:
        if self._placement is not None:
            self._placement.held(self.held)

    def _close_listeners(self, loop: asyncio.AbstractEventLoop) -> None:
        for sock in self._listeners:
            if sock.fileno() >= 0:
                loop.remove_reader(sock.fileno())
                sock.close()
        self._listeners.clear()

    async def stop(self, grace: float) -> None:
        """GOAWAY to every client, wait up to ``grace`` for in-flight calls, then close."""
        self.stopping = True
        if self._placement is not None:
            self._placement.stop()  # siblings hand this worker nothing more
            self._close_listeners(asyncio.get_running_loop())
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.goaway()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._servicer.wait_idle(), grace)  # ext_proc calls; probes need no drain
        if self.connections:  # peers close after reading their last replies; give them a moment
            self._all_closed = loop.create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_closed, max(0.0, min(1.0, deadline - loop.time())))
        for conn in list(self.connections):
            conn.abort()
        if self._reload is not None:
            self._reload.cancel()
        if self._server is not None:
            await self._server.wait_closed()


async def _watch(call: Call, inbox: Inbox) -> None:
    raise GrpcError(UNIMPLEMENTED, "Watch is not implemented")


async def _reload_certs(ctx: ssl.SSLContext, reloader: CertReloader, interval: float = 1.0) -> None:
    """``--enable-cert-reload``: new handshakes get the new pair once ``reloader`` accepts it (changed,
    settled for the debounce, valid); until then, and after an invalid pair, the current one serves.

    ``ssl`` has no per-handshake hook like grpc's certificate fetcher, so the files are polled.
    """
    while True:
        await asyncio.sleep(interval)
        pair = await asyncio.to_thread(reloader.changed_pair)
        if pair is None:
            continue
        try:
            await asyncio.to_thread(load_into, ctx, *pair)
        except (OSError, ssl.SSLError) as e:  # the pair was valid; installing it was not
            log.exception("tls_certificate_reload_failed", path=reloader.path, error=str(e))
