"""A no-op ext_proc server speaking GIE's protocol: the floor of an ext_proc hop in Python.

    python -m bench.noop_extproc --upstreams 127.0.0.1:8001,127.0.0.1:8002 [--transport grpcio|h2]

No routing logic: the destination is the next upstream in round robin.  Two transports, both on
uvloop with the project's stubs and upb messages: ``grpcio`` (grpc.aio, what a Python ext_proc
server costs when written the obvious way) and ``h2`` (the EPP's own HTTP/2 + gRPC framing,
``epp.server.h2``, its default transport: the honest floor under the EPP, so that "EPP over
floor" is the cost of routing, not of the transport).  Per stream, as GIE does in FULL_DUPLEX_STREAMED
mode (overhead-baseline.md): request headers are held; body chunks are buffered until
end_of_stream, then the routing headers reply (destination header, Content-Length, envoy.lb
metadata) and the body as streamed mutations of <= 62,000 bytes; response headers get an empty
reply, response body chunks are echoed as streamed mutations, trailers get empty replies.  With
BUFFERED request bodies (Envoy's other mode) the headers are answered at once and the body reply
carries the routing mutation; STREAMED/BUFFERED response chunks get empty replies.  With
``--response-phases none`` and body modes in which Envoy honours ``mode_override`` (neither is
FULL_DUPLEX_STREAMED), the reply to the request headers asks Envoy to skip the response phases,
with the same override the EPP sends when no plugin reads the response: the fair floor under
deploy/envoy/lean.yaml.  Prints ``{"port": N}`` once serving.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf import struct_pb2

from epp._pb.envoy.config.core.v3 import base_pb2
from epp._pb.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as mode_pb
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

# Self-contained on purpose: the floor is the plain protobuf way of speaking the protocol, and
# must not inherit the EPP's own optimisations of its reply path.
FULL_DUPLEX = mode_pb.ProcessingMode.FULL_DUPLEX_STREAMED
BUFFERED = mode_pb.ProcessingMode.BUFFERED
BODY_CHUNK_LIMIT = 62000  # GIE's BodyByteLimit
EMPTY_REQUEST_HEADERS = pb.ProcessingResponse(request_headers=pb.HeadersResponse())
EMPTY_REQUEST_TRAILERS = pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
EMPTY_RESPONSE_TRAILERS = pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
EMPTY_RESPONSE_BODY = pb.ProcessingResponse(response_body=pb.BodyResponse())
_EMPTY_RESPONSE_HEADERS = pb.ProcessingResponse(response_headers=pb.HeadersResponse())
_SEND, _SKIP = mode_pb.ProcessingMode.SEND, mode_pb.ProcessingMode.SKIP


def skip_response(request_mode: int) -> mode_pb.ProcessingMode:
    """The override skipping response headers, body and trailers (deploy/envoy/lean.yaml lists it)."""
    return mode_pb.ProcessingMode(
        request_header_mode=_SEND,
        request_body_mode=request_mode,  # type: ignore[arg-type]
        request_trailer_mode=_SEND,
        response_header_mode=_SKIP,
        response_body_mode=mode_pb.ProcessingMode.NONE,
        response_trailer_mode=_SKIP,
    )


def destination_metadata(destination: str) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.fields["envoy.lb"].struct_value.fields["x-gateway-destination-endpoint"].string_value = destination
    return s


def streamed_body(body: bytes, *, request: bool, end_of_stream: bool) -> list[pb.ProcessingResponse]:
    """The body as streamed mutations of at most 62,000 bytes; only the last carries end_of_stream."""
    parts = [body[i : i + BODY_CHUNK_LIMIT] for i in range(0, len(body), BODY_CHUNK_LIMIT)] or [b""]
    out = []
    for i, chunk in enumerate(parts):
        eos = end_of_stream and i == len(parts) - 1
        br = pb.BodyResponse(
            response=pb.CommonResponse(
                body_mutation=pb.BodyMutation(
                    streamed_response=pb.StreamedBodyResponse(body=chunk, end_of_stream=eos)
                )
            )
        )
        out.append(
            pb.ProcessingResponse(request_body=br) if request else pb.ProcessingResponse(response_body=br)
        )
    return out


def _mutation(destination: str, length: int | None) -> pb.CommonResponse:
    sets = [
        base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key="x-gateway-destination-endpoint", raw_value=destination.encode())
        )
    ]
    if length is not None:
        sets.append(
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key="Content-Length", raw_value=str(length).encode())
            )
        )
    return pb.CommonResponse(clear_route_cache=True, header_mutation=pb.HeaderMutation(set_headers=sets))


class NoopSession:
    """One ext_proc session: each message answered at once (``handle``), the protocol and nothing else.

    Offers what the EPP's own transport drives (``epp.server.h2.drivers.ExtProcSessionLike``); the grpc.aio
    servicer below iterates the same object, so both floors send the same replies.
    """

    __slots__ = (
        "_body",
        "_next",
        "_request_mode",
        "_response_mode",
        "_skip",
        "finished",
        "route_pending",
        "writer",
    )

    def __init__(self, next_upstream: Callable[[], str], *, skip_response: bool = False) -> None:
        self._next = next_upstream
        self._skip = skip_response
        self._body: list[bytes] = []
        self._request_mode = self._response_mode = FULL_DUPLEX
        self.finished = False
        self.route_pending = False  # never: routing is a round robin, answered in ``handle``
        self.writer: Any = None  # the driver sets itself here; a no-op never ends a call unasked

    def handle(self, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        kind = msg.WhichOneof("request")
        if kind == "request_headers":
            if msg.HasField("protocol_config"):
                self._request_mode = msg.protocol_config.request_body_mode
                self._response_mode = msg.protocol_config.response_body_mode
            override = (
                skip_response(self._request_mode)
                if self._skip and FULL_DUPLEX not in (self._request_mode, self._response_mode)
                else None
            )
            if msg.request_headers.end_of_stream:
                dest = self._next()
                return [
                    pb.ProcessingResponse(
                        request_headers=pb.HeadersResponse(response=_mutation(dest, None)),
                        dynamic_metadata=destination_metadata(dest),
                        mode_override=override,
                    )
                ]
            if self._request_mode == BUFFERED:
                if override is None:
                    return [EMPTY_REQUEST_HEADERS]
                return [pb.ProcessingResponse(request_headers=pb.HeadersResponse(), mode_override=override)]
            return []
        if kind == "request_body":
            hb = msg.request_body
            self._body.append(hb.body)
            if not hb.end_of_stream:
                return []
            data = b"".join(self._body)
            self._body = []
            dest = self._next()
            if self._request_mode == FULL_DUPLEX:
                return [
                    pb.ProcessingResponse(
                        request_headers=pb.HeadersResponse(response=_mutation(dest, len(data))),
                        dynamic_metadata=destination_metadata(dest),
                    ),
                    *streamed_body(data, request=True, end_of_stream=True),
                ]
            return [
                pb.ProcessingResponse(
                    request_body=pb.BodyResponse(response=_mutation(dest, None)),
                    dynamic_metadata=destination_metadata(dest),
                )
            ]
        if kind == "request_trailers":
            return [EMPTY_REQUEST_TRAILERS]
        if kind == "response_headers":
            return [_EMPTY_RESPONSE_HEADERS]
        if kind == "response_body":
            rb = msg.response_body
            if self._response_mode == FULL_DUPLEX:
                return streamed_body(rb.body, request=False, end_of_stream=rb.end_of_stream)
            return [EMPTY_RESPONSE_BODY]
        if kind == "response_trailers":
            return [EMPTY_RESPONSE_TRAILERS]
        return []

    async def route(self) -> list[pb.ProcessingResponse]:  # pragma: no cover - route_pending is never set
        return []

    def take_eviction(self) -> list[pb.ProcessingResponse]:  # pragma: no cover - never evicts
        return []

    def close(self) -> None:
        pass


class NoopProcessor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """Round robin over fixed upstreams, the protocol and nothing else: a ``NoopSession`` per call.

    ``Process`` serves grpc.aio; ``open`` and ``wait_idle`` are what the EPP's own transport
    (``epp.server.h2.H2GrpcServer``) asks of a servicer.
    """

    # upb, the plain protobuf way: the floor must not inherit the EPP's own decoding (module docstring)
    decode = staticmethod(pb.ProcessingRequest.FromString)

    def __init__(self, upstreams: list[str], *, skip_response: bool = False) -> None:
        self._next = itertools.cycle(upstreams).__next__
        self._skip = skip_response

    def open(self) -> NoopSession:
        return NoopSession(self._next, skip_response=self._skip)

    async def wait_idle(self) -> None:
        return None

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: Any
    ) -> AsyncIterator[pb.ProcessingResponse]:
        session = self.open()
        async for msg in request_iterator:
            for reply in session.handle(msg):
                yield reply


async def serve(upstreams: list[str], transport: str, *, skip_response: bool = False) -> None:
    servicer = NoopProcessor(upstreams, skip_response=skip_response)
    if transport == "h2":
        # The EPP's own HTTP/2 + gRPC framing (its default transport), driving the same sessions.
        from epp.server.h2 import H2GrpcServer

        h2 = H2GrpcServer(servicer)
        port = await h2.start("127.0.0.1", 0, None)
        print(json.dumps({"port": port}), flush=True)
        await asyncio.Event().wait()  # serve until killed
        return
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 128 * 1024 * 1024),
            ("grpc.max_send_message_length", 128 * 1024 * 1024),
        ]
    )
    pb_grpc.add_ExternalProcessorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(json.dumps({"port": port}), flush=True)
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.noop_extproc", description=__doc__.splitlines()[0])
    ap.add_argument("--upstreams", required=True, help="comma-separated host:port list")
    ap.add_argument(
        "--transport",
        choices=("grpcio", "h2"),
        default="grpcio",
        help="grpcio: grpc.aio (gRPC core); h2: the EPP's own HTTP/2 framing (src/epp/server/h2)",
    )
    ap.add_argument(
        "--response-phases",
        choices=("all", "none"),
        default="all",
        help="none: ask Envoy to skip the response phases where it honours mode_override",
    )
    args = ap.parse_args(argv)
    upstreams = [u.strip() for u in args.upstreams.split(",") if u.strip()]
    skip = args.response_phases == "none"
    try:
        import uvloop

        uvloop.run(serve(upstreams, args.transport, skip_response=skip))
    except ImportError:  # pragma: no cover - uvloop is a project dependency
        asyncio.run(serve(upstreams, args.transport, skip_response=skip))
    return 0


if __name__ == "__main__":
    sys.exit(main())
