"""The gRPC server that carries ext_proc (own HTTP/2 framing, or grpc.aio) behind one interface."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

import grpc

from epp.server import extproc, health
from epp.server.tls import server_credentials

MAX_MESSAGE_BYTES = 128 * 1024 * 1024  # bodies arrive in ≤ 62 KB chunks; this only bounds a rogue peer


@dataclass(frozen=True, slots=True)
class Tls:
    """``--secure-serving``: certificates from ``cert_path`` (optionally reloaded) or self-signed."""

    cert_path: str
    reload: bool


class ExtProcServer(Protocol):
    async def start(self, host: str, port: int, tls: Tls | None) -> int:
        """Listen on ``host:port`` (``""``: all interfaces; port 0: ephemeral); return the bound port."""
        ...

    async def stop(self, grace: float) -> None:
        """Stop taking new streams, let in-flight ones finish for up to ``grace`` seconds, then close."""
        ...


class GrpcAioServer:
    """ext_proc on grpc.aio (gRPC core; the fallback transport, ``--ext-proc-transport=grpcio``)."""

    def __init__(
        self, servicer: extproc.ExtProcServicer, health_servicer: health.HealthServicer | None
    ) -> None:
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ]
        )
        extproc.add_to_server(servicer, self._server)
        if health_servicer is not None:
            health.add_to_server(health_servicer, self._server)

    async def start(self, host: str, port: int, tls: Tls | None) -> int:
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
    kind: str, servicer: extproc.ExtProcServicer, health_servicer: health.HealthServicer | None
) -> ExtProcServer:
    """``kind`` is ``--ext-proc-transport``: ``h2`` (the default) or ``grpcio``."""
    if kind == "h2":
        from epp.server.h2 import H2GrpcServer

        return H2GrpcServer(servicer, health_servicer)
    return GrpcAioServer(servicer, health_servicer)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
