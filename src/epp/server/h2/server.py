"""ext_proc (and grpc.health.v1) served by the EPP's own HTTP/2 framing: the ``h2`` transport."""

from __future__ import annotations

import asyncio
import contextlib
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
from epp.server.tls import CertReloader, load_into, ssl_context

log = structlog.get_logger(__name__)


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

    def forget(self, conn: Connection) -> None:
        self.connections.discard(conn)
        if not self.connections and self._all_closed is not None and not self._all_closed.done():
            self._all_closed.set_result(None)

    def open_stream(self, conn: Connection, stream_id: int, headers: HeaderList, size: int) -> Call | None:
        """A client opened a stream: the gRPC call its headers route to, or None (refused)."""
        return open_call(conn, stream_id, headers, size, self.routes, self.limits, stopping=self.stopping)

    def _ext_proc_driver(self, call: Call) -> Driver:
        return SessionDriver(call, self._servicer.open(), responses.serialize)

    async def _check(self, call: Call, inbox: Inbox) -> None:
        req = await inbox.one()
        service = req.service if req is not None else ""
        resp = health_pb2.HealthCheckResponse(status=self._health.status(service))
        await call.send(resp.SerializeToString())

    async def _list(self, call: Call, inbox: Inbox) -> None:
        await inbox.one()
        resp = await self._health.List(health_pb2.HealthListRequest(), None)
        await call.send(resp.SerializeToString())

    async def start(self, host: str, port: int, tls: Any, *, reuse_port: bool = False) -> int:
        ctx = None
        if tls is not None:
            ctx = await asyncio.to_thread(ssl_context, tls.cert_path)
            if tls.reload and tls.cert_path:
                reloader = await asyncio.to_thread(CertReloader, tls.cert_path)
                self._reload = asyncio.create_task(_reload_certs(ctx, reloader))
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self),
            host.strip("[]") or None,
            port,
            ssl=ctx,
            reuse_address=True,
            reuse_port=reuse_port,
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, grace: float) -> None:
        """GOAWAY to every client, wait up to ``grace`` for in-flight calls, then close."""
        self.stopping = True
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
