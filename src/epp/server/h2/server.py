"""ext_proc (and grpc.health.v1) served by the EPP's own HTTP/2 framing: the ``h2`` transport."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import structlog
from grpc_health.v1 import health_pb2

from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.errors import ConfigError
from epp.server import responses as r
from epp.server.extproc import SERVICE_NAME, ExtProcServicer
from epp.server.h2.calls import Call, Driver, GrpcError, Inbox, SessionDriver, TaskDriver
from epp.server.h2.connection import Connection
from epp.server.h2.frames import UNIMPLEMENTED
from epp.server.health import HealthServicer
from epp.server.tls import RELOAD_DEBOUNCE, load_into, load_key_pair, signature, ssl_context

log = structlog.get_logger(__name__)


class H2GrpcServer:
    """Serves ext_proc (and optionally grpc.health.v1) until ``stop``."""

    def __init__(self, servicer: ExtProcServicer, health: HealthServicer | None = None) -> None:
        self._servicer = servicer
        self.routes: dict[bytes, tuple[Callable[[bytes], Any], Callable[[Call], Driver]]] = {
            f"/{SERVICE_NAME}/Process".encode(): (pb.ProcessingRequest.FromString, self._session),
        }
        if health is not None:
            self._health = health
            check, listing = health_pb2.HealthCheckRequest.FromString, health_pb2.HealthListRequest.FromString
            self.routes[b"/grpc.health.v1.Health/Check"] = (check, partial(TaskDriver, handler=self._check))
            self.routes[b"/grpc.health.v1.Health/List"] = (listing, partial(TaskDriver, handler=self._list))
            self.routes[b"/grpc.health.v1.Health/Watch"] = (check, partial(TaskDriver, handler=_watch))
        self.connections: set[Connection] = set()
        self.active = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.stopping = False
        self._server: asyncio.Server | None = None
        self._all_closed: asyncio.Future[None] | None = None
        self._reload: asyncio.Task[None] | None = None

    def enter(self) -> None:
        self.active += 1
        self.idle.clear()

    def leave(self) -> None:
        self.active -= 1
        if self.active == 0:
            self.idle.set()

    def forget(self, conn: Connection) -> None:
        self.connections.discard(conn)
        if not self.connections and self._all_closed is not None and not self._all_closed.done():
            self._all_closed.set_result(None)

    def _session(self, call: Call) -> Driver:
        return SessionDriver(call, self._servicer.open(), r.serialize)

    async def _check(self, call: Call, inbox: Inbox) -> None:
        req = await inbox.one()
        service = req.service if req is not None else ""
        resp = health_pb2.HealthCheckResponse(status=self._health.status(service))
        await call.send(resp.SerializeToString())

    async def _list(self, call: Call, inbox: Inbox) -> None:
        await inbox.one()
        resp = await self._health.List(health_pb2.HealthListRequest(), None)
        await call.send(resp.SerializeToString())

    async def start(self, host: str, port: int, tls: Any) -> int:
        ctx = None
        if tls is not None:
            ctx = await asyncio.to_thread(ssl_context, tls.cert_path)
            if tls.reload and tls.cert_path:
                self._reload = asyncio.create_task(_reload_certs(ctx, tls.cert_path))
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self), host.strip("[]") or None, port, ssl=ctx, reuse_address=True
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
            await asyncio.wait_for(self.idle.wait(), grace)
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


async def _reload_certs(ctx: ssl.SSLContext, cert_path: str, interval: float = 1.0) -> None:
    """``--enable-cert-reload``: once tls.crt/tls.key changed and sat still for the debounce, new
    handshakes get the new pair; an invalid pair is logged and the current one kept."""
    seen = signature(cert_path)
    while True:
        await asyncio.sleep(interval)
        sig = signature(cert_path)
        if sig is None or sig == seen or time.time() - max(sig[0][0], sig[1][0]) / 1e9 < RELOAD_DEBOUNCE:
            continue
        seen = sig
        failure = ""
        try:
            cert_pem, key_pem = await asyncio.to_thread(load_key_pair, cert_path)
            await asyncio.to_thread(load_into, ctx, cert_pem, key_pem)
        except (ConfigError, OSError, ssl.SSLError) as e:
            failure = str(e)
        if failure:
            log.error("tls_certificate_reload_failed", path=cert_path, error=failure)
        else:
            log.info("tls_certificate_reloaded", path=cert_path)
