"""The ExternalProcessor gRPC service: reads one stream's messages, dispatches by phase, replies."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import grpc
import structlog

from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from epp.director.director import Director
from epp.errors import EppError, Internal
from epp.server import responses as r
from epp.server.stream import Stream
from epp.tracing.otel import Tracing

log = structlog.get_logger(__name__)

SERVICE_NAME = "envoy.service.ext_proc.v3.ExternalProcessor"


class ExtProcServicer(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """One ``Process`` call per HTTP request, each a ``Session``."""

    def __init__(
        self, director: Director, *, max_body_bytes: int = 0, tracing: Tracing | None = None
    ) -> None:
        self._director = director
        self._max_body = max_body_bytes
        self._tracing = tracing
        self.active_streams = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no stream is in flight (used to drain on shutdown)."""
        await self._idle.wait()

    def open(self) -> Session:
        """A new ext_proc stream; the caller must ``close`` it exactly once, whatever happens."""
        self.active_streams += 1
        self._idle.clear()
        return Session(self, Stream(self._director, max_body_bytes=self._max_body, tracing=self._tracing))

    def _closed(self) -> None:
        self.active_streams -= 1
        if self.active_streams == 0:
            self._idle.set()

    async def Process(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[r.Reply]:
        """The gRPC method, for transports that drive a servicer by async iterators (grpc.aio)."""
        session = self.open()
        try:
            async for msg in request_iterator:
                out = session.handle(msg)
                if not isinstance(out, list):
                    out = await out
                for reply in out:
                    yield reply
                if session.finished:
                    return
        finally:
            session.close()


class Session:
    """One ``Process`` call, message by message.

    ``handle`` answers synchronously (a list of replies) in every phase that needs no I/O,
    and returns an awaitable only where the director may wait (routing a request body):
    a transport that can write from its read callback (``--ext-proc-transport=h2``) then
    answers response chunks without a task switch.  Request-phase errors become an
    ImmediateResponse (GIE's status and body) and set ``finished``: the call then ends OK.
    An unexpected exception is logged with its traceback and answered as a 500, so one bad
    request never takes the stream machinery down with it.
    """

    __slots__ = ("_servicer", "finished", "stream")

    def __init__(self, servicer: ExtProcServicer, stream: Stream) -> None:
        self._servicer: ExtProcServicer | None = servicer
        self.stream = stream
        self.finished = False

    def handle(self, msg: pb.ProcessingRequest) -> list[r.Reply] | Awaitable[list[r.Reply]]:
        stream = self.stream
        kind = msg.WhichOneof("request")
        try:
            if kind == "response_body":
                return stream.on_response_body(msg)
            if kind == "request_body":
                return self._guard(stream.on_request_body(msg), kind)
            if kind == "request_headers":
                return stream.on_request_headers(msg)
            if kind == "response_headers":
                return stream.on_response_headers(msg)
            if kind == "request_trailers":
                return self._guard(stream.on_request_trailers(), kind)
            if kind == "response_trailers":
                return stream.on_response_trailers()
        except Exception as e:
            return self._failed(e, kind)
        return []

    async def _guard(self, pending: Awaitable[list[r.Reply]], kind: str) -> list[r.Reply]:
        try:
            return await pending
        except Exception as e:
            return self._failed(e, kind)

    def _failed(self, e: Exception, kind: str | None) -> list[r.Reply]:
        stream = self.stream
        self.finished = True
        if isinstance(e, EppError):
            stream.error = e
            log.info("request_failed", code=e.code, error=e.msg, **_ids(stream))
            return [r.immediate_error(e)]
        err = Internal("internal error while processing the request")
        stream.error = err
        log.exception("request_crashed", phase=kind, error=repr(e), **_ids(stream))  # in an except
        return [r.immediate_error(err)]

    def close(self) -> None:
        """The call is over (ended, failed, cancelled or its connection lost): finish the request."""
        if self._servicer is None:
            return
        servicer, self._servicer = self._servicer, None
        try:
            self.stream.close()
        except Exception:
            log.exception("stream_close_failed", **_ids(self.stream))
        servicer._closed()


def _ids(stream: Stream) -> dict[str, str]:
    ctx = stream.ctx
    return {"request_id": ctx.request.request_id} if ctx is not None else {}


def add_to_server(servicer: ExtProcServicer, server: grpc.aio.Server) -> None:
    """Register ``Process`` with a serializer that passes hand-encoded replies through."""
    handler = grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {
            "Process": grpc.stream_stream_rpc_method_handler(
                servicer.Process,
                request_deserializer=pb.ProcessingRequest.FromString,
                response_serializer=r.serialize,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
