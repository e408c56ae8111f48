"""A no-op ext_proc server speaking GIE's protocol: the floor of an ext_proc hop in Python.

    python -m bench.noop_extproc --upstreams 127.0.0.1:8001,127.0.0.1:8002 [--no-response-phases]

Same transport as the EPP (grpc.aio on uvloop, the project's stubs), no routing logic: the
destination is the next upstream in round robin.  Per stream, as GIE does in FULL_DUPLEX_STREAMED
mode (overhead-baseline.md): request headers are held; body chunks are buffered until
end_of_stream, then the routing headers reply (destination header, Content-Length, envoy.lb
metadata) and the body as streamed mutations of <= 62,000 bytes; response headers get an empty
reply, response body chunks are echoed as streamed mutations, trailers get empty replies.  With
BUFFERED request bodies (Envoy's other mode) the headers are answered at once and the body reply
carries the routing mutation; STREAMED/BUFFERED response chunks get empty replies.  Prints
``{"port": N}`` once serving.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
from collections.abc import AsyncIterator
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


class NoopProcessor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """Round robin over fixed upstreams, the protocol and nothing else."""

    def __init__(self, upstreams: list[str]) -> None:
        self._next = itertools.cycle(upstreams).__next__

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: Any
    ) -> AsyncIterator[pb.ProcessingResponse]:
        body: list[bytes] = []
        request_mode = response_mode = FULL_DUPLEX
        async for msg in request_iterator:
            kind = msg.WhichOneof("request")
            if kind == "request_headers":
                if msg.HasField("protocol_config"):
                    request_mode = msg.protocol_config.request_body_mode
                    response_mode = msg.protocol_config.response_body_mode
                if msg.request_headers.end_of_stream:
                    dest = self._next()
                    yield pb.ProcessingResponse(
                        request_headers=pb.HeadersResponse(response=_mutation(dest, None)),
                        dynamic_metadata=destination_metadata(dest),
                    )
                elif request_mode == BUFFERED:
                    yield EMPTY_REQUEST_HEADERS
            elif kind == "request_body":
                hb = msg.request_body
                body.append(hb.body)
                if not hb.end_of_stream:
                    continue
                data = b"".join(body)
                body = []
                dest = self._next()
                if request_mode == FULL_DUPLEX:
                    yield pb.ProcessingResponse(
                        request_headers=pb.HeadersResponse(response=_mutation(dest, len(data))),
                        dynamic_metadata=destination_metadata(dest),
                    )
                    for reply in streamed_body(data, request=True, end_of_stream=True):
                        yield reply
                else:
                    yield pb.ProcessingResponse(
                        request_body=pb.BodyResponse(response=_mutation(dest, None)),
                        dynamic_metadata=destination_metadata(dest),
                    )
            elif kind == "request_trailers":
                yield EMPTY_REQUEST_TRAILERS
            elif kind == "response_headers":
                yield _EMPTY_RESPONSE_HEADERS
            elif kind == "response_body":
                rb = msg.response_body
                if response_mode == FULL_DUPLEX:
                    for reply in streamed_body(rb.body, request=False, end_of_stream=rb.end_of_stream):
                        yield reply
                else:
                    yield EMPTY_RESPONSE_BODY
            elif kind == "response_trailers":
                yield EMPTY_RESPONSE_TRAILERS


async def serve(upstreams: list[str]) -> None:
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 128 * 1024 * 1024),
            ("grpc.max_send_message_length", 128 * 1024 * 1024),
        ]
    )
    pb_grpc.add_ExternalProcessorServicer_to_server(NoopProcessor(upstreams), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(json.dumps({"port": port}), flush=True)
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.noop_extproc", description=__doc__.splitlines()[0])
    ap.add_argument("--upstreams", required=True, help="comma-separated host:port list")
    args = ap.parse_args(argv)
    upstreams = [u.strip() for u in args.upstreams.split(",") if u.strip()]
    try:
        import uvloop

        uvloop.run(serve(upstreams))
    except ImportError:  # pragma: no cover - uvloop is a project dependency
        asyncio.run(serve(upstreams))
    return 0


if __name__ == "__main__":
    sys.exit(main())
