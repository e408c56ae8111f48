"""The ExternalProcessor gRPC service: one ``ExtProcSession`` per call, and its grpc.aio method."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from epp.director.after_reply import AfterReply
from epp.director.director import Director
from epp.server import messages, responses
from epp.server.incoming import Incoming
from epp.server.session import ExtProcSession
from epp.tracing.otel import Tracing

SERVICE_NAME = "envoy.service.ext_proc.v3.ExternalProcessor"


class ExtProcServicer(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """One ``Process`` call per HTTP request, each an ``ExtProcSession``.

    ``decode`` is the request messages' deserializer for every transport (what the sessions read).
    """

    decode = staticmethod(messages.decode)

    def __init__(
        self, director: Director, *, max_body_bytes: int = 0, tracing: Tracing | None = None
    ) -> None:
        self._director = director
        self._max_body = max_body_bytes
        self._tracing = tracing
        self.active_sessions = 0
        self.opened = 0  # sessions ever opened: shutdown waits until new ones stop arriving
        # Set when the last session closes, made only while someone waits for that (the drain):
        # clearing and setting an Event for every request cost two Python calls (~1.4k instructions).
        self._idle: asyncio.Event | None = None

    @property
    def after_reply(self) -> AfterReply:
        """The director's queue of work that may run after a reply is written (the h2 edge runs it)."""
        return self._director.after_reply

    async def wait_idle(self) -> None:
        """Return once no session is in flight (used to drain on shutdown)."""
        if self.active_sessions:
            if self._idle is None:
                self._idle = asyncio.Event()
            await self._idle.wait()

    def open(self) -> ExtProcSession:
        """A new ext_proc session; the caller must ``close`` it, whatever happens."""
        self.active_sessions += 1
        self.opened += 1
        return ExtProcSession(self._director, self._max_body, self._tracing, self._closed)

    def _closed(self) -> None:
        self.active_sessions -= 1
        if not self.active_sessions and self._idle is not None:
            self._idle.set()  # wakes the drain's waiters
            self._idle = None

    async def Process(
        self,
        request_iterator: AsyncIterator[Incoming],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[responses.Reply]:
        """The gRPC method, for transports that drive a servicer by async iterators (grpc.aio)."""
        session = self.open()
        try:
            async for msg in request_iterator:
                out = session.handle(msg)
                if session.route_pending:
                    out = await session.route()
                for reply in out:
                    yield reply
                if session.finished:
                    return
        finally:
            session.close()


def add_to_server(servicer: ExtProcServicer, server: grpc.aio.Server) -> None:
    """Register ``Process`` with a serializer that passes hand-encoded replies through."""
    handler = grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {
            "Process": grpc.stream_stream_rpc_method_handler(
                servicer.Process,
                request_deserializer=servicer.decode,
                response_serializer=responses.serialize,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
