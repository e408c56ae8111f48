"""The ExternalProcessor gRPC service: reads one stream's messages, dispatches by phase, replies."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
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
    """One ``Process`` call per HTTP request.

    Request-phase errors become an ImmediateResponse (GIE's status and body) after which the
    call returns OK; an unexpected exception is logged with its traceback and answered as a
    500, so one bad request never takes the stream machinery down with it.
    """

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

    async def Process(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[r.Reply]:
        stream = Stream(self._director, max_body_bytes=self._max_body, tracing=self._tracing)
        self.active_streams += 1
        self._idle.clear()
        try:
            async for msg in request_iterator:
                kind = msg.WhichOneof("request")
                try:
                    if kind == "request_body":
                        out = await stream.on_request_body(msg)
                    elif kind == "response_body":
                        out = stream.on_response_body(msg)
                    elif kind == "request_headers":
                        out = stream.on_request_headers(msg)
                    elif kind == "response_headers":
                        out = stream.on_response_headers(msg)
                    elif kind == "request_trailers":
                        out = await stream.on_request_trailers()
                    elif kind == "response_trailers":
                        out = stream.on_response_trailers()
                    else:
                        continue
                except EppError as e:
                    stream.error = e
                    log.info("request_failed", code=e.code, error=e.msg, **_ids(stream))
                    yield r.immediate_error(e)
                    return
                except Exception as e:
                    err = Internal("internal error while processing the request")
                    stream.error = err
                    log.exception("request_crashed", phase=kind, error=repr(e), **_ids(stream))
                    yield r.immediate_error(err)
                    return
                for reply in out:
                    yield reply
        finally:
            try:
                stream.close()
            except Exception:
                log.exception("stream_close_failed", **_ids(stream))
            self.active_streams -= 1
            if self.active_streams == 0:
                self._idle.set()


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
