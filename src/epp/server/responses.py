"""Builders of ext_proc ProcessingResponse messages; the only place an EppError becomes HTTP."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any, Final

from google.protobuf import struct_pb2

from epp._pb.envoy.config.core.v3 import base_pb2
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp._pb.envoy.type.v3 import http_status_pb2
from epp.errors import EppError

DESTINATION_HEADER: Final = "x-gateway-destination-endpoint"
DESTINATION_NAMESPACE: Final = "envoy.lb"
BODY_CHUNK_LIMIT: Final = 62000  # GIE's BodyByteLimit: max bytes per streamed body mutation
RESP_HEADERS_MARKER: Final = ("x-went-into-resp-headers", "true")

ProcessingRequest = pb.ProcessingRequest
ProcessingResponse = pb.ProcessingResponse
Reply = pb.ProcessingResponse | bytes  # bytes: a reply already serialised (see _body_msg)

# Messages that never change; grpc serialises a message when it is written, so sharing is safe.
EMPTY_REQUEST_HEADERS: Final = pb.ProcessingResponse(request_headers=pb.HeadersResponse())
EMPTY_REQUEST_TRAILERS: Final = pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
EMPTY_RESPONSE_TRAILERS: Final = pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
EMPTY_REQUEST_BODY: Final = pb.ProcessingResponse(request_body=pb.BodyResponse())
EMPTY_RESPONSE_BODY: Final = pb.ProcessingResponse(response_body=pb.BodyResponse())


def header_option(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=key, raw_value=value.encode()))


def to_struct(data: Mapping[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(data)
    return s


def routing_mutation(
    destination: str, content_length: int | None, extra: Iterable[tuple[str, str]]
) -> pb.CommonResponse:
    """The routing decision as a CommonResponse: destination header, Content-Length, extras."""
    sets = [header_option(DESTINATION_HEADER, destination)]
    if content_length is not None:
        sets.append(header_option("Content-Length", str(content_length)))
    sets.extend(header_option(k, v) for k, v in extra)
    return pb.CommonResponse(clear_route_cache=True, header_mutation=pb.HeaderMutation(set_headers=sets))


def destination_metadata(destination: str) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.fields[DESTINATION_NAMESPACE].struct_value.fields[DESTINATION_HEADER].string_value = destination
    return s


def routing_headers_response(
    destination: str, content_length: int | None, extra: Iterable[tuple[str, str]]
) -> pb.ProcessingResponse:
    """The RequestHeaders reply that routes the request (FULL_DUPLEX_STREAMED and header-only)."""
    return pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=routing_mutation(destination, content_length, extra)),
        dynamic_metadata=destination_metadata(destination),
    )


def routing_body_response(
    destination: str, body: bytes | None, content_length: int | None, extra: Iterable[tuple[str, str]]
) -> pb.ProcessingResponse:
    """The RequestBody reply that routes a BUFFERED request (headers were already answered)."""
    common = routing_mutation(destination, content_length, extra)
    if body is not None:
        common.body_mutation.body = body
    return pb.ProcessingResponse(
        request_body=pb.BodyResponse(response=common), dynamic_metadata=destination_metadata(destination)
    )


def streamed_response_body(
    body: bytes, end_of_stream: bool, metadata: Mapping[str, Any] | None = None
) -> list[Reply]:
    """Response body as streamed mutations; ``metadata`` rides on the last message."""
    out = streamed_body(body, request=False, end_of_stream=end_of_stream)
    if metadata:  # protobuf fields concatenate: append ProcessingResponse.dynamic_metadata
        md = to_struct(metadata).SerializeToString()
        out[-1] = out[-1] + _DYNAMIC_METADATA_TAG + _varint(len(md)) + md
    return list(out)


def streamed_body(body: bytes, *, request: bool, end_of_stream: bool) -> list[bytes]:
    """The body as streamed mutations of at most 62,000 bytes; only the last may carry end_of_stream."""
    n = len(body)
    if n <= BODY_CHUNK_LIMIT:
        return [_body_msg(body, end_of_stream, request)]
    view = memoryview(body)
    last = (n - 1) // BODY_CHUNK_LIMIT
    return [
        _body_msg(
            bytes(view[i * BODY_CHUNK_LIMIT : (i + 1) * BODY_CHUNK_LIMIT]),
            end_of_stream and i == last,
            request,
        )
        for i in range(last + 1)
    ]


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL_VARINTS[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL_VARINTS: Final = tuple(bytes((i,)) for i in range(0x80))
_REQUEST_BODY_TAG: Final = b"\x1a"  # ProcessingResponse.request_body = 3, length-delimited
_RESPONSE_BODY_TAG: Final = b"\x22"  # ProcessingResponse.response_body = 4
_DYNAMIC_METADATA_TAG: Final = b"\x42"  # ProcessingResponse.dynamic_metadata = 8
_EOS: Final = b"\x10\x01"  # StreamedBodyResponse.end_of_stream = 2, true


def _body_msg(chunk: bytes, eos: bool, request: bool) -> bytes:
    """ProcessingResponse{request_body|response_body: BodyResponse{response: CommonResponse{
    body_mutation: BodyMutation{streamed_response: {body, end_of_stream}}}}}, serialised by hand.

    The per-chunk reply is the hottest message of a streamed response: building four nested
    upb messages costs ~9 µs; here the wrapper bytes depend only on (length, eos, direction)
    and are cached, so a reply is one dict lookup and a concatenation.  The servicer's
    serializer passes bytes through (``serialize``); tests pin the bytes to upb's encoding.
    """
    prefix = _body_prefix(len(chunk), eos, request)
    return prefix + chunk + _EOS if eos else prefix + chunk


@functools.lru_cache(maxsize=4096)  # pure: the wrapper bytes of a (length, eos, direction)
def _body_prefix(n: int, eos: bool, request: bool) -> bytes:
    sbr_len = (1 + len(_varint(n)) + n if n else 0) + (len(_EOS) if eos else 0)
    bm_len = 1 + len(_varint(sbr_len)) + sbr_len  # BodyMutation.streamed_response = 3
    cr_len = 1 + len(_varint(bm_len)) + bm_len  # CommonResponse.body_mutation = 3
    br_len = 1 + len(_varint(cr_len)) + cr_len  # BodyResponse.response = 1
    return b"".join(
        (
            _REQUEST_BODY_TAG if request else _RESPONSE_BODY_TAG,
            _varint(br_len),
            b"\x0a" + _varint(cr_len),
            b"\x1a" + _varint(bm_len),
            b"\x1a" + _varint(sbr_len),
            b"\x0a" + _varint(n) if n else b"",  # StreamedBodyResponse.body = 1 (omitted when empty)
        )
    )


def serialize(msg: Reply) -> bytes:
    """The gRPC response serializer: hand-encoded replies are already bytes."""
    return msg if isinstance(msg, bytes) else msg.SerializeToString()


def replaced_response_body(body: bytes | None, metadata: Mapping[str, Any] | None) -> pb.ProcessingResponse:
    """A BUFFERED/STREAMED response-body reply: replace the chunk only if it changed."""
    br = pb.BodyResponse()
    if body is not None:
        br.response.body_mutation.body = body
    msg = pb.ProcessingResponse(response_body=br)
    if metadata:
        msg.dynamic_metadata.CopyFrom(to_struct(metadata))
    return msg


def response_headers_reply(extra: Iterable[tuple[str, str]]) -> pb.ProcessingResponse:
    """The ResponseHeaders reply: GIE's marker header plus whatever hooks added."""
    sets = [header_option(*RESP_HEADERS_MARKER)]
    sets.extend(header_option(k, v) for k, v in extra)
    return pb.ProcessingResponse(
        response_headers=pb.HeadersResponse(
            response=pb.CommonResponse(header_mutation=pb.HeaderMutation(set_headers=sets))
        )
    )


def immediate_error(err: EppError) -> pb.ProcessingResponse:
    """GIE's error reply: the HTTP status of the error class and ``inference error: <Code> - <msg>``."""
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=err.http_status),  # type: ignore[arg-type]
            body=str(err).encode(),
        )
    )


def struct_to_python(s: struct_pb2.Struct) -> dict[str, Any]:
    """Struct → plain dict/list/str/float/bool/None (only for the rare metadata-carrying message)."""
    return {k: _value(v) for k, v in s.fields.items()}


def _value(v: struct_pb2.Value) -> Any:
    kind = v.WhichOneof("kind")
    if kind == "struct_value":
        return struct_to_python(v.struct_value)
    if kind == "list_value":
        return [_value(x) for x in v.list_value.values]
    if kind == "string_value":
        return v.string_value
    if kind == "number_value":
        return v.number_value
    if kind == "bool_value":
        return v.bool_value
    return None
