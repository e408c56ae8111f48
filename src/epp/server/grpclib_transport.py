"""The ext_proc service on grpclib (pure-Python HTTP/2 on asyncio) instead of grpc.aio.

grpc.aio runs gRPC core on its own threads and hands every message across to the event
loop; grpclib parses HTTP/2 with ``h2`` on the loop itself, which measured cheaper per
message here (docs/decisions.md).  The servicer is the same object either way: this module
only adapts a grpclib stream to ``ExtProcServicer.Process``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpclib.const
import grpclib.server
from grpc_health.v1 import health_pb2
from grpclib.encoding.base import CodecBase

from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.server import responses as r
from epp.server.extproc import SERVICE_NAME, ExtProcServicer
from epp.server.health import HealthServicer
from epp.server.tls import ssl_context
from epp.server.transport import Tls


class _Codec(CodecBase):
    """protobuf in; protobuf or hand-encoded bytes out (``responses.serialize``)."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        return r.serialize(message)

    def decode(self, data: bytes, message_type: Any) -> Any:
        return message_type.FromString(data)


async def _messages(stream: grpclib.server.Stream[Any, Any]) -> AsyncIterator[pb.ProcessingRequest]:
    while True:
        msg = await stream.recv_message()
        if msg is None:
            return
        yield msg


class ExtProcHandler:
    """grpclib servable for ``envoy.service.ext_proc.v3.ExternalProcessor/Process``."""

    def __init__(self, servicer: ExtProcServicer) -> None:
        self._servicer = servicer

    async def _process(self, stream: grpclib.server.Stream[Any, Any]) -> None:
        replies = self._servicer.Process(_messages(stream), None)
        async for reply in replies:
            await stream.send_message(reply)

    def __mapping__(self) -> Mapping[str, grpclib.const.Handler]:
        return {
            f"/{SERVICE_NAME}/Process": grpclib.const.Handler(
                self._process,
                grpclib.const.Cardinality.STREAM_STREAM,
                pb.ProcessingRequest,
                pb.ProcessingResponse,
            )
        }


class HealthHandler:
    """``grpc.health.v1.Health`` Check and List for ``--health-checking`` on the ext_proc port."""

    def __init__(self, health: HealthServicer) -> None:
        self._health = health

    async def _check(self, stream: grpclib.server.Stream[Any, Any]) -> None:
        req = await stream.recv_message()
        service = req.service if req is not None else ""
        await stream.send_message(health_pb2.HealthCheckResponse(status=self._health.status(service)))

    async def _list(self, stream: grpclib.server.Stream[Any, Any]) -> None:
        await stream.recv_message()
        await stream.send_message(await self._health.List(health_pb2.HealthListRequest(), None))

    def __mapping__(self) -> Mapping[str, grpclib.const.Handler]:
        unary = grpclib.const.Cardinality.UNARY_UNARY
        return {
            "/grpc.health.v1.Health/Check": grpclib.const.Handler(
                self._check, unary, health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse
            ),
            "/grpc.health.v1.Health/List": grpclib.const.Handler(
                self._list, unary, health_pb2.HealthListRequest, health_pb2.HealthListResponse
            ),
        }


class GrpclibServer:
    """Serves the handlers on ``host:port`` until ``stop``; ``port`` is the bound port."""

    def __init__(self, servicer: ExtProcServicer, health: HealthServicer | None = None) -> None:
        handlers: list[Any] = [ExtProcHandler(servicer)]
        if health is not None:
            handlers.append(HealthHandler(health))
        self._servicer = servicer
        self._server = grpclib.server.Server(handlers, codec=_Codec())
        self.port = 0

    async def start(self, host: str, port: int, tls: Tls | None) -> int:
        ctx = None if tls is None else await asyncio.to_thread(ssl_context, tls.cert_path)
        await self._server.start(host.strip("[]") or None, port, ssl=ctx, reuse_address=True)
        listener: Any = self._server._server
        sockets = listener.sockets if listener is not None else ()
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        return self.port

    async def stop(self, grace: float) -> None:
        """Stop accepting connections, wait (up to ``grace`` s) for in-flight streams, then close.

        grpclib's own ``close`` cancels running handlers at once, so the wait comes first.
        Certificate reload is not supported on this transport.
        """
        listener = self._server._server
        if listener is not None:
            listener.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._servicer.wait_idle(), grace)
        self._server.close()
        await self._server.wait_closed()
