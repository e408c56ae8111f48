"""The gRPC server that carries ext_proc (own HTTP/2 framing, or grpc.aio) behind one interface."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import grpc
import structlog

from epp.server import extproc, health, incoming
from epp.server.h2.limits import DEFAULT_LIMITS, H2Limits
from epp.server.placement import Placement
from epp.server.tls import server_credentials

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Tls:
    """``--secure-serving``: certificates from ``cert_path`` (optionally reloaded) or self-signed."""

    cert_path: str
    reload: bool


class ExtProcServer(Protocol):
    async def start(
        self,
        host: str,
        port: int,
        tls: Tls | None,
        *,
        reuse_port: bool = False,
        placement: Placement | None = None,
    ) -> int:
        """Listen on ``host:port`` (``""``: all interfaces; port 0: ephemeral); return the bound port.

        ``reuse_port``: SO_REUSEPORT, so the workers of ``--workers N`` share the port and the
        kernel spreads new connections over them; ``placement`` then moves each to the worker
        holding the fewest (``epp.workers.balance``; the ``h2`` transport only)."""
        ...

    async def stop(self, grace: float) -> None:
        """Stop taking new streams, let in-flight ones finish for up to ``grace`` seconds, then close."""
        ...


class GrpcAioServer:
    """ext_proc on grpc.aio (gRPC core; the fallback transport, ``--ext-proc-transport=grpcio``)."""

    def __init__(
        self,
        servicer: extproc.ExtProcServicer,
        health_servicer: health.HealthServicer | None,
        limits: H2Limits = DEFAULT_LIMITS,
    ) -> None:
        options: list[tuple[str, int]] = [
            ("grpc.max_receive_message_length", limits.max_message_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.max_concurrent_streams", limits.max_concurrent_streams),
            ("grpc.max_metadata_size", limits.max_header_list_bytes),
        ]
        if limits.keepalive_time:
            options.append(("grpc.keepalive_time_ms", int(limits.keepalive_time * 1000)))
            options.append(("grpc.keepalive_timeout_ms", int(limits.keepalive_timeout * 1000)))
        if limits.idle_timeout:
            options.append(("grpc.max_connection_idle_ms", int(limits.idle_timeout * 1000)))
        self._server = grpc.aio.server(options=options)
        extproc.add_to_server(servicer, self._server)
        if health_servicer is not None:
            health.add_to_server(health_servicer, self._server)

    async def start(
        self,
        host: str,
        port: int,
        tls: Tls | None,
        *,
        reuse_port: bool = False,
        placement: Placement | None = None,
    ) -> int:
        # gRPC core sets SO_REUSEPORT on every listener already (``grpc.so_reuseport`` defaults to 1).
        # It accepts in its own threads, so connections stay where the kernel's hash put them:
        # ``placement`` is not used (docs/workers.md, "Spreading the load").
        address = f"{_bracket(host or '[::]')}:{port}"
        if tls is None:
            bound = self._server.add_insecure_port(address)
        else:
            creds = await asyncio.to_thread(server_credentials, tls.cert_path, tls.reload)
            bound = self._server.add_secure_port(address, creds)
        await self._server.start()
        return int(bound)

    async def stop(self, grace: float) -> None:
        await self._server.stop(grace)  # GOAWAY, wait up to grace, then cancel what is left


def make_server(
    kind: str,
    servicer: extproc.ExtProcServicer,
    health_servicer: health.HealthServicer | None,
    limits: H2Limits = DEFAULT_LIMITS,
    awake: Callable[[], None] | None = None,
) -> ExtProcServer:
    """``kind`` is ``--ext-proc-transport``: ``h2`` (the default) or ``grpcio``; ``limits`` bound what
    one client may cost (both transports take what grpc core has of them); ``awake`` is called
    after every read of an h2 connection (the sync hub's ``ride``; grpcio's reads are its own)."""
    if incoming.NATIVE is None:  # not built: worth a warning (EPP_PURE_PYTHON is a choice)
        log.warning("ext_proc_decoding", implementation=incoming.IMPLEMENTATION, reason=incoming.REASON)
    else:
        log.info("ext_proc_decoding", implementation=incoming.IMPLEMENTATION, reason=incoming.REASON or None)
    if kind == "h2":
        from epp.server.h2 import H2GrpcServer

        return H2GrpcServer(servicer, health_servicer, limits, awake)
    return GrpcAioServer(servicer, health_servicer, limits)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
